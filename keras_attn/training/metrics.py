"""Metrics over tokens: accuracy over non-padding positions, and perplexity."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedTokenAccuracy(keras.metrics.Metric):
    """Share of non-padding tokens whose arg-max prediction is the label,
    accumulated over batches (a token mean, not a mean of batch means).

    Args:
        pad_id: label id that marks padding.
        name: metric name.
        dtype: metric dtype.

    Example:

    >>> import numpy as np
    >>> metric = MaskedTokenAccuracy(pad_id=0)
    >>> logits = np.eye(3)[[[1, 2, 0]]]  # predicts 1, 2, 0
    >>> metric.update_state(np.array([[1, 1, 0]]), logits)
    >>> float(metric.result())  # 1 right of 2 real tokens
    0.5
    """

    def __init__(self, pad_id=0, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int):
            raise ValueError(f"`pad_id` must be an integer. Received: pad_id={pad_id!r}")
        self.pad_id = pad_id
        self.correct = self.add_variable((), initializer="zeros", name="correct")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")  # (B, T)
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")  # (B, T)
        weight = ops.cast(ops.not_equal(labels, self.pad_id), "float32")
        if sample_weight is not None:
            weight = weight * ops.cast(sample_weight, "float32")
        hits = ops.cast(ops.equal(labels, predicted), "float32") * weight
        self.correct.assign_add(ops.cast(ops.sum(hits), self.dtype))
        self.count.assign_add(ops.cast(ops.sum(weight), self.dtype))

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_attn")
class Perplexity(keras.metrics.Metric):
    """`exp` of the (sample-weighted) mean cross-entropy of integer targets
    under logits: the masked-LM perplexity when the weights mark the real
    predictions. Equals `keras_hub.metrics.Perplexity(from_logits=True)`,
    written here because keras_hub imports TensorFlow and this module must
    run on every backend without it.
    """

    def __init__(self, name="perplexity", dtype="float32", **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.cast(y_pred, "float32")
        loss = keras.losses.sparse_categorical_crossentropy(
            y_true, y_pred, from_logits=True
        )  # (B, ...)
        weight = (
            ops.ones_like(loss)
            if sample_weight is None
            else ops.broadcast_to(ops.cast(sample_weight, "float32"), ops.shape(loss))
        )
        self.total.assign_add(ops.sum(loss * weight))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.exp(ops.divide_no_nan(self.total, self.count))

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)
