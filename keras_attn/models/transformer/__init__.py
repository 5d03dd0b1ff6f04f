"""The Transformer encoder-decoder (Vaswani et al., 2017): config, presets,
builder, and greedy / beam-search decoding with key/value caches."""

from keras_attn.models.transformer.decoding import TransformerTranslator
from keras_attn.models.transformer.decoding import beam_search
from keras_attn.models.transformer.decoding import greedy_search
from keras_attn.models.transformer.decoding import transformer_beam_search
from keras_attn.models.transformer.decoding import transformer_greedy_search
from keras_attn.models.transformer.shared_embedding import SharedEmbedding
from keras_attn.models.transformer.transformer_config import TRANSFORMER_PRESETS
from keras_attn.models.transformer.transformer_config import TransformerConfig
from keras_attn.models.transformer.transformer_config import (
    get_transformer_config,
)
from keras_attn.models.transformer.transformer_config import (
    replace_transformer_config,
)
from keras_attn.models.transformer.transformer_model import Transformer
from keras_attn.models.transformer.transformer_model import build_transformer

__all__ = [
    "TRANSFORMER_PRESETS",
    "SharedEmbedding",
    "Transformer",
    "TransformerConfig",
    "TransformerTranslator",
    "beam_search",
    "build_transformer",
    "get_transformer_config",
    "greedy_search",
    "replace_transformer_config",
    "transformer_beam_search",
    "transformer_greedy_search",
]
