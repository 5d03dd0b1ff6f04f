"""`TransformerConfig` and the presets of "Attention Is All You Need".

Parameter counts are those of `build_transformer(name).count_params()` with
the presets' shared 37,000-token vocabulary (the paper's WMT 2014 En-De
byte-pair vocabulary); see `tests/models/test_transformer.py` for the sums
worked out by hand.
"""

import dataclasses

from keras_attn._checks import get_activation
from keras_attn.models._config import ModelConfig
from keras_attn.models._config import check_heads_divide
from keras_attn.models._config import field
from keras_attn.models._config import flag
from keras_attn.models._config import one_of
from keras_attn.models._config import optional_positive_int
from keras_attn.models._config import positive_float
from keras_attn.models._config import positive_int
from keras_attn.models._config import rate
from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config

NORM_POSITIONS = ("post", "pre")
POSITION_EMBEDDINGS = ("sinusoidal", "learned")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")


def _integer(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be an integer. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """Encoder-decoder hyper-parameters; the fields are the arguments of
    `Transformer` / `build_transformer`, checked when a config is made.

    Attributes:
        vocabulary_size: size of the (shared) vocabulary; with
            `target_vocabulary_size` set, of the source vocabulary only.
        target_vocabulary_size: None for one vocabulary shared by source and
            target, whose embedding matrix is also the pre-softmax projection
            (the paper's section 3.4). An int gives separate source and
            target embeddings and an untied output projection.
        hidden_dim: model width `d_model`.
        intermediate_dim: feed-forward width `d_ff`.
        num_heads: attention heads `h`.
        key_dim: query/key size per head `d_k`; None for `hidden_dim / h`.
        value_dim: value size per head `d_v`; None for `key_dim` when that is
            given, else `hidden_dim / h` (Table 3 rows (A) and (B) vary them).
        num_encoder_layers: encoder blocks N.
        num_decoder_layers: decoder blocks N.
        dropout: `P_drop`: on the embedding sums and on every sublayer output.
        attention_dropout: on the attention probabilities (0 in the paper).
        activation_dropout: after the feed-forward ReLU (0 in the paper).
        activation: feed-forward activation.
        norm_position: `"post"` (the paper) or `"pre"` (a final LayerNorm is
            then added after each stack).
        position_embedding: `"sinusoidal"` (the paper) or `"learned"`.
        max_sequence_length: longest sequence the positions cover: the size
            of the learned table, and the cap on decoding lengths for both.
        layer_norm_epsilon: LayerNorm epsilon (1e-6 as in tensor2tensor).
        pad_id: the padding token id; padding masks are `ids != pad_id`,
            except at the first target position, which always holds the
            start token (so the start token may be the pad id, as in
            Marian).
        sinusoid_layout: `"interleaved"` (the paper's code) or
            `"concatenated"` (all sines, then all cosines: Marian / opus-mt).
        output_bias: a learned bias on the tied output logits (Marian's
            `final_logits_bias`); the untied `output_projection` always has
            its own.
        remat: rematerialise each encoder and decoder block in training (gradient
            checkpointing): its activations are recomputed in the backward
            pass instead of stored. Less memory for about one more forward
            pass per step; the same weights give the same outputs and
            gradients either way.
    """

    vocabulary_size: int = field(37000, positive_int)
    target_vocabulary_size: int = field(None, optional_positive_int)
    hidden_dim: int = field(512, positive_int)
    intermediate_dim: int = field(2048, positive_int)
    num_heads: int = field(8, positive_int)
    key_dim: int = field(None, optional_positive_int)
    value_dim: int = field(None, optional_positive_int)
    num_encoder_layers: int = field(6, positive_int)
    num_decoder_layers: int = field(6, positive_int)
    dropout: float = field(0.1, rate)
    attention_dropout: float = field(0.0, rate)
    activation_dropout: float = field(0.0, rate)
    activation: str = field("relu", get_activation)
    norm_position: str = field("post", one_of(NORM_POSITIONS))
    position_embedding: str = field("sinusoidal", one_of(POSITION_EMBEDDINGS))
    max_sequence_length: int = field(1024, positive_int)
    layer_norm_epsilon: float = field(1e-6, positive_float)
    pad_id: int = field(0, _integer)
    sinusoid_layout: str = field("interleaved", one_of(SINUSOID_LAYOUTS))
    output_bias: bool = field(False, flag)
    remat: bool = field(False, flag)

    def check_relations(self):
        if not 0 <= self.pad_id < self.vocabulary_size:
            raise ValueError(
                "`pad_id` must be a token id of the vocabulary. Received: "
                f"pad_id={self.pad_id}, vocabulary_size={self.vocabulary_size}"
            )
        # With `key_dim` given (values default to it) the heads need not split D.
        if self.key_dim is None:
            check_heads_divide(self)
        if self.position_embedding == "sinusoidal" and self.hidden_dim % 2:
            raise ValueError(
                "Sinusoidal positions need an even `hidden_dim`. Received: "
                f"hidden_dim={self.hidden_dim}"
            )

    @property
    def shared_vocabulary(self):
        return self.target_vocabulary_size is None


TRANSFORMER_PRESETS = {
    # Vaswani et al. 2017, Table 3 "base": N=6, d_model 512, d_ff 2048, h 8,
    # P_drop 0.1. 63,082,496 parameters (the paper says 65M).
    "transformer_base": TransformerConfig(),
    # Table 3 "big": d_model 1024, d_ff 4096, h 16, P_drop 0.3.
    # 214,245,376 parameters (the paper says 213M).
    "transformer_big": TransformerConfig(
        hidden_dim=1024, intermediate_dim=4096, num_heads=16, dropout=0.3
    ),
}


DEFAULT_PRESET = "transformer_base"


def get_transformer_config(config=DEFAULT_PRESET, **overrides):
    """A `TransformerConfig` from a config, a preset name or a dict of
    fields, with `overrides` (fields) applied; an unknown name or field is a
    `ValueError`."""
    return resolve_config(config, TransformerConfig, TRANSFORMER_PRESETS, "Transformer",
                          **overrides)


def replace_transformer_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "Transformer", **overrides)
