"""`BertConfig` and the BERT presets.

`bert_base` and `bert_large` are the two models of Devlin et al. (2019),
section 3; the four small ones are the compact models of Turc et al. (2019),
"Well-Read Students Learn Better", Table 6 / the 24 released miniatures (all
with intermediate width 4 x hidden and 64-wide heads). `roberta_base` and
`roberta_large` are RoBERTa (Liu et al., 2019, section 4 / the released
`roberta-base` and `roberta-large`): the same encoder with a 50,265-token
byte-level BPE vocabulary, one segment, LayerNorm epsilon 1e-5 and positions
counted past the padding id 1. Parameter counts are those of the backbone
(`build_bert(name).count_params()`), pooler included, task heads excluded.
"""

import dataclasses
import numbers

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


def _optional_token_id(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be None or a token id "
            f"(an integer >= 0). Received: {name}={value!r}"
        )


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
    """BERT hyper-parameters; the fields are the arguments of `BertBackbone`,
    checked when a config is made.

    Attributes:
        vocabulary_size: WordPiece vocabulary size (30,522 for the uncased
            English vocabulary of the original release).
        num_layers: number of post-norm encoder blocks L.
        num_heads: attention heads per block A.
        hidden_dim: model width H.
        intermediate_dim: feed-forward hidden width (4 H in every preset).
        dropout: rate after the embeddings and on every sublayer output
            (`hidden_dropout_prob`).
        attention_dropout: rate on the attention probabilities
            (`attention_probs_dropout_prob`).
        max_sequence_length: the longest input, in tokens; a longer input is
            a `ValueError`. The learned position table has this many rows
            (BERT), or `max_sequence_length + padding_id + 1` with a
            `padding_id` (RoBERTa: 512 tokens, 514 rows).
        num_segments: rows of the segment ("token type") table; 2 for
            sentence A / sentence B.
        layer_norm_epsilon: LayerNorm epsilon (1e-12 in the reference code).
        activation: the feed-forward (and masked-LM transform) activation:
            `"gelu"`, the exact GELU of the reference code, or
            `"gelu_approximate"`, its tanh approximation, which keras-hub's
            BERT uses (`keras_attn.convert.from_keras_hub` sets it); any
            Keras activation name is accepted.
        padding_id: None (BERT): the t-th token of a row takes row t of the
            position table, whatever its id. An id (RoBERTa and XLM-R: 1,
            their `<pad>`): positions are counted over the tokens that are
            not `padding_id`, starting at row `padding_id + 1`, and every
            padding token takes row `padding_id` (transformers'
            `RobertaEmbeddings`, computed from the token ids). Packed rows'
            `positions` (from 0) are shifted by `padding_id + 1` the same way.
        remat: rematerialise each encoder block in training (gradient
            checkpointing): its activations are recomputed in the backward
            pass instead of stored. Less memory for about one more forward
            pass per step; the same weights give the same outputs and
            gradients either way.
    """

    vocabulary_size: int = field(30522, positive_int)
    num_layers: int = field(12, positive_int)
    num_heads: int = field(12, positive_int)
    hidden_dim: int = field(768, positive_int)
    intermediate_dim: int = field(3072, positive_int)
    dropout: float = field(0.1, rate)
    attention_dropout: float = field(0.1, rate)
    max_sequence_length: int = field(512, positive_int)
    num_segments: int = field(2, positive_int)
    layer_norm_epsilon: float = field(1e-12, positive_float)
    activation: str = field("gelu", activation_name)
    remat: bool = field(False, flag)
    padding_id: int = field(None, _optional_token_id)

    def check_relations(self):
        check_heads_divide(self)
        if self.padding_id is not None and self.padding_id >= self.vocabulary_size:
            raise ValueError(
                f"`padding_id` must be a token id, below vocabulary_size="
                f"{self.vocabulary_size}. Received: padding_id={self.padding_id}"
            )

    def position_rows(self):
        """Rows of the learned position table."""
        if self.padding_id is None:
            return self.max_sequence_length
        return self.max_sequence_length + self.padding_id + 1


def _variant(num_layers, hidden_dim, num_heads):
    return BertConfig(
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        intermediate_dim=4 * hidden_dim,
    )


def _roberta(num_layers, hidden_dim, num_heads):
    return BertConfig(
        vocabulary_size=50265,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        intermediate_dim=4 * hidden_dim,
        num_segments=1,
        layer_norm_epsilon=1e-5,
        padding_id=1,
    )


BERT_PRESETS = {
    # Turc et al. 2019, "Well-Read Students", L=2 H=128 A=2 (BERT-Tiny). 4,385,920.
    "bert_tiny": _variant(2, 128, 2),
    # Turc et al. 2019, L=4 H=256 A=4 (BERT-Mini). 11,170,560.
    "bert_mini": _variant(4, 256, 4),
    # Turc et al. 2019, L=4 H=512 A=8 (BERT-Small). 28,763,648.
    "bert_small": _variant(4, 512, 8),
    # Turc et al. 2019, L=8 H=512 A=8 (BERT-Medium). 41,373,184.
    "bert_medium": _variant(8, 512, 8),
    # Devlin et al. 2019, section 3, BERT-BASE L=12 H=768 A=12 (110M). 109,482,240.
    "bert_base": _variant(12, 768, 12),
    # Devlin et al. 2019, section 3, BERT-LARGE L=24 H=1024 A=16 (340M). 335,141,888.
    "bert_large": _variant(24, 1024, 16),
    # Liu et al. 2019 (RoBERTa), the released roberta-base: BERT-BASE's sizes,
    # 50,265 BPE tokens, 514 position rows (125M). 124,645,632, as transformers'
    # RobertaModel counts it (pooler included) with the published config's values.
    "roberta_base": _roberta(12, 768, 12),
    # Liu et al. 2019, the released roberta-large: BERT-LARGE's sizes (355M).
    # 355,359,744, counted the same way.
    "roberta_large": _roberta(24, 1024, 16),
}


DEFAULT_PRESET = "bert_base"


def get_bert_config(config=DEFAULT_PRESET, **overrides):
    """A `BertConfig` from a config, a preset name or a dict of fields, with
    `overrides` (fields) applied; an unknown name or field is a `ValueError`."""
    return resolve_config(config, BertConfig, BERT_PRESETS, "BERT", **overrides)


def replace_bert_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "BERT", **overrides)
