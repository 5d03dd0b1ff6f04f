"""Chunked attention masks and the checks shared by the layers' streaming paths.

A streamed encoder sees its input one chunk at a time. Frame `t` of chunk
`c = t // chunk_size` attends to the frames of its own chunk and to the
`left_context` frames before the chunk's first frame (no look-ahead past the
chunk): the mask below, used offline, gives the streamed answer exactly
(Zhang et al., "Unified Streaming and Non-streaming Two-pass End-to-end
Model for Speech Recognition", 2020, section 2.3; Noroozi et al., "Stateful
Conformer with Cache-based Inference for Streaming Automatic Speech
Recognition", 2023).
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn._guard import concrete_value


def check_left_context(left_context):
    """`left_context` as a non-negative int, else a ValueError naming it."""
    if (isinstance(left_context, bool) or not isinstance(left_context, numbers.Integral)
            or left_context < 0):
        raise ValueError(
            "`left_context` must be a non-negative integer (frames before the "
            f"chunk's start). Received: left_context={left_context!r}"
        )
    return int(left_context)


def chunk_attention_mask(length, chunk_size, left_context):
    """The `(T, T)` boolean mask of chunked self-attention, True = attend.

    Query `t` attends to key `s` when `s` is in `t`'s chunk or in the
    `left_context` frames before that chunk's start:
    `(t // C) * C - left_context <= s < (t // C + 1) * C`.

    >>> import numpy as np
    >>> np.asarray(chunk_attention_mask(5, 2, 1)).astype(int).tolist()
    [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 1, 0], [0, 0, 0, 1, 1]]
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    left_context = check_left_context(left_context)
    return chunk_mask_of(length, chunk_size, left_context)


def chunk_mask_of(length, chunk_size, left_context):
    """`chunk_attention_mask` without the checks: `chunk_size` may be a
    tensor (a size drawn per batch in dynamic chunk training)."""
    frames = ops.arange(length)
    start = (frames // chunk_size) * chunk_size  # (T,): first frame of each chunk
    queries, keys = ops.expand_dims(start, 1), ops.expand_dims(frames, 0)
    return ops.logical_and(ops.greater_equal(keys, queries - left_context),
                           ops.less(keys, queries + chunk_size))


def check_state_tensor(name, value, shape, dtype):
    """A state entry `value` of the given static `shape` (None = any) and
    `dtype`, else a ValueError naming the entry and what it holds."""
    got_shape = tuple(value.shape) if hasattr(value, "shape") else None
    try:
        got_dtype = keras.backend.standardize_dtype(value.dtype)
    except (AttributeError, ValueError):
        got_dtype = type(value).__name__
    same_shape = got_shape is not None and len(got_shape) == len(shape) and all(
        want is None or got == want for got, want in zip(got_shape, shape))
    if not same_shape or got_dtype != dtype:
        raise ValueError(
            f"Invalid value for argument `state`: entry {name!r} must be {dtype} of "
            f"shape {tuple(shape)} (None = any). Received: state[{name!r}] of "
            f"shape {got_shape} and dtype {got_dtype}"
        )


def check_counter(name, value, unit, low=0):
    """A state counter `value` (a count of `unit`) at least `low`, else a
    ValueError naming the entry and its values; nothing where the values do
    not exist now (a traced graph)."""
    values = concrete_value(value)
    if values is not None and (np.asarray(values) < low).any():
        what = "negative" if low == 0 else f"below {low}"
        raise ValueError(
            f"Invalid value for argument `state`: entry {name!r} counts {unit}: it "
            f"cannot be {what}. Received: state[{name!r}]={np.asarray(values).tolist()}"
        )


def check_audio_range(name, values):
    """A ValueError naming `name` and its first sample outside [-1, 1]:
    int16-range audio given as floats (x 32768) would stream other features
    silently. `values` a NumPy array, finite."""
    outside = np.abs(values) > 1.0
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"Invalid value for argument `{name}`: audio samples must lie in [-1, 1] "
            "(16-bit PCM: divide by 32768). Received: "
            f"{name}[{', '.join(map(str, index))}]={float(values[index])!r}"
        )


def check_built(layer):
    """A ValueError when `layer` has not been built: its state's shapes come
    from its weights."""
    if not layer.built:
        raise ValueError(
            f"Invalid value for argument `layer`: {layer.name} must be built (called "
            "once, or `build(input_shape)`) before its streaming state exists. "
            f"Received: {layer.name} with built=False"
        )
