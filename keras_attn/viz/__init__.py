"""Plots of what attention models compute. matplotlib is imported on first use
with the non-interactive Agg backend, so these work on servers without a display."""

from keras_attn.viz.attention import plot_attention_heads
from keras_attn.viz.curves import plot_learning_curves
from keras_attn.viz.positional import plot_positional_encoding
from keras_attn.viz.rollout import attention_rollout
from keras_attn.viz.rollout import plot_attention_rollout
from keras_attn.viz.rollout import vit_attention_rollout

__all__ = [
    "attention_rollout",
    "plot_attention_heads",
    "plot_attention_rollout",
    "plot_learning_curves",
    "plot_positional_encoding",
    "vit_attention_rollout",
]
