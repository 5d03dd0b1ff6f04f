"""Learned position embeddings (BERT, ViT)."""

import numbers

import keras
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn._checks import check_static_shape
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import checked_segment_ids
from keras_attn.ops.masking import nan_where


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionEmbedding(keras.layers.Layer):
    """A trained `(max_sequence_length, D)` table of position vectors.

    Returns the first `T` rows (from `start_index`) broadcast to the input's
    shape, for the caller to add to its token embeddings. A sequence longer
    than `max_sequence_length` raises `ValueError` whenever its length is
    known while tracing (eager calls, `jit_compile`d and `jax.jit` functions);
    when the length is only known at run time (a TensorFlow graph with an
    unknown length) the out-of-range positions come out as NaN. A length is
    never clamped or wrapped around silently.

    Args:
        max_sequence_length: number of positions the table holds.
        initializer: initializer of the table (BERT uses a truncated normal
            with stddev 0.02).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        start_index: position of the first step (int or scalar tensor).
        positions: optional `(B, T)` integer positions of a packed row,
            restarting at 0 with each example (`keras_attn.data.packing`);
            row `t` of the table is looked up for position `t`, so each
            example gets the vectors it gets alone. Positions that do not
            restart at 0 and count up by 1, or run past the table, are a
            `ValueError` eagerly and make that example NaN in a graph.
            Not with a `start_index`.
        segment_ids: optional `(B, T)` segment ids beside `positions`: then
            each position must be 0 exactly where a segment starts.

    Returns:
        `(B, T, D)`.

    Example:

    >>> import numpy as np
    >>> layer = PositionEmbedding(max_sequence_length=16)
    >>> tuple(layer(np.zeros((2, 5, 8), "float32")).shape)
    (2, 5, 8)
    """

    def __init__(self, max_sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_sequence_length = check_positive_int(
            "max_sequence_length", max_sequence_length
        )
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
            trainable=True,
        )
        self.built = True

    def _check_length(self, length, start_index):
        """ValueError when static positions run past the table; returns
        whether the check could run (length and start known)."""
        static = isinstance(length, numbers.Integral) and isinstance(
            start_index, numbers.Integral
        )
        if static and (
            start_index < 0 or start_index + length > self.max_sequence_length
        ):
            raise ValueError(
                f"Positions {start_index}..{start_index + length - 1} do not "
                f"fit in max_sequence_length={self.max_sequence_length}. "
                f"Received: sequence length={length}, start_index={start_index}"
            )
        return static

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        shape = ops.shape(inputs)
        length = shape[-2]
        static = self._check_length(length, start_index)
        if positions is not None or segment_ids is not None:
            table = packed_positions(
                self.position_embeddings, positions, segment_ids, start_index, inputs,
                limit=self.max_sequence_length)  # (B, T, D)
            return ops.cast(table, self.compute_dtype)
        positions = ops.arange(length) + start_index  # (T,)
        if static:
            # A gather, not a slice, so that a symbolic length traces.
            table = ops.take(self.position_embeddings, positions, axis=0)  # (T, D)
        else:
            # The length is only known at run time, where no ValueError can be
            # raised. Out-of-range gathers clamp under XLA and raise a raw
            # GatherV2 error on TensorFlow's CPU kernels: gather clamped
            # positions, then make the out-of-range ones NaN so the error
            # shows in the outputs (and a training step on them is skipped).
            valid = (positions >= 0) & (positions < self.max_sequence_length)
            clamped = ops.clip(positions, 0, self.max_sequence_length - 1)
            table = ops.take(self.position_embeddings, clamped, axis=0)  # (T, D)
            table = ops.where(ops.expand_dims(valid, 1), table, float("nan"))
        return ops.broadcast_to(ops.cast(table, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape, positions_shape=None,
                             segment_ids_shape=None):
        # Declared (the torch backend cannot trace a free length), and checked
        # here too so that a too-long static Input fails at construction.
        self._check_length(inputs_shape[-2], 0)
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_sequence_length": self.max_sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


def packed_positions(table, positions, segment_ids, start_index, inputs, limit=None):
    """Rows of `table` `(L, D)` looked up at `positions` `(B, T)` (checked
    by `checked_positions`, against `segment_ids` when given): `(B, T, D)`,
    NaN for the examples whose positions are invalid in a traced graph."""
    if positions is None:
        raise ValueError(
            "Invalid value for argument `segment_ids`: here it only checks "
            "`positions`, which are missing. Received: positions=None"
        )
    if not (isinstance(start_index, numbers.Integral) and start_index == 0):
        raise ValueError(
            "Invalid value for argument `start_index`: packed `positions` "
            f"give every position already. Received: start_index={start_index!r}"
        )
    segment_ids, bad_segments = checked_segment_ids(segment_ids)
    positions, bad_positions = checked_positions(positions, segment_ids, limit=limit)
    check_static_shape("positions", positions, tuple(inputs.shape[:2]), "inputs' (B, T)")
    last = ops.shape(table)[0] - 1
    vectors = ops.take(table, ops.clip(positions, 0, last), axis=0)  # (B, T, D)
    return nan_where(bad_segments, nan_where(bad_positions, vectors))
