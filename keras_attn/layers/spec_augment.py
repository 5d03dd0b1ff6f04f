"""SpecAugment: frequency and time masks on speech features, in training only."""

import keras
from keras import ops
from keras import random

from keras_attn._checks import check_rate
from keras_attn.ops.masking import get_keras_mask


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative integer. Received: {name}={value!r}")
    return value


def _bands(seed_generator, count, max_width, extent, size):
    """`count` random bands per example along an axis of `size` steps.

    `max_width` and `extent` (the valid part of the axis) are (B,) tensors.
    Returns a (B, size) boolean mask, True inside some band.
    """
    batch = ops.shape(extent)[0]
    u_width = random.uniform((batch, count), seed=seed_generator)
    u_start = random.uniform((batch, count), seed=seed_generator)
    max_width = ops.cast(max_width, "float32")[:, None]  # (B, 1)
    extent = ops.cast(extent, "float32")[:, None]
    width = ops.floor(u_width * (max_width + 1.0))  # uniform in 0..max_width
    width = ops.minimum(width, extent)
    start = ops.floor(u_start * (extent - width + 1.0))  # band inside 0..extent
    steps = ops.cast(ops.arange(size), "float32")[None, None, :]  # (1, 1, size)
    inside = (steps >= start[..., None]) & (steps < (start + width)[..., None])  # (B, count, size)
    return ops.any(inside, axis=1)


@keras.saving.register_keras_serializable(package="keras_attn")
class SpecAugment(keras.layers.Layer):
    """Zeroes random frequency bands and time spans of `(B, T, F)` features.

    In training, `freq_mask_count` bands of width uniform in
    `0..freq_mask_width` bins, and `time_mask_count` spans of width uniform in
    `0..min(time_mask_width, time_mask_ratio * length)` frames (adaptive time
    masks: proportional to each utterance's own length, never reaching into
    its padding), are set to `mask_value`. At inference the layer is the
    identity. Place it after per-utterance normalisation so that 0 is the mean.

    Args:
        freq_mask_count: number of frequency masks (2 in the LibriSpeech
            policies).
        freq_mask_width: largest frequency-mask width F (27).
        time_mask_count: number of time masks (10 for the Conformer's
            adaptive policy).
        time_mask_ratio: largest time-mask width as a fraction of the
            utterance length (0.05).
        time_mask_width: an absolute cap on the time-mask width (None: none).
        mask_value: the value written into masked cells.
        seed: seed of the mask positions.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, F)`.
        padding_mask: `(B, T)`; defaults to the implicit Keras mask; without
            one every frame counts as valid.
        training: masks are applied only when True.

    Example:

    >>> import numpy as np
    >>> x = np.ones((2, 50, 20), "float32")
    >>> bool(np.array_equal(np.asarray(SpecAugment()(x)), x))
    True

    References:
        Park et al., "SpecAugment", 2019; Park et al., "SpecAugment on Large
        Scale Datasets", 2020 (adaptive time masks).
    """

    def __init__(
        self,
        freq_mask_count=2,
        freq_mask_width=27,
        time_mask_count=10,
        time_mask_ratio=0.05,
        time_mask_width=None,
        mask_value=0.0,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.freq_mask_count = _check_count("freq_mask_count", freq_mask_count)
        self.freq_mask_width = _check_count("freq_mask_width", freq_mask_width)
        self.time_mask_count = _check_count("time_mask_count", time_mask_count)
        self.time_mask_ratio = check_rate("time_mask_ratio", time_mask_ratio)
        if time_mask_width is not None:
            _check_count("time_mask_width", time_mask_width)
        self.time_mask_width = time_mask_width
        self.mask_value = float(mask_value)
        self.seed = seed
        self.seed_generator = random.SeedGenerator(seed)
        self.supports_masking = True

    def call(self, inputs, padding_mask=None, training=None):
        if not training:
            return inputs
        bins = inputs.shape[-1]
        if bins is not None and self.freq_mask_count and self.freq_mask_width > bins:
            # Checked when masks are drawn (inference is the identity).
            raise ValueError(
                "A frequency mask cannot be wider than the features: "
                f"`freq_mask_width` must be at most {bins} (the input's bins). "
                f"Received: freq_mask_width={self.freq_mask_width}"
            )
        if padding_mask is None:
            padding_mask = get_keras_mask(inputs)
        shape = ops.shape(inputs)
        batch, steps, bins = shape[0], shape[1], shape[2]
        if padding_mask is None:
            lengths = ops.full((batch,), steps, dtype="int32")
        else:
            lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)
        masked = ops.zeros((batch, steps, bins), dtype="bool")
        if self.freq_mask_count and self.freq_mask_width:
            freq = _bands(
                self.seed_generator,
                self.freq_mask_count,
                ops.full((batch,), self.freq_mask_width, dtype="int32"),
                ops.full((batch,), bins, dtype="int32"),
                bins,
            )  # (B, F)
            masked = masked | freq[:, None, :]
        if self.time_mask_count and self.time_mask_ratio > 0:
            max_width = ops.floor(ops.cast(lengths, "float32") * self.time_mask_ratio)
            if self.time_mask_width is not None:
                max_width = ops.minimum(max_width, float(self.time_mask_width))
            time = _bands(self.seed_generator, self.time_mask_count, max_width, lengths, steps)
            masked = masked | time[:, :, None]
        fill = ops.cast(self.mask_value, inputs.dtype)
        return ops.where(masked, fill, inputs)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "freq_mask_count": self.freq_mask_count,
                "freq_mask_width": self.freq_mask_width,
                "time_mask_count": self.time_mask_count,
                "time_mask_ratio": self.time_mask_ratio,
                "time_mask_width": self.time_mask_width,
                "mask_value": self.mask_value,
                "seed": self.seed,
            }
        )
        return config
