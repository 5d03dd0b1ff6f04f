"""ModernBERT hyper-parameters and presets."""

import dataclasses

from keras_attn._checks import check_positive_float
from keras_attn.models._config import ModelConfig
from keras_attn.models._config import activation_name
from keras_attn.models._config import check_heads_divide
from keras_attn.models._config import field
from keras_attn.models._config import flag
from keras_attn.models._config import positive_float
from keras_attn.models._config import positive_int
from keras_attn.models._config import rate
from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config


def _non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0. Received: {name}={value!r}")
    return value


def _theta(name, value):
    return check_positive_float(name, value)


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(ModelConfig):
    """ModernBERT hyper-parameters; the fields are the arguments of
    `ModernBertBackbone`, checked when a config is made.

    Attributes:
        vocabulary_size: token vocabulary size (50,368 in the released
            checkpoints: the OLMo BPE vocabulary padded to a multiple of 64).
        num_layers: number of pre-norm encoder blocks.
        num_heads: attention heads per block.
        hidden_dim: model width.
        intermediate_dim: width of the GeGLU hidden layer (the input
            projection is twice as wide: value and gate).
        global_every: block `i` attends globally when
            `i % global_every == 0`, locally otherwise (3: blocks 0, 3, 6,
            ... are global).
        local_window: span in tokens of the local blocks' attention: token
            `t` sees the tokens `s` with `|t - s| <= local_window // 2`
            (Hugging Face's `local_attention`).
        global_rope_theta: rotary base of the global blocks.
        local_rope_theta: rotary base of the local blocks.
        layer_norm_epsilon: epsilon of every LayerNorm (none has a bias).
        max_sequence_length: the longest input (rotary positions have no
            table; a longer input is a `ValueError`).
        pad_id: the id of the padding token (the tokenizer's
            `[PAD]`); the model reads padding from `padding_mask` only.
        activation: the feed-forward and masked-LM head activation
            (`"gelu"`: exact GELU, Hugging Face's `hidden_activation`).
        dropout: rate after the embeddings and on each sublayer's output
            before its residual addition (the converter reads Hugging
            Face's `embedding_dropout`; the release sets every dropout to
            0, and Hugging Face places its `mlp_dropout` after the GeGLU
            activation instead).
        attention_dropout: rate on the attention probabilities (0 in the
            release).
        remat: rematerialise each block in training (gradient
            checkpointing).
    """

    vocabulary_size: int = field(50368, positive_int)
    num_layers: int = field(22, positive_int)
    num_heads: int = field(12, positive_int)
    hidden_dim: int = field(768, positive_int)
    intermediate_dim: int = field(1152, positive_int)
    global_every: int = field(3, positive_int)
    local_window: int = field(128, positive_int)
    global_rope_theta: float = field(160000.0, _theta)
    local_rope_theta: float = field(10000.0, _theta)
    layer_norm_epsilon: float = field(1e-5, positive_float)
    max_sequence_length: int = field(8192, positive_int)
    pad_id: int = field(50283, _non_negative_int)
    activation: str = field("gelu", activation_name)
    dropout: float = field(0.0, rate)
    attention_dropout: float = field(0.0, rate)
    remat: bool = field(False, flag)

    def check_relations(self):
        check_heads_divide(self)
        if (self.hidden_dim // self.num_heads) % 2:
            raise ValueError(
                "Rotary position embeddings turn pairs of features: the head size "
                "`hidden_dim // num_heads` must be even. Received: "
                f"hidden_dim={self.hidden_dim}, num_heads={self.num_heads}"
            )
        if self.pad_id >= self.vocabulary_size:
            raise ValueError(
                "`pad_id` must be an id of the vocabulary. Received: "
                f"pad_id={self.pad_id}, vocabulary_size={self.vocabulary_size}"
            )

    def is_global(self, index):
        """Whether block `index` attends globally (else within `local_window`)."""
        return index % self.global_every == 0


MODERNBERT_PRESETS = {
    # Warner et al. 2024, "Smarter, Better, Faster, Longer" (answerdotai/
    # ModernBERT-base): 22 layers, width 768, 12 heads, GeGLU 1152.
    # 149,014,272 weights, as transformers' ModernBertModel built from the
    # published config counts them (ModernBertMaskedLM: 149,655,232, the
    # decoder tied to the embeddings, as ModernBertForMaskedLM).
    "modernbert_base": ModernBertConfig(),
    # Warner et al. 2024 (answerdotai/ModernBERT-large): 28 layers, width
    # 1024, 16 heads, GeGLU 2624. 394,781,696 weights (transformers'
    # ModernBertModel; with the masked-LM head 395,881,664).
    "modernbert_large": ModernBertConfig(
        num_layers=28, hidden_dim=1024, num_heads=16, intermediate_dim=2624),
}

DEFAULT_PRESET = "modernbert_base"


def get_modernbert_config(config=DEFAULT_PRESET, **overrides):
    """A `ModernBertConfig` from a config, a preset name or a dict of fields,
    with `overrides` (fields) applied; an unknown name or field is a
    `ValueError`."""
    return resolve_config(config, ModernBertConfig, MODERNBERT_PRESETS, "ModernBERT",
                          **overrides)


def replace_modernbert_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "ModernBERT", **overrides)
