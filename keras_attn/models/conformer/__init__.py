"""Conformer (Gulati et al., 2020) with a CTC head: config, presets, builder;
greedy transducer decoding."""

from keras_attn.models.conformer.conformer_config import CONFORMER_PRESETS
from keras_attn.models.conformer.conformer_config import ConformerConfig
from keras_attn.models.conformer.conformer_config import get_conformer_config
from keras_attn.models.conformer.conformer_config import replace_conformer_config
from keras_attn.models.conformer.conformer_model import ConformerCTC
from keras_attn.models.conformer.conformer_model import build_conformer
from keras_attn.models.conformer.conformer_model import unpack_utterances
from keras_attn.models.conformer.streaming import ConformerStreamer
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_decode

__all__ = [
    "CONFORMER_PRESETS",
    "ConformerCTC",
    "ConformerConfig",
    "ConformerStreamer",
    "build_conformer",
    "get_conformer_config",
    "replace_conformer_config",
    "transducer_greedy_decode",
    "unpack_utterances",
]
