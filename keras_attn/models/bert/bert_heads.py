"""The masked-LM head of BERT pretraining, and the pooler of packed rows' next-sentence head."""

import keras
import numpy as np
from keras import ops

from keras_attn._guard import concrete_value

from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import get_activation
from keras_attn.layers.activations import serialize_activation
from keras_attn.ops.masking import nan_where


@keras.saving.register_keras_serializable(package="keras_attn")
class BertMaskedLMHead(keras.layers.Layer):
    """Predicts the original tokens at the masked positions.

    ```
    sequence (B, T, D) -> gather mask_positions        (B, P, D)
     -> Dense D, activation, LayerNorm                 "transform_dense", "transform_layer_norm"
     -> x @ embeddings^T + output_bias                 (B, P, V) logits
    ```

    The decoder matrix is not a weight of this layer: it is the token
    embedding table passed at call time (`embeddings=`), so input and output
    embeddings are one variable, as in the original BERT; the layer owns only
    the transform and the `(V,)` output bias.

    Args:
        vocabulary_size: V, the number of logits per position.
        activation: transform activation (`"gelu"`: exact GELU).
        layer_norm_epsilon: epsilon of the transform LayerNorm.
        kernel_initializer: initializer of the transform kernel.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)` encoder output.
        mask_positions: `(B, P)` int positions to predict (in `[0, T)`).
        embeddings: `(V, D)` decoder matrix (the token embedding table).

    Returns:
        `(B, P, V)` logits.

    Example:

    >>> import numpy as np
    >>> head = BertMaskedLMHead(vocabulary_size=10)
    >>> logits = head(np.ones((2, 5, 4), "float32"), np.array([[0, 3], [1, 1]]),
    ...               embeddings=np.ones((10, 4), "float32"))
    >>> tuple(logits.shape)
    (2, 2, 10)
    """

    def __init__(
        self,
        vocabulary_size,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.activation = get_activation("activation", activation)
        self.layer_norm_epsilon = check_positive_float(
            "layer_norm_epsilon", layer_norm_epsilon
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, inputs_shape, mask_positions_shape=None, embeddings_shape=None):
        width = inputs_shape[-1]
        self.transform_dense = keras.layers.Dense(
            width,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="transform_dense",
        )
        self.transform_dense.build((None, None, width))
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name="transform_layer_norm",
        )
        self.transform_layer_norm.build((None, None, width))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, inputs, mask_positions, embeddings):
        embeddings = ops.convert_to_tensor(embeddings)
        if embeddings.shape[0] is not None and embeddings.shape[0] != self.vocabulary_size:
            raise ValueError(
                f"`embeddings` must have vocabulary_size={self.vocabulary_size} "
                f"rows. Received: embeddings.shape={tuple(embeddings.shape)}"
            )
        positions = ops.cast(mask_positions, "int32")  # (B, P)
        # A position outside the sequence gives NaN, never the clamped last
        # (or first) token that XLA's gather would return silently.
        valid = ops.logical_and(positions >= 0, positions < ops.shape(inputs)[1])
        # expand_dims, not `[..., None]`: LiteRT has no builtin strided slice
        # that adds an axis (see keras_attn.export.portable).
        positions = ops.expand_dims(ops.where(valid, positions, 0), -1)  # (B, P, 1)
        x = ops.take_along_axis(inputs, positions, axis=1)  # (B, P, D)
        x = ops.where(ops.expand_dims(valid, -1), x, ops.cast(float("nan"), x.dtype))
        x = self.transform_layer_norm(self.activation(self.transform_dense(x)))
        table = ops.cast(embeddings, self.compute_dtype)  # (V, D)
        # A matmul with the transposed table, not einsum("bpd,vd->bpv"): the
        # same logits, and on TensorFlow's CPU a faster training step (the
        # product alone 1.54x, bert_mini's whole masked-LM step 1.12x; a tie
        # on JAX; benchmarks/RESULTS.md, benchmarks/einsum_forms.py).
        logits = ops.matmul(x, ops.transpose(table))  # (B, P, V)
        return logits + ops.cast(self.output_bias, self.compute_dtype)

    def compute_output_shape(self, inputs_shape, mask_positions_shape, embeddings_shape=None):
        return tuple(mask_positions_shape) + (self.vocabulary_size,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "activation": serialize_activation(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config


def example_pooled_outputs(sequence_output, packed_segment_ids, dense, max_segments):
    """The pooled `[CLS]` vector of each example of packed rows, for the
    next-sentence head: `dense` (the backbone's `pooled_dense`) on the
    first token of segments 1..K.

    ```
    packed_segment_ids (B, T) -> first token of segments 1..K   (B, K)
    sequence (B, T, D)        -> gather, dense (tanh)           (B, K, D)
    ```

    Args:
        sequence_output: `(B, T, D)`.
        packed_segment_ids: `(B, T)` int segment ids (1..k, 0 for padding),
            checked by the backbone.
        dense: the backbone's `pooled_dense` layer (its weights, once).
        max_segments: K. A row with more examples is a `ValueError` where
            its values exist and NaN for that row inside a compiled step,
            never a dropped example.

    Returns:
        `(B, K, D)`; a slot past a row's last example repeats its first
        example's (finite, for a label of weight 0); a row the backbone made
        NaN stays NaN in every slot.
    """
    ids = ops.cast(packed_segment_ids, "int32")  # (B, T)
    most = ops.max(ids, axis=1)  # (B,) examples in each row
    found = concrete_value(most)
    if found is not None and (found > max_segments).any():
        row = int(np.argmax(found > max_segments))
        raise ValueError(
            "Invalid value for argument `packed_segment_ids`: a row may hold at "
            f"most max_segments={max_segments} examples (one next-sentence "
            f"prediction each); row {row} holds {int(found[row])}. Received: "
            f"packed_segment_ids[{row}].max()={int(found[row])}"
        )
    segments = ops.arange(1, max_segments + 1, dtype="int32")  # (K,)
    match = ops.equal(ops.expand_dims(ids, 1), ops.reshape(segments, (1, -1, 1)))
    first = ops.cast(ops.argmax(ops.cast(match, "int32"), axis=-1), "int32")  # (B, K)
    x = ops.take_along_axis(sequence_output, ops.expand_dims(first, -1), axis=1)  # (B, K, D)
    return nan_where(most > max_segments, dense(x))
