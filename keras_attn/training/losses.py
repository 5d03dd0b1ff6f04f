"""Label-smoothed cross-entropy over token sequences, padding ignored."""

import keras
from keras import ops

from keras_attn._checks import check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against `(1 - eps) * one_hot(y) + eps / V`, averaged
    over the non-padding tokens of the batch.

    The smoothed target is the Keras convention
    (`CategoricalCrossentropy(label_smoothing=eps)`): `eps` spread uniformly
    over all `V` classes, the true one included. Per token the loss is
    `(1 - eps) * (-log p_y) + eps * mean_v(-log p_v)`. Tokens whose label is
    `pad_id` add nothing; with the default reduction the result is the mean
    over the real tokens (not over `B * T`), so batches with more padding are
    not down-weighted. Log-probabilities are computed in float32.

    Args:
        label_smoothing: eps, 0.1 in the Transformer paper (section 5.4).
        pad_id: label id that marks padding.
        from_logits: whether `y_pred` are logits (True) or probabilities.
        reduction: as for any Keras loss. `"sum_over_batch_size"` (default)
            gives the mean over non-padding tokens, `"sum"` their sum,
            `"none"` the per-token losses (0 at padding).
        name: loss name.
        dtype: loss dtype.

    Call arguments:
        y_true: `(B, T)` integer labels.
        y_pred: `(B, T, V)` logits or probabilities.

    Example:

    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.0, pad_id=0)
    >>> logits = np.log(np.array([[[0.5, 0.25, 0.25], [1/3, 1/3, 1/3]]]))
    >>> round(float(loss(np.array([[1, 0]]), logits)), 4)  # only -log 0.25
    1.3863
    """

    def __init__(
        self,
        label_smoothing=0.1,
        pad_id=0,
        from_logits=True,
        reduction="sum_over_batch_size",
        name="label_smoothed_cross_entropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.label_smoothing = check_rate("label_smoothing", label_smoothing)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int):
            raise ValueError(f"`pad_id` must be an integer. Received: pad_id={pad_id!r}")
        self.pad_id = pad_id
        self.from_logits = bool(from_logits)

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")  # (B, T)
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)  # (B, T, V)
        else:
            log_probs = ops.log(ops.clip(y_pred, 1e-7, 1.0))
        vocabulary = ops.shape(log_probs)[-1]
        true_log_prob = ops.sum(
            log_probs * ops.one_hot(labels, vocabulary, dtype=log_probs.dtype), axis=-1
        )  # (B, T)
        eps = self.label_smoothing
        losses = -(1.0 - eps) * true_log_prob - eps * ops.mean(log_probs, axis=-1)
        mask = ops.cast(ops.not_equal(labels, self.pad_id), losses.dtype)
        losses = losses * mask
        if self.reduction in ("sum_over_batch_size", "mean"):
            # Keras divides the sum by B * T; rescale so that it divides by
            # the number of real tokens instead.
            total = ops.cast(ops.size(mask), losses.dtype)
            losses = losses * (total / ops.maximum(ops.sum(mask), 1.0))
        return losses

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id,
                "from_logits": self.from_logits,
            }
        )
        return config
