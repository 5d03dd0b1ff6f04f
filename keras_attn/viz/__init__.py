"""Plots of what attention models compute. matplotlib is imported on first use
with the non-interactive Agg backend, so these work on servers without a display."""

from keras_attn.viz.attention import plot_attention_heads
from keras_attn.viz.positional import plot_positional_encoding

__all__ = ["plot_attention_heads", "plot_positional_encoding"]
