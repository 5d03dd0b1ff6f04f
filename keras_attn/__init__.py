"""keras_attn: attention layers for Keras 3 and the models built from them."""

__version__ = "0.1.0"

from keras_attn import layers

__all__ = ["layers", "__version__"]
