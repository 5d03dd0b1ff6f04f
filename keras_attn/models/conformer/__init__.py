"""Conformer (Gulati et al., 2020) with a CTC head or a transducer decoder:
config, presets, builders; greedy transducer decoding."""

from keras_attn.models.conformer.conformer_config import CONFORMER_PRESETS
from keras_attn.models.conformer.conformer_config import ConformerConfig
from keras_attn.models.conformer.conformer_config import get_conformer_config
from keras_attn.models.conformer.conformer_config import replace_conformer_config
from keras_attn.models.conformer.conformer_model import ConformerCTC
from keras_attn.models.conformer.conformer_model import build_conformer
from keras_attn.models.conformer.conformer_model import unpack_utterances
from keras_attn.models.conformer.streaming import ConformerStreamer
from keras_attn.models.conformer.transducer_decoding import transducer_beam_search
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_decode
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_ids
from keras_attn.models.conformer.transducer_model import ConformerTransducer
from keras_attn.models.conformer.transducer_model import build_conformer_transducer

__all__ = [
    "CONFORMER_PRESETS",
    "ConformerCTC",
    "ConformerConfig",
    "ConformerStreamer",
    "ConformerTransducer",
    "build_conformer",
    "build_conformer_transducer",
    "get_conformer_config",
    "replace_conformer_config",
    "transducer_beam_search",
    "transducer_greedy_decode",
    "transducer_greedy_ids",
    "unpack_utterances",
]
