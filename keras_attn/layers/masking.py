"""Small mask helpers. Masks are boolean, True = attend.

Shape legend: B batch, T query length, S key length.
"""

import numbers

from keras import ops

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


def merge_masks(*masks):
    """Logical AND of the given masks (None entries are skipped); None if all are None."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged
