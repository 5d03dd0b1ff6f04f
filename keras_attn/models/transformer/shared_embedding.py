"""A token embedding that is also the pre-softmax projection."""

import keras
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class SharedEmbedding(SpecFromCall, keras.layers.Layer):
    """Token embedding `E (V, D)` whose transpose gives the output logits.

    `call(ids)` returns `E[ids] * sqrt(D)` when `scale_by_sqrt_dim` (the
    Transformer multiplies its embeddings by `sqrt(d_model)`, section 3.4);
    `call(x, reverse=True)` returns the logits `x E^T`, the pre-softmax linear
    transformation tied to the embedding.

    Args:
        vocabulary_size: V.
        hidden_dim: D.
        scale_by_sqrt_dim: multiply the looked-up vectors by `sqrt(D)`.
        embeddings_initializer: initializer of `E`.
        output_bias: add a learned `(V,)` bias (zeros at first) to the
            logits of `reverse=True` (Marian's `final_logits_bias`).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: integer ids `(B, T)`, or with `reverse=True` vectors `(B, T, D)`.
        reverse: project vectors to vocabulary logits instead.

    Returns:
        `(B, T, D)` embeddings, or `(B, T, V)` logits with `reverse=True`.

    Example:

    >>> import numpy as np
    >>> layer = SharedEmbedding(vocabulary_size=10, hidden_dim=4)
    >>> x = layer(np.array([[1, 2, 3]]))
    >>> tuple(x.shape), tuple(layer(x, reverse=True).shape)
    ((1, 3, 4), (1, 3, 10))

    Why not `keras.layers.ReversibleEmbedding` (which BERT uses): Keras's
    layer has no `sqrt(D)` scaling, and a lookup of an id outside `[0, V)`
    returns a clamped row on XLA and GPUs, a silent wrong answer; here such an
    id gives a NaN vector, which the step guard turns into a skipped step.
    Its weight path (`.../embeddings`) is the same, but saved files name this
    class, so it stays.

    References:
        Press and Wolf, "Using the Output Embedding to Improve Language
        Models", 2017; Vaswani et al., 2017, section 3.4.
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        scale_by_sqrt_dim=True,
        embeddings_initializer="uniform",
        output_bias=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.output_bias = bool(output_bias)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.scale_by_sqrt_dim = bool(scale_by_sqrt_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.hidden_dim),
            initializer=self.embeddings_initializer,
            trainable=True,
        )
        if self.output_bias:
            self.logits_bias = self.add_weight(
                name="logits_bias", shape=(self.vocabulary_size,), initializer="zeros"
            )
        self.built = True

    def compute_output_shape(self, inputs_shape, reverse=False):
        """`(B, T, D)` vectors of `(B, T)` ids; with `reverse`, `(B, T, V)`
        logits of `(B, T, D)` vectors."""
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)
        return tuple(inputs_shape) + (self.hidden_dim,)

    def call(self, inputs, reverse=False):
        table = ops.cast(self.embeddings, self.compute_dtype)
        if reverse:
            logits = ops.matmul(inputs, ops.transpose(table))  # (B, T, V)
            if self.output_bias:
                logits = logits + ops.cast(self.logits_bias, self.compute_dtype)
            return logits
        ids = ops.cast(inputs, "int32")
        # An id outside the table gives a NaN vector, never the clamped row
        # that XLA's gather (and a GPU's) returns silently; TF on CPU raises.
        valid = ops.logical_and(ids >= 0, ids < self.vocabulary_size)  # (B, T)
        vectors = ops.take(table, ops.where(valid, ids, 0), axis=0)  # (B, T, D)
        vectors = ops.where(ops.expand_dims(valid, -1), vectors, ops.cast(float("nan"), vectors.dtype))
        if self.scale_by_sqrt_dim:
            vectors = vectors * ops.cast(self.hidden_dim**0.5, self.compute_dtype)
        return vectors

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "scale_by_sqrt_dim": self.scale_by_sqrt_dim,
                "output_bias": self.output_bias,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
