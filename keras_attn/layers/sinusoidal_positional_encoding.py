"""Sinusoidal positional encoding of "Attention Is All You Need"."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_float
from keras_attn.layers.position_embedding import packed_positions


def _check_depth(depth):
    if (
        isinstance(depth, bool)
        or not isinstance(depth, numbers.Integral)
        or depth <= 0
        or depth % 2
    ):
        raise ValueError(
            "The sinusoidal encoding needs a positive, even depth (sin and cos "
            f"pairs). Received: depth={depth!r}"
        )


LAYOUTS = ("interleaved", "concatenated")


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}")
    return layout


def _arrange(sin, cos, layout, stack, concatenate, reshape, length, depth):
    """[sin_0, cos_0, sin_1, cos_1, ...] (the paper's tensor2tensor code) or
    [sin_0, sin_1, ..., cos_0, cos_1, ...] (fairseq and Marian)."""
    if layout == "concatenated":
        return concatenate([sin, cos], axis=-1)  # (T, D)
    return reshape(stack([sin, cos], axis=-1), (length, depth))  # (T, D/2, 2) -> (T, D)


def sinusoidal_positional_encoding(
    length, depth, max_wavelength=10000.0, start_index=0, dtype="float32",
    layout="interleaved",
):
    """The `(length, depth)` table of the paper, sin and cos interleaved
    (`layout="concatenated"`: all sines, then all cosines, with the same
    frequencies, as Marian and fairseq lay them out).

    `PE[pos, 2k] = sin(pos / max_wavelength^(2k / depth))` and
    `PE[pos, 2k + 1] = cos(pos / max_wavelength^(2k / depth))` for
    `pos = start_index, ..., start_index + length - 1`. With a static length
    and start (eager calls, compiled functions of known shape) the table is
    computed in float64 and matches the formula to 1e-7 at any position;
    with a traced length or start it is computed in float32 ops (angle error
    about 1e-7 x position). Cast to `dtype` last (float16 cannot even hold
    positions past 2048).

    >>> table = sinusoidal_positional_encoding(3, 4)
    >>> [round(float(v), 4) for v in table[1]]
    [0.8415, 0.5403, 0.01, 0.9999]
    """
    _check_depth(depth)
    # `length` may be a tensor (a dynamic sequence length); check it when static.
    if isinstance(length, numbers.Integral) and length < 0:
        raise ValueError(
            f"`length` must be a non-negative integer. Received: length={length!r}"
        )
    max_wavelength = check_positive_float("max_wavelength", max_wavelength)
    _check_layout(layout)
    if isinstance(length, numbers.Integral) and isinstance(start_index, numbers.Integral):
        # Static positions: build the table in float64 NumPy. In float32 the
        # angle `pos * freq` alone is off by up to 1e-4 at position 1000.
        positions = np.arange(start_index, start_index + length, dtype="float64")
        inverse_freq = max_wavelength ** (-2.0 * np.arange(depth // 2) / depth)
        angles = positions[:, None] * inverse_freq[None, :]  # (T, D/2)
        table = _arrange(np.sin(angles), np.cos(angles), layout, np.stack, np.concatenate,
                         np.reshape, length, depth).astype("float32")
        return ops.cast(ops.convert_to_tensor(table), dtype)
    # Dynamic length or start (a traced shape, a decoding step): float32 ops.
    positions = ops.cast(ops.arange(length) + start_index, "float32")  # (T,)
    pair = ops.cast(ops.arange(depth // 2), "float32")  # (D/2,) = k
    inverse_freq = ops.power(max_wavelength, -2.0 * pair / depth)  # (D/2,)
    angles = ops.expand_dims(positions, 1) * ops.expand_dims(inverse_freq, 0)  # (T, D/2)
    table = _arrange(ops.sin(angles), ops.cos(angles), layout, ops.stack, ops.concatenate,
                     ops.reshape, -1, depth)
    return ops.cast(table, dtype)


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionalEncoding(keras.layers.Layer):
    """Fixed sinusoidal position vectors for a `(B, T, D)` input.

    Returns the encoding broadcast to the input's shape, for the caller to add
    (the keras-hub convention, so the embedding scale stays in the caller's
    hands: the Transformer adds it to `embedding * sqrt(D)`). Any length; no
    trained weights.

    Args:
        max_wavelength: the base of the geometric wavelength progression,
            10000 in the paper.
        layout: `"interleaved"` (the paper's code: sin and cos of each
            frequency side by side) or `"concatenated"` (all sines, then all
            cosines: Marian / opus-mt, fairseq).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)` with an even `D`.
        start_index: position of the first step (int or scalar tensor), for
            cached decoding one step at a time.
        positions: optional `(B, T)` integer positions of a packed row,
            restarting at 0 with each example (`keras_attn.data.packing`):
            each example gets the encoding it gets alone (the same float64
            table, gathered). Checked as in `PositionEmbedding`.
        segment_ids: optional `(B, T)` segment ids beside `positions`: then
            each position must be 0 exactly where a segment starts.

    Returns:
        `(B, T, D)` in the layer's compute dtype.

    Example:

    >>> import numpy as np
    >>> x = np.zeros((2, 5, 8), "float32")
    >>> tuple(SinusoidalPositionalEncoding()(x).shape)
    (2, 5, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.5.
    """

    def __init__(self, max_wavelength=10000.0, layout="interleaved", **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_float("max_wavelength", max_wavelength)
        self.layout = _check_layout(layout)
        self.supports_masking = True

    def build(self, inputs_shape):
        depth = inputs_shape[-1]
        _check_depth(depth)
        self.built = True

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        shape = ops.shape(inputs)
        packed = positions is not None or segment_ids is not None
        table = sinusoidal_positional_encoding(
            shape[-2],
            shape[-1],
            max_wavelength=self.max_wavelength,
            start_index=0 if packed else start_index,
            dtype=self.compute_dtype,
            layout=self.layout,
        )  # (T, D)
        if packed:
            # A valid packing has positions below T: the row's own table.
            return packed_positions(table, positions, segment_ids, start_index, inputs)
        return ops.broadcast_to(table, shape)

    def compute_output_shape(self, inputs_shape, positions_shape=None, segment_ids_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self.max_wavelength
        if self.layout != "interleaved":  # files of the interleaved layer stay as they were
            config["layout"] = self.layout
        return config
