"""`TransformerConfig` and the presets of "Attention Is All You Need".

Parameter counts are those of `build_transformer(name).count_params()` with
the presets' shared 37,000-token vocabulary (the paper's WMT 2014 En-De
byte-pair vocabulary); see `tests/models/test_transformer.py` for the sums
worked out by hand.
"""

import dataclasses

from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config

NORM_POSITIONS = ("post", "pre")
POSITION_EMBEDDINGS = ("sinusoidal", "learned")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Encoder-decoder hyper-parameters; the fields are the arguments of
    `Transformer` / `build_transformer`.

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

    vocabulary_size: int = 37000
    target_vocabulary_size: int = None
    hidden_dim: int = 512
    intermediate_dim: int = 2048
    num_heads: int = 8
    key_dim: int = None
    value_dim: int = None
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_position: str = "post"
    position_embedding: str = "sinusoidal"
    max_sequence_length: int = 1024
    layer_norm_epsilon: float = 1e-6
    pad_id: int = 0
    sinusoid_layout: str = "interleaved"
    output_bias: bool = False
    remat: bool = False

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
