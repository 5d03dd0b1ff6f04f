"""Reusable attention layers, written with `keras.ops` only (TensorFlow, JAX
and PyTorch backends)."""

# The attention functions live below the layers, in keras_attn.ops; these
# public names stay here too.
from keras_attn.ops.attention import fused_dot_product_attention
from keras_attn.ops.attention import scaled_dot_product_attention
from keras_attn.ops.masking import causal_mask

from keras_attn.layers.activations import gelu
from keras_attn.layers.class_token import ClassToken
from keras_attn.layers.conformer_block import ConformerBlock
from keras_attn.layers.conformer_conv_module import ConformerConvModule
from keras_attn.layers.conv_subsampling import ConvSubsampling
from keras_attn.layers.conv_subsampling import subsampled_length
from keras_attn.layers.fast_conv_subsampling import FastConvSubsampling
from keras_attn.layers.fast_conv_subsampling import fast_subsampled_length
from keras_attn.layers.feed_forward import FeedForward
from keras_attn.layers.log_mel_features import LogMelFeatures
from keras_attn.layers.parakeet_log_mel_features import ParakeetLogMelFeatures
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_attn.layers.sinusoidal_positional_encoding import (
    SinusoidalPositionalEncoding,
)
from keras_attn.layers.sinusoidal_positional_encoding import (
    sinusoidal_positional_encoding,
)
from keras_attn.layers.spec_augment import SpecAugment
# Not in __all__ yet: README's Public API block (the list of stable names,
# tests/test_public_api.py) must name it first.
from keras_attn.layers.streaming import chunk_attention_mask  # noqa: F401
from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor
from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock

__all__ = [
    "ClassToken",
    "ConformerBlock",
    "ConformerConvModule",
    "ConvSubsampling",
    "FastConvSubsampling",
    "FeedForward",
    "LogMelFeatures",
    "ParakeetLogMelFeatures",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RelativeMultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "SpecAugment",
    "TransducerJoint",
    "TransducerPredictor",
    "TransformerBlock",
    "TransformerDecoderBlock",
    "causal_mask",
    "gelu",
    "fused_dot_product_attention",
    "scaled_dot_product_attention",
    "sinusoidal_positional_encoding",
    "subsampled_length",
    "fast_subsampled_length",
]

# The other packages that register classes, once this one is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
