"""Activations the layers resolve by name: the exact GELU (through `erf`) for
`"gelu"`, its tanh approximation for `"gelu_approximate"`. Defined below the
layers, in `keras_attn._activations`, where the argument checks find them."""

from keras_attn._activations import gelu
from keras_attn._activations import gelu_approximate
from keras_attn._activations import serialize_activation

__all__ = ["gelu", "gelu_approximate", "serialize_activation"]
