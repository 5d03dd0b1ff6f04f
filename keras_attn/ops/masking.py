"""Small mask helpers. Masks are boolean, True = attend.

Shape legend: B batch, T query length, S key length.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_static_shape
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


def local_mask(query_length, key_length, window, offset=0):
    """Banded `(T, S)` mask of local (sliding-window) attention: query `i`
    (at position `i + offset`) sees keys `j` with `|i + offset - j| <=
    window // 2`, as ModernBERT's `local_attention` window (128: 64 tokens on
    each side).

    >>> ops.convert_to_numpy(local_mask(4, 4, 2)).astype(int).tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    rows = ops.expand_dims(ops.arange(query_length), 1) + offset  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)  # (1, S)
    return ops.abs(rows - cols) <= window // 2


def checked_mask(mask, name, pairwise=False):
    """`mask` as booleans, and the examples for which it is invalid.

    A boolean mask passes as it is. A numeric one must hold only 0 and 1: a
    0.5 or a 2 would otherwise be read as True. Where its values exist now
    (an eager call), another value is a `ValueError` naming `name`. Inside a
    traced graph (`fit` on a `tf.data` pipeline, a SavedModel, an ONNX or
    LiteRT model), where nothing can raise, `invalid` is True for each example
    (`(B,)`, or `(1,)` for a mask that broadcasts over the batch; a scalar
    for a `pairwise` mask of rank 2, `(T, S)`, which every example shares)
    whose mask holds another value, and the caller makes that example's
    output NaN (`nan_where`): never the answer of a mask of ones.

    `pairwise`: the mask is `(T, S)`, `(B, T, S)` or `(B|1, N|1, T, S)` (an
    attention mask), not a padding mask `(B, L)`.

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
    invalid = ops.any(wrong) if rank < 3 and pairwise else ops.any(
        wrong, axis=tuple(range(1, rank)))
    return ops.not_equal(mask, 0), invalid


def nan_where(invalid, x):
    """`x` `(B, ...)` with the examples where `invalid` (`(B,)` or a scalar)
    is True replaced by NaN.

    The NaN is a Python float (`where` gives it `x`'s dtype on every
    backend), never a tensor made here: called on a functional model's
    symbolic tensors (the BERT and ModernBERT backbones' empty rows), a
    tensor made here would be a constant held by the graph, which the
    TensorFlow trace captures and tf2onnx then turned into an extra ONNX
    input (`.../SelectV2/t:0`) that the export's contract does not name."""
    if invalid is None:
        return x
    invalid = ops.reshape(invalid, (-1,) + (1,) * (len(x.shape) - 1)) if len(
        invalid.shape) else invalid
    return ops.where(invalid, float("nan"), x)


def merge_masks(*masks):
    """Logical AND of the given masks (None entries are skipped); None if all are None."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


# === Packed rows: segment ids and restarted positions ===
#
# A packed row holds k examples: `segment_ids` (B, T) is 1 on the first
# example's tokens, 2 on the second's, ..., k, then 0 on the padding to the
# row's end, and `positions` restart at 0 at each example's first token.

SEGMENT_RULE = (
    "a row holds segments 1, 2, ..., k, each contiguous and in that order, "
    "then padding (0) to its end"
)
POSITION_RULE = "positions restart at 0 at each segment's first token and count up by 1"


INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def integer_ids(name, ids, what):
    """`ids` as an int32 `(B, T)` tensor; a `ValueError` for another dtype or
    rank (both are known while tracing, so this raises in a graph too).

    Wider ids are checked before the cast, which would wrap them (2**32 + 2
    becomes 2, a valid id): outside int32, a `ValueError` naming the first
    such id where the values exist now (read before `convert_to_tensor`:
    JAX without x64 casts an int64 array to int32 itself); in a graph, -1,
    which every rule of this module (`SEGMENT_RULE`, `POSITION_RULE`, the
    Conformer's utterance ids) refuses, so the caller's check makes the
    example NaN."""
    values = concrete_value(ids)
    ids = ops.convert_to_tensor(ids if values is None else values)
    dtype = keras.backend.standardize_dtype(ids.dtype if values is None else values.dtype)
    if "int" not in dtype:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must hold integer ids "
            f"({what}). Received: {name}.dtype={dtype}"
        )
    if len(ids.shape) != 2:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must have rank 2, (B, T). "
            f"Received: {name}.shape={tuple(ids.shape)}"
        )
    if dtype in ("int64", "uint32", "uint64"):
        if values is not None:
            outside = (values < INT32_MIN) | (values > INT32_MAX)
            if outside.any():
                row, step = (int(i) for i in np.argwhere(outside)[0])
                raise ValueError(
                    f"Invalid value for argument `{name}`: ids must fit in int32 "
                    f"({INT32_MIN} to {INT32_MAX}; {what}). Received: "
                    f"{name}[{row}, {step}]={int(values[row, step])}"
                )
        elif keras.backend.standardize_dtype(ids.dtype) == dtype:  # still wide in the graph
            outside = ops.logical_or(ids < INT32_MIN, ids > INT32_MAX)
            ids = ops.where(outside, ops.cast(-1, dtype), ids)
    return ops.cast(ids, "int32")


def _shifted(x, first):
    """`x` (B, T) moved one step right, with `first` at step 0: each token's
    predecessor."""
    # zeros_like + first, not full_like(x, first): PyTorch's `full_like` reads
    # a scalar back with `.item()`, which fails on the "meta" tensors Keras
    # traces a model with before `fit`.
    return ops.concatenate([ops.zeros_like(x[:, :1]) + first, x[:, :-1]], axis=1)


def _verdict(bad, name, rule, values):
    """Per-example invalidity of a `(B, T)` table of broken steps `bad`.

    Where its values exist (an eager call) a broken step is a `ValueError`
    naming `name` and the row that breaks `rule`, and nothing is invalid
    after it (None); inside a traced graph `(B,)`, True for each example to
    turn into NaN (`nan_where`)."""
    found = concrete_value(bad)
    if found is None:
        return ops.any(bad, axis=1)
    if found.any():
        row, step = (int(i) for i in np.argwhere(found)[0])
        row_values = np.asarray(concrete_value(values))[row]
        lo, hi = max(0, step - 6), min(step + 6, row_values.shape[-1])
        raise ValueError(
            f"Invalid value for argument `{name}`: {rule}; row {row} breaks it "
            f"at step {step}. Received: {name}[{row}, {lo}:{hi}]="
            f"{row_values[lo:hi].tolist()}"
        )
    return None


def checked_segment_ids(segment_ids, name="segment_ids"):
    """`segment_ids` `(B, T)` as int32, and the examples for which it is not
    a packing (see `SEGMENT_RULE`).

    An id that goes back to an earlier one, skips one, or a real token after
    padding breaks the rule: a `ValueError` naming `name` where the values
    exist now, `invalid` (`(B,)`) inside a traced graph, for the caller to
    make those examples NaN (`nan_where`), as `checked_mask` does. A float
    or boolean dtype is always a `ValueError`.

    Returns:
        `(segment_ids, invalid)`; both None for None, `invalid` None when
        the values were checked here.
    """
    if segment_ids is None:
        return None, None
    segment_ids = integer_ids(name, segment_ids, SEGMENT_RULE)
    previous = _shifted(segment_ids, 0)
    first = ops.expand_dims(ops.arange(ops.shape(segment_ids)[1]) == 0, 0)  # (1, T)
    # Allowed steps a -> b: stay (b == a); end the row (a > 0, b == 0); next
    # segment (b == a + 1, after a segment or at the first token).
    ok = ops.logical_or(
        ops.equal(segment_ids, previous),
        ops.logical_and(
            ops.logical_or(previous > 0, first),
            ops.logical_or(ops.equal(segment_ids, previous + 1), ops.equal(segment_ids, 0)),
        ),
    )
    return segment_ids, _verdict(ops.logical_not(ok), name, SEGMENT_RULE, segment_ids)


def checked_positions(positions, segment_ids=None, limit=None, name="positions"):
    """`positions` `(B, T)` as int32, and the examples for which they do not
    restart at 0 with each example (see `POSITION_RULE`).

    With `segment_ids` (already checked, int32) a position must be 0 exactly
    where a segment starts and count up by 1 inside it (padding positions
    are free); without, each position is 0 or its predecessor plus 1. With
    `limit`, a position at or past it (the table's size) is invalid too.
    Errors as in `checked_segment_ids`.
    """
    if positions is None:
        return None, None
    positions = integer_ids(name, positions, POSITION_RULE)
    counts_on = ops.equal(positions, _shifted(positions, -1) + 1)
    restarts = ops.equal(positions, 0)
    if segment_ids is None:
        ok = ops.logical_or(restarts, counts_on)
    else:
        check_static_shape(name, positions, tuple(segment_ids.shape), "segment_ids' (B, T)")
        starts = ops.not_equal(segment_ids, _shifted(segment_ids, -1))
        ok = ops.logical_or(
            ops.equal(segment_ids, 0), ops.where(starts, restarts, counts_on)
        )
    if limit is not None:
        ok = ops.logical_and(ok, positions < limit)
    rule = POSITION_RULE if limit is None else f"{POSITION_RULE}, below {limit}"
    return positions, _verdict(ops.logical_not(ok), name, rule, positions)


def checked_agreement(mask, segment_ids, mask_name, ids_name):
    """The padding mask `(B, T)` (boolean, already checked) that
    `segment_ids` imply, `segment_ids > 0`, and the examples where a given
    `mask` says otherwise (a token real in one and padding in the other):
    a `ValueError` naming `mask_name` eagerly, `(B,)` invalid in a graph."""
    implied = segment_ids > 0
    if mask is None:
        return implied, None
    check_static_shape(mask_name, mask, tuple(segment_ids.shape), f"{ids_name}' (B, T)")
    rule = f"it must be True exactly where `{ids_name}` > 0 (a real token)"
    return implied, _verdict(ops.not_equal(mask, implied), mask_name, rule, mask)


def agreeing_padding_mask(mask, segment_ids, mask_name, ids_name):
    """A block's `mask` (boolean, already checked) unchanged, once its
    `segment_ids` are checked and found to agree with it, so that an error
    names the block's own arguments. Inside a graph the attention layer's
    checks make a bad example NaN; nothing more is done here."""
    if segment_ids is not None:
        segment_ids, _ = checked_segment_ids(segment_ids, ids_name)
        checked_agreement(mask, segment_ids, mask_name, ids_name)
    return mask


def segment_mask(query_segment_ids, key_segment_ids=None, causal=False):
    """Block-diagonal `(B, T, S)` attention mask of packed rows: query `t`
    sees key `s` when both belong to the same example (the same segment id,
    > 0); padding (0) sees nothing and is seen by nothing. With `causal`,
    also `s <= t` (a decoder; segments are contiguous, so this is causal
    inside each segment). `key_segment_ids` defaults to the query's
    (self-attention); cross-attention pairs each query example with the key
    example of the same id.

    >>> ids = np.array([[1, 1, 2, 0]])
    >>> ops.convert_to_numpy(segment_mask(ids, causal=True))[0].astype(int).tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    """
    if key_segment_ids is None:
        key_segment_ids = query_segment_ids
    query = ops.expand_dims(ops.convert_to_tensor(query_segment_ids), 2)  # (B, T, 1)
    key = ops.expand_dims(ops.convert_to_tensor(key_segment_ids), 1)  # (B, 1, S)
    mask = ops.logical_and(ops.equal(query, key), query > 0)  # (B, T, S)
    if causal:
        t, s = ops.shape(query)[1], ops.shape(key)[2]
        mask = ops.logical_and(mask, ops.expand_dims(causal_mask(t, s), 0))
    return mask
