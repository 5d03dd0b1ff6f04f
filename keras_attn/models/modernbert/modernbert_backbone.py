"""The ModernBERT encoder as a functional `keras.Model`.

```
token_ids (B, T) -> ReversibleEmbedding               "token_embedding"        (B, T, D)
 -> LayerNorm (no bias), Dropout                      "embeddings_layer_norm", "embeddings_dropout"
 -> L x pre-norm TransformerBlock, no biases,         "transformer_block_{i}"
      rotary queries and keys, GeGLU feed-forward;
      block i global (theta 160,000) when i % 3 == 0,
      else local: |t - s| <= 64 (theta 10,000);
      block 0 has no attention LayerNorm
      (attention_norm=False: the embedding
      LayerNorm precedes it)
 -> LayerNorm (no bias)                               "final_layer_norm"
 -> sequence_output                                                            (B, T, D)
```
"""

import dataclasses

import keras
import numpy as np  # noqa: F401  (the doctests use it)
from keras import ops

from keras_attn._guard import IdSpec
from keras_attn._guard import MaskSpec
from keras_attn._remat import remat_scope
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import nan_where
from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn.models._guarded import GuardedModel
from keras_attn.models.bert.bert_backbone import PACKED_INPUT_NAMES
from keras_attn.models.bert.bert_backbone import packed_inputs
from keras_attn.models.modernbert.modernbert_config import DEFAULT_PRESET
from keras_attn.models.modernbert.modernbert_config import ModernBertConfig
from keras_attn.models.modernbert.modernbert_config import get_modernbert_config


def modernbert_initializer():
    """Truncated normal with stddev 0.02 (cut at 2 stddev in the reference
    code; Keras's cut is 2 stddev too)."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


def _lookup_or_nan(embedding, ids, size):
    """`embedding(ids)`, with a NaN vector for an id outside `[0, size)`
    (XLA and GPUs clamp gathers silently)."""
    valid = ops.logical_and(ids >= 0, ids < size)
    vectors = embedding(ops.where(valid, ids, 0))
    return ops.where(ops.expand_dims(valid, -1), vectors, float("nan"))


def _encode(layer, config, token_ids, padding_mask, packed_segment_ids=None,
            positions=None, training=None):
    """The encoder on `layer(name)`'s layers: `sequence_output`. It builds
    the functional graph (without the packed inputs) and runs packed rows
    (with them)."""
    x = _lookup_or_nan(layer("token_embedding"), token_ids, config.vocabulary_size)
    x = layer("embeddings_layer_norm")(x)
    x = layer("embeddings_dropout")(x, training=training)
    for i in range(config.num_layers):
        block = layer(f"transformer_block_{i}")
        if packed_segment_ids is None:
            x = block(x, padding_mask=padding_mask, training=training)
        else:
            x = block(x, padding_mask=padding_mask, segment_ids=packed_segment_ids,
                      positions=positions, training=training)
    # A row of padding only has no answer of its own (it would come from the
    # padding's ids): NaN where nothing can raise (`MaskSpec`).
    empty = ops.logical_not(ops.any(ops.not_equal(ops.cast(padding_mask, "int32"), 0), axis=1))
    return nan_where(empty, layer("final_layer_norm")(x))


@keras.saving.register_keras_serializable(package="keras_attn")
class ModernBertBackbone(GuardedModel, ConfigModel, keras.Model):
    """ModernBERT encoder: token ids and a padding mask in, the sequence
    output out.

    The arguments are the fields of `ModernBertConfig`; prefer
    `build_modernbert("modernbert_base")`.

    Inputs (a dict, any batch size, any length up to `max_sequence_length`):
        token_ids: `(B, T)` int, ids in `[0, vocabulary_size)`.
        padding_mask: `(B, T)` bool, or 0/1 ints (1 = a real token).
        packed_segment_ids: optional `(B, T)` int, for packed rows
            (`keras_attn.data.pack_sequences`; ModernBERT's "unpadding"):
            1..k for the k examples of a row, 0 for padding. Each example
            attends to its own tokens only (and, in the local blocks, to
            those within the window), and `padding_mask` must equal
            `packed_segment_ids > 0`.
        positions: optional `(B, T)` int, with `packed_segment_ids`: the
            position of each token in its example (restarting at 0), which
            the rotary embeddings turn the queries and keys by.

    Every example of a packed row gets the outputs it gets alone.

    Outputs (a dict):
        sequence_output: `(B, T, D)`, the final LayerNorm's output
            (Hugging Face's `last_hidden_state`).

    Example:

    >>> import numpy as np
    >>> model = ModernBertBackbone(vocabulary_size=50, num_layers=2, num_heads=2,
    ...                            hidden_dim=8, intermediate_dim=12, local_window=4,
    ...                            max_sequence_length=16, pad_id=0)
    >>> ids = np.array([[2, 7, 9, 3, 0]])
    >>> out = model({"token_ids": ids, "padding_mask": ids != 0})
    >>> tuple(out["sequence_output"].shape)
    (1, 5, 8)

    References:
        Warner et al., "Smarter, Better, Faster, Longer: A Modern
        Bidirectional Encoder for Fast, Memory Efficient, and Long Context
        Finetuning and Inference", 2024, section 2.1.
    """

    config_attribute = "modernbert_config"

    @config_arguments(ModernBertConfig, "ModernBERT")
    def __init__(self, config, dtype=None, **kwargs):
        # === Layers ===
        token_embedding = keras.layers.ReversibleEmbedding(
            config.vocabulary_size,
            config.hidden_dim,
            tie_weights=True,
            embeddings_initializer=modernbert_initializer(),
            dtype=dtype,
            name="token_embedding",
        )
        embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, center=False, dtype=dtype,
            name="embeddings_layer_norm")
        embeddings_dropout = keras.layers.Dropout(
            config.dropout, dtype=dtype, name="embeddings_dropout")
        block_names = [f"transformer_block_{i}" for i in range(config.num_layers)]
        with remat_scope(config.remat, block_names):
            blocks = []
            for i, name in enumerate(block_names):
                is_global = config.is_global(i)
                blocks.append(TransformerBlock(
                    num_heads=config.num_heads,
                    intermediate_dim=config.intermediate_dim,
                    norm_position="pre",
                    activation=config.activation,
                    dropout=config.dropout,
                    attention_dropout=config.attention_dropout,
                    layer_norm_epsilon=config.layer_norm_epsilon,
                    use_bias=False,
                    layer_norm_center=False,
                    gated=True,
                    rotary_theta=(config.global_rope_theta if is_global
                                  else config.local_rope_theta),
                    window=None if is_global else config.local_window,
                    attention_norm=i > 0,
                    kernel_initializer=modernbert_initializer(),
                    dtype=dtype,
                    name=name,
                ))
        final_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, center=False, dtype=dtype, name="final_layer_norm")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        layers = {layer.name: layer for layer in (
            token_embedding, embeddings_layer_norm, embeddings_dropout, final_layer_norm,
            *blocks)}
        sequence_output = _encode(layers.__getitem__, config, token_ids, padding_mask)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": sequence_output},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.modernbert_config = config
        self.token_embedding = token_embedding

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)
        packed = packed_inputs(inputs)
        if packed is None:
            return super().call(inputs, training=training, mask=mask)
        segment_ids, _ = checked_segment_ids(packed[0], "packed_segment_ids")
        checked_positions(packed[1], segment_ids, name="positions")
        sequence_output = _encode(
            self.get_layer, self.modernbert_config, inputs["token_ids"],
            inputs["padding_mask"], *packed, training=training)
        return {"sequence_output": sequence_output}

    def compute_output_spec(self, inputs, training=None, mask=None):
        token_ids = inputs["token_ids"]
        shape = (token_ids.shape[0], token_ids.shape[1], self.modernbert_config.hidden_dim)
        return {"sequence_output": keras.KerasTensor(shape, self.compute_dtype)}

    def input_specs(self):
        return {
            "token_ids": IdSpec(0, self.modernbert_config.vocabulary_size, "the vocabulary"),
            "padding_mask": MaskSpec(),
        }

    def max_length(self):
        return {"token_ids": self.modernbert_config.max_sequence_length}

    def optional_input_names(self):
        return PACKED_INPUT_NAMES


def build_modernbert(config=DEFAULT_PRESET, **overrides):
    """Builds a `ModernBertBackbone` from a `ModernBertConfig`, a preset
    name (`"modernbert_base"`, `"modernbert_large"`) or a dict of fields,
    with `overrides` (fields) applied; an unknown name is a `ValueError`.

    Example:

    >>> model = build_modernbert("modernbert_base", vocabulary_size=100, num_layers=1,
    ...                          pad_id=0)
    >>> model.count_params()
    5092608
    """
    config = get_modernbert_config(config, **overrides)
    return ModernBertBackbone(**dataclasses.asdict(config))
