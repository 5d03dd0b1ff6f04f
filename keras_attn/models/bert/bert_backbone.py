"""The BERT encoder as a functional `keras.Model`.

```
token_ids (B, T)    -> ReversibleEmbedding        "token_embedding"     (B, T, D)
segment_ids (B, T)  -> Embedding                  "segment_embedding"   (B, T, D)
positions 0..T-1    -> PositionEmbedding          "position_embedding"  (B, T, D)
  (RoBERTa, padding_id p: positions counted over the non-padding token ids
   from p + 1, padding at p)
 sum                                              "embeddings_add"
 -> LayerNorm, Dropout                            "embeddings_layer_norm", "embeddings_dropout"
 -> L x post-norm TransformerBlock (exact GELU),  "transformer_block_{i}"
      keys masked by padding_mask (B, T)
 -> sequence_output                                                     (B, T, D)
 -> [CLS] vector -> Dense tanh                    "pooled_dense"        (B, D)
 -> pooled_output
```
"""

import dataclasses

import keras
import numpy as np  # noqa: F401  (the doctests use it)
from keras import ops

from keras_attn._guard import IdSpec
from keras_attn._guard import MaskSpec
from keras_attn._guard import check_ids
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn._remat import remat_scope
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import nan_where
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.position_embedding import packed_positions
from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.models._guarded import GuardedModel
from keras_attn.models.bert.bert_config import DEFAULT_PRESET
from keras_attn.models.bert.bert_config import BertConfig
from keras_attn.models.bert.bert_config import get_bert_config

INPUT_NAMES = ("token_ids", "segment_ids", "padding_mask")
# Optional inputs of packed rows (docs/packing.md), outside the functional
# graph: left out, the model runs that graph as it did before packing.
PACKED_INPUT_NAMES = ("packed_segment_ids", "positions")


def packed_inputs(inputs):
    """`(packed_segment_ids, positions)` of a dict of inputs that holds
    them, None when it holds neither; one without the other is a
    `ValueError`."""
    if not isinstance(inputs, dict):
        return None
    values = [inputs.get(name) for name in PACKED_INPUT_NAMES]
    if all(value is None for value in values):
        return None
    if any(value is None for value in values):
        raise ValueError(
            "Invalid value for argument `inputs`: packed rows need both "
            f"{PACKED_INPUT_NAMES[0]!r} and {PACKED_INPUT_NAMES[1]!r}. Received: "
            f"inputs with keys {sorted(inputs)}"
        )
    return values


def _encode(layer, config, token_ids, segment_ids, padding_mask,
            packed_segment_ids=None, positions=None, training=None):
    """The encoder on `layer(name)`'s layers: `(sequence_output,
    pooled_output)`. It builds the functional graph (without the packed
    inputs) and runs packed rows (with them)."""
    token_embedding, segment_embedding = layer("token_embedding"), layer("segment_embedding")
    tokens = _lookup_or_nan(token_embedding, token_ids, config.vocabulary_size)
    segments = _lookup_or_nan(segment_embedding, segment_ids, config.num_segments)
    # RoBERTa's positions are counted from the token ids.
    offset = {} if config.padding_id is None else {"token_ids": token_ids}
    if packed_segment_ids is None:
        position_vectors = layer("position_embedding")(tokens, **offset)
    else:
        position_vectors = layer("position_embedding")(
            tokens, positions=positions, segment_ids=packed_segment_ids, **offset)
    x = layer("embeddings_add")([tokens, segments, position_vectors])
    x = layer("embeddings_layer_norm")(x)
    x = layer("embeddings_dropout")(x, training=training)
    for i in range(config.num_layers):
        # The int mask as given: each block reads it as booleans, and a
        # value other than 0/1 makes that example NaN inside a graph
        # (`keras_attn.ops.masking.checked_mask`), never a 1.
        block = layer(f"transformer_block_{i}")
        if packed_segment_ids is None:
            x = block(x, padding_mask=padding_mask, training=training)
        else:
            x = block(x, padding_mask=padding_mask, segment_ids=packed_segment_ids,
                      training=training)
    # A row of padding only has no answer of its own (it would come from the
    # padding's ids): NaN where nothing can raise (`MaskSpec`).
    empty = ops.logical_not(ops.any(ops.not_equal(ops.cast(padding_mask, "int32"), 0), axis=1))
    x = nan_where(empty, x)
    return x, layer("pooled_dense")(x[:, 0, :])  # (B, T, D), (B, D)


@keras.saving.register_keras_serializable(package="keras_attn")
class PaddingOffsetPositionEmbedding(PositionEmbedding):
    """RoBERTa's learned positions: a `(max_sequence_length, D)` table whose
    rows are looked up from the token ids.

    ```
    real = token_ids != padding_id                     (B, T)
    position = cumsum(real) * real + padding_id        (B, T)
    ```
    The first real token takes row `padding_id + 1`, padding tokens take row
    `padding_id` and do not advance the count (transformers'
    `RobertaEmbeddings`, after fairseq's `make_positions`), so the longest
    input is `max_sequence_length - padding_id - 1` tokens. Packed rows'
    `positions` (restarting at 0, checked as `PositionEmbedding` checks them)
    take rows `padding_id + 1 + position`.

    Args:
        max_sequence_length: rows of the table (514 for RoBERTa's 512 tokens).
        padding_id: the token id of padding.
        **kwargs: `PositionEmbedding`'s arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        token_ids: `(B, T)` int.
        positions, segment_ids: optional, of packed rows.

    Returns:
        `(B, T, D)`; a position past the table is NaN where it cannot raise.
    """

    def __init__(self, max_sequence_length, padding_id=1, **kwargs):
        super().__init__(max_sequence_length, **kwargs)
        if isinstance(padding_id, bool) or not isinstance(padding_id, int) or not (
                0 <= padding_id < self.max_sequence_length - 1):
            raise ValueError(
                "Invalid value for argument `padding_id`: it must be an integer in "
                f"[0, max_sequence_length - 1) = [0, {self.max_sequence_length - 1}). "
                f"Received: padding_id={padding_id!r}"
            )
        self.padding_id = padding_id

    def call(self, inputs, token_ids, positions=None, segment_ids=None):
        first = self.padding_id + 1
        longest = self.max_sequence_length - first
        length = inputs.shape[-2]
        if isinstance(length, int) and length > longest:
            raise ValueError(
                f"Inputs of {length} tokens do not fit: a table of {self.max_sequence_length} "
                f"rows past padding_id={self.padding_id} holds {longest}. "
                f"Received: sequence length={length}"
            )
        if positions is not None or segment_ids is not None:  # packed rows
            table = ops.convert_to_tensor(self.position_embeddings)[first:]  # (L - p - 1, D)
            vectors = packed_positions(table, positions, segment_ids, 0, inputs, limit=longest)
            return ops.cast(vectors, self.compute_dtype)
        real = ops.cast(ops.not_equal(token_ids, self.padding_id), "int32")  # (B, T)
        rows = ops.cumsum(real, axis=1) * real + self.padding_id  # (B, T)
        valid = rows < self.max_sequence_length
        vectors = ops.take(self.position_embeddings,
                           ops.minimum(rows, self.max_sequence_length - 1), axis=0)  # (B, T, D)
        vectors = ops.where(ops.expand_dims(valid, -1), vectors, float("nan"))
        return ops.cast(vectors, self.compute_dtype)

    def compute_output_shape(self, inputs_shape, token_ids_shape=None, positions_shape=None,
                             segment_ids_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        return {**super().get_config(), "padding_id": self.padding_id}


def bert_initializer():
    """Truncated normal with stddev 0.02, the reference BERT initializer."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


def check_token_ids(token_ids, vocabulary_size, name="token_ids"):
    """Raises `ValueError` if a concrete id lies outside `[0, vocabulary_size)`.

    Use it on NumPy data before it reaches the model (the model checks
    concrete inputs itself). Inside a compiled step an out-of-range id cannot
    raise on every backend (a gather clamps under XLA and on GPUs), so the
    backbone makes the embedding of such an id NaN instead: the error shows
    in the outputs (and a training step on it is skipped), never a silent
    wrong vector.
    """
    check_ids(name, token_ids, IdSpec(0, vocabulary_size, "the vocabulary"))
    return token_ids


def _lookup_or_nan(embedding, ids, size):
    """`embedding(ids)`, with a NaN vector for an id outside `[0, size)`
    on every backend, never a silently clamped row (XLA and GPUs clamp
    gathers; TF on CPU raises): id 0 is looked up in its place, then
    overwritten."""
    valid = ops.logical_and(ids >= 0, ids < size)  # (B, T)
    vectors = embedding(ops.where(valid, ids, 0))  # (B, T, D)
    return ops.where(ops.expand_dims(valid, -1), vectors, float("nan"))


@keras.saving.register_keras_serializable(package="keras_attn")
class BertBackbone(GuardedModel, ConfigModel, keras.Model):
    """BERT encoder: token, segment and padding inputs in, the sequence and
    pooled outputs out.

    The arguments are the fields of `BertConfig`; prefer
    `build_bert("bert_base")`.

    Inputs (a dict, any batch size, any length up to `max_sequence_length`):
        token_ids: `(B, T)` int, WordPiece ids in `[0, vocabulary_size)`.
        segment_ids: `(B, T)` int, 0 for sentence A, 1 for sentence B.
        padding_mask: `(B, T)` bool, or int/float holding only 1 (a real
            token) and 0; any other value is refused where the mask can be
            checked (eager calls, `fit`/`predict` on arrays, the zoo's
            pipelines), and inside a compiled step every nonzero value
            counts as a real token.
        packed_segment_ids: optional `(B, T)` int, for packed rows
            (`keras_attn.data.pack_sequences`): 1..k for the k examples of a
            row, 0 for padding. Not `segment_ids`, which keeps its BERT
            meaning (sentence A/B of each example). Each example attends to
            its own tokens only, and `padding_mask` must equal
            `packed_segment_ids > 0`.
        positions: optional `(B, T)` int, with `packed_segment_ids`: the
            position of each token in its example (restarting at 0).

    Every example of a packed row gets the outputs it gets alone; a packing
    that is not valid (see `keras_attn.ops.masking.SEGMENT_RULE`) is a
    `ValueError` in an eager call and NaN for that row inside a compiled
    step.

    Outputs (a dict):
        sequence_output: `(B, T, D)`, the last block's output.
        pooled_output: `(B, D)`, `tanh(W h_[CLS] + b)`.

    Concrete inputs are checked (`ValueError` for a token or segment id out
    of range, a `padding_mask` that is not boolean or 0/1, a length past
    `max_sequence_length`); inside a compiled step, where nothing can raise,
    such ids give NaN outputs instead (see `keras_attn.models._guarded`).

    Example:

    >>> import numpy as np
    >>> model = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                      hidden_dim=8, intermediate_dim=16,
    ...                      max_sequence_length=16)
    >>> ids = np.array([[2, 7, 9, 3, 0]])
    >>> out = model({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...              "padding_mask": ids != 0})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 5, 8), (1, 8))

    References:
        Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers
        for Language Understanding", NAACL 2019, sections 3 and A.2.
    """

    config_attribute = "bert_config"

    @config_arguments(BertConfig, "BERT")
    def __init__(self, config, dtype=None, **kwargs):
        # === Layers ===
        token_embedding = keras.layers.ReversibleEmbedding(
            config.vocabulary_size,
            config.hidden_dim,
            tie_weights=True,
            embeddings_initializer=bert_initializer(),
            dtype=dtype,
            name="token_embedding",
        )
        segment_embedding = keras.layers.Embedding(
            config.num_segments,
            config.hidden_dim,
            embeddings_initializer=bert_initializer(),
            dtype=dtype,
            name="segment_embedding",
        )
        if config.padding_id is None:
            position_embedding = PositionEmbedding(
                config.max_sequence_length,
                initializer=bert_initializer(),
                dtype=dtype,
                name="position_embedding",
            )
        else:
            position_embedding = PaddingOffsetPositionEmbedding(
                config.position_rows(),
                padding_id=config.padding_id,
                initializer=bert_initializer(),
                dtype=dtype,
                name="position_embedding",
            )
        embeddings_add = keras.layers.Add(dtype=dtype, name="embeddings_add")
        embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=dtype, name="embeddings_layer_norm"
        )
        embeddings_dropout = keras.layers.Dropout(
            config.dropout, dtype=dtype, name="embeddings_dropout"
        )
        block_names = [f"transformer_block_{i}" for i in range(config.num_layers)]
        with remat_scope(config.remat, block_names):
            blocks = [
                TransformerBlock(
                    num_heads=config.num_heads,
                    intermediate_dim=config.intermediate_dim,
                    norm_position="post",
                    activation=config.activation,
                    dropout=config.dropout,
                    attention_dropout=config.attention_dropout,
                    layer_norm_epsilon=config.layer_norm_epsilon,
                    kernel_initializer=bert_initializer(),
                    dtype=dtype,
                    name=name,
                )
                for name in block_names
            ]
        pooled_dense = keras.layers.Dense(
            config.hidden_dim,
            activation="tanh",
            kernel_initializer=bert_initializer(),
            dtype=dtype,
            name="pooled_dense",
        )

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        layers = {layer.name: layer for layer in (
            token_embedding, segment_embedding, position_embedding, embeddings_add,
            embeddings_layer_norm, embeddings_dropout, pooled_dense, *blocks)}
        sequence_output, pooled_output = _encode(
            layers.__getitem__, config, token_ids, segment_ids, padding_mask)
        super().__init__(
            inputs={
                "token_ids": token_ids,
                "segment_ids": segment_ids,
                "padding_mask": padding_mask,
            },
            outputs={
                "sequence_output": sequence_output,
                "pooled_output": pooled_output,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.bert_config = config
        self.token_embedding = token_embedding

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)  # a dict is read by name, never by position
        packed = packed_inputs(inputs)
        if packed is None:  # the functional graph, as without packing
            return super().call(inputs, training=training, mask=mask)
        # Eager checks that name this model's inputs (the layers check again
        # under their own names, and make a bad row NaN inside a graph).
        segment_ids, _ = checked_segment_ids(packed[0], "packed_segment_ids")
        checked_positions(packed[1], segment_ids, name="positions")
        sequence_output, pooled_output = _encode(
            self.get_layer, self.bert_config, inputs["token_ids"], inputs["segment_ids"],
            inputs["padding_mask"], *packed, training=training)
        return {"sequence_output": sequence_output, "pooled_output": pooled_output}

    def compute_output_spec(self, inputs, training=None, mask=None):
        # A symbolic call with the packed inputs (BertPretrainer's packed
        # graph) is not one the functional graph was built for: the outputs'
        # shapes are known.
        token_ids = inputs["token_ids"]
        batch, length = token_ids.shape[0], token_ids.shape[1]
        width = self.bert_config.hidden_dim
        return {
            "sequence_output": keras.KerasTensor((batch, length, width), self.compute_dtype),
            "pooled_output": keras.KerasTensor((batch, width), self.compute_dtype),
        }

    def input_specs(self):
        config = self.bert_config
        return {
            "token_ids": IdSpec(0, config.vocabulary_size, "the vocabulary"),
            "segment_ids": IdSpec(0, config.num_segments, "the segments"),
            "padding_mask": MaskSpec(),
        }

    def max_length(self):
        return {"token_ids": self.bert_config.max_sequence_length}

    def optional_input_names(self):
        return PACKED_INPUT_NAMES


def build_bert(config=DEFAULT_PRESET, **overrides):
    """Builds a `BertBackbone` from a `BertConfig`, a preset name or a dict.

    Args:
        config: a `BertConfig`, a name from `BERT_PRESETS` (`"bert_base"`) or
            a dict of `BertConfig` fields.
        **overrides: `BertConfig` fields to change (`vocabulary_size=8000`,
            `max_sequence_length=128`); an unknown name is a `ValueError`.

    Returns:
        A `BertBackbone` (a functional `keras.Model`).

    Example:

    >>> model = build_bert("bert_tiny", vocabulary_size=100, num_layers=1)
    >>> model.count_params()
    293632
    """
    config = get_bert_config(config, **overrides)
    return BertBackbone(**dataclasses.asdict(config))
