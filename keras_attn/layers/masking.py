"""Small mask helpers. Masks are boolean, True = attend.

Shape legend: B batch, T query length, S key length.
"""

import numbers

from keras import ops

from keras_attn._guard import check_mask
from keras_attn._guard import concrete_value
from keras_attn._keras_compat import get_keras_mask as _get_keras_mask
from keras_attn._keras_compat import set_keras_mask as _set_keras_mask


def get_keras_mask(x):
    """The implicit Keras mask carried by `x` (e.g. from `Embedding(mask_zero=True)`), or None."""
    if x is None:
        return None
    return _get_keras_mask(x)


def set_keras_mask(x, mask):
    """Attaches (or with None, removes) the implicit Keras mask of `x`."""
    if x is not None:
        _set_keras_mask(x, mask)


def causal_mask(query_length, key_length, offset=0):
    """Lower-triangular `(T, S)` mask: query `i` sees keys `j <= i + offset`.

    `offset` is the absolute position of the first query, as in cached
    decoding where one new token at position `offset` attends to the `offset`
    tokens before it and to itself. It may be a tensor.

    >>> ops.convert_to_numpy(causal_mask(2, 3, offset=1)).tolist()
    [[True, True, False], [True, True, True]]
    """
    for name, value in (("query_length", query_length), ("key_length", key_length)):
        # A Python int is checked here; a tensor (a traced length) is not.
        if isinstance(value, numbers.Integral) and (isinstance(value, bool) or value < 0):
            raise ValueError(
                f"`{name}` must be a non-negative integer. Received: {name}={value!r}"
            )
    rows = ops.expand_dims(ops.arange(query_length), 1) + offset  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)  # (1, S)
    return cols <= rows


def checked_mask(mask, name):
    """`mask` as booleans, and the examples for which it is invalid.

    A boolean mask passes as it is. A numeric one must hold only 0 and 1: a
    0.5 or a 2 would otherwise be read as True. Where its values exist now
    (an eager call), another value is a `ValueError` naming `name`. Inside a
    traced graph (`fit` on a `tf.data` pipeline, a SavedModel, an ONNX or
    LiteRT model), where nothing can raise, `invalid` is True for each example
    (`(B,)`; a scalar for a `(T, S)` mask, which every example shares) whose
    mask holds another value, and the caller makes that example's output NaN
    (`nan_where`): never the answer of a mask of ones.

    Returns:
        `(mask, invalid)`: the boolean mask (None for None) and `invalid`
        (None when nothing can be invalid).
    """
    if mask is None:
        return None, None
    if str(getattr(mask, "dtype", "")) == "bool":
        return mask, None
    values = concrete_value(mask)
    if values is not None:
        check_mask(name, values)
        return ops.convert_to_tensor(values != 0), None
    mask = ops.convert_to_tensor(mask)
    wrong = ops.logical_and(ops.not_equal(mask, 0), ops.not_equal(mask, 1))
    rank = len(mask.shape)
    invalid = ops.any(wrong) if rank < 3 and name == "attention_mask" else ops.any(
        wrong, axis=tuple(range(1, rank)))
    return ops.not_equal(mask, 0), invalid


def nan_where(invalid, x):
    """`x` `(B, ...)` with the examples where `invalid` (`(B,)` or a scalar)
    is True replaced by NaN."""
    if invalid is None:
        return x
    invalid = ops.reshape(invalid, (-1,) + (1,) * (len(x.shape) - 1)) if len(
        invalid.shape) else invalid
    return ops.where(invalid, ops.cast(float("nan"), x.dtype), x)


def merge_masks(*masks):
    """Logical AND of the given masks (None entries are skipped); None if all are None."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged
