"""Learned position embeddings (BERT, ViT)."""

import numbers

import keras
from keras import ops

from keras_attn._checks import check_positive_int


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

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length = shape[-2]
        static = self._check_length(length, start_index)
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

    def compute_output_shape(self, inputs_shape):
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
