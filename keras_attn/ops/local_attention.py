"""Local (sliding-window) self-attention at O(T x window) memory (issue 72).

Query `t` sees key `s` when `|t - s| <= window // 2` (ModernBERT's local
layers). Written with a `(T, S)` mask (`masking.local_mask`), the scores and
the mask grow with T^2: 6.6 GB above the model at 8,192 tokens for
ModernBERT-base's four-layer slice, where the band holds 1/32 of them.

`banded_attention` computes the band only. The queries are cut into blocks
of `h = window // 2` positions; block `i` (positions `[i h, (i + 1) h)`) can
see keys only in blocks `i - 1`, `i` and `i + 1`, so each block's queries
meet a window of `3 h` keys: scores `(B, N, T / h, h, 3 h)`, three times the
band, never `(T, S)`. Within that window the band is one constant `(h, 3 h)`
pattern, the same for every block. Padding and packed rows (segment ids) are
gathered into the same windows. Same answer as `scaled_dot_product_attention`
with the merged `(B, N, T, S)` mask (values and gradients, float32 within
rounding): masked keys get probability exactly 0 and a query that sees no key
answers 0.

Shape legend: B batch, T length (queries = keys), N heads, H head dim.
"""

import numpy as np
from keras import ops
from keras import random

from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import static_dim
from keras_attn.ops.attention import MASKED_LOGIT


def _windows(x, block, fill):
    """`x (B, L, ...)` as `(B, L' / block, 3 block, ...)`: for each block of
    `block` positions (L padded to `L'` with `fill`), the block before it,
    itself and the block after it (`fill` beyond the ends)."""
    length = ops.shape(x)[1]
    blocks = (length + block - 1) // block
    tail = blocks * block - length
    widths = [[0, 0], [block, block + tail]] + [[0, 0]] * (len(x.shape) - 2)
    x = ops.pad(x, widths, constant_values=fill)  # (B, L' + 2 block, ...)
    rest = tuple(ops.shape(x)[2:])
    x = ops.reshape(x, (ops.shape(x)[0], blocks + 2, block) + rest)
    return ops.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def _blocks(x, block, fill):
    """`x (B, L, ...)` as `(B, L' / block, block, ...)`, L padded to `L'`."""
    length = ops.shape(x)[1]
    blocks = (length + block - 1) // block
    widths = [[0, 0], [0, blocks * block - length]] + [[0, 0]] * (len(x.shape) - 2)
    x = ops.pad(x, widths, constant_values=fill)
    return ops.reshape(x, (ops.shape(x)[0], blocks, block) + tuple(ops.shape(x)[2:]))


def band_pattern(window):
    """`(h, 3 h)` booleans, `h = max(window // 2, 1)`: which of a block's
    3 h window keys (the block before, itself, the block after) query `r` of
    the block sees.

    >>> band_pattern(2).astype(int).tolist()
    [[1, 1, 1]]
    >>> band_pattern(4).astype(int).tolist()
    [[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]]
    """
    half = window // 2
    block = max(half, 1)
    rows = np.arange(block)[:, None] + block  # the query's place in the window
    cols = np.arange(3 * block)[None, :]
    return np.abs(rows - cols) <= half


def banded_attention(query, key, value, window, query_mask=None, key_mask=None,
                     segment_ids=None, scale=None, dropout=0.0, training=False,
                     seed_generator=None):
    """Local self-attention `softmax(Q K^T * scale + M) V` over the band
    `|t - s| <= window // 2` only (see the module's docstring).

    Args:
        query: `(B, T, N, H)`.
        key: `(B, T, N, H)` (self-attention: as many keys as queries).
        value: `(B, T, N, Hv)`.
        window: span of the band, a positive int (query `t` sees keys
            `s` with `|t - s| <= window // 2`).
        query_mask: optional `(B, T)` booleans, False = padding (answers 0).
        key_mask: optional `(B, T)` booleans, False = a key no query sees.
        segment_ids: optional `(B, T)` ids of packed rows: a query sees only
            keys of its own id, and id 0 (padding) sees and is seen by none.
        scale: multiplier of the logits; defaults to `1 / sqrt(H)`.
        dropout: dropout rate on the probabilities (training only).
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.

    Returns:
        `(B, T, N, Hv)` in the query's dtype.

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(1, 10, 2, 4)).astype("float32") for _ in range(3))
    >>> from keras_attn.ops.attention import scaled_dot_product_attention
    >>> from keras_attn.ops.masking import local_mask
    >>> full = scaled_dot_product_attention(q, k, v, mask=local_mask(10, 10, 4))
    >>> band = banded_attention(q, k, v, 4)
    >>> bool(np.allclose(ops.convert_to_numpy(band), ops.convert_to_numpy(full), atol=1e-6))
    True
    """
    window = check_positive_int("window", window)
    dropout = check_rate("dropout", dropout)
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    for name, tensor in (("key", key), ("value", value)):
        if len(tensor.shape) != 4:
            raise ValueError(f"`{name}` must be (B, T, N, H). Received: shape {tensor.shape}")
    t, s = static_dim(query.shape[1]), static_dim(key.shape[1])
    if len(query.shape) != 4 or (t is not None and s is not None and t != s):
        raise ValueError(
            "`banded_attention` is self-attention: `query` (B, T, N, H) and `key` of the "
            f"same length. Received: query {query.shape}, key {key.shape}")
    if scale is None:
        scale = 1.0 / float(np.sqrt(static_dim(query.shape[-1]) or ops.shape(query)[-1]))
    block = max(window // 2, 1)
    length = ops.shape(query)[1]

    # Which window keys each query sees: (B, nb, h, 3h).
    seen = ops.expand_dims(ops.convert_to_tensor(band_pattern(window)), 0)  # (1, h, 3h)
    valid = ops.ones((ops.shape(query)[0], length), "bool")  # real positions
    keys_ok = valid if key_mask is None else ops.cast(key_mask, "bool")
    queries_ok = valid if query_mask is None else ops.cast(query_mask, "bool")
    if segment_ids is not None:
        ids = ops.cast(segment_ids, "int32")
        keys_ok = ops.logical_and(keys_ok, ids > 0)
        queries_ok = ops.logical_and(queries_ok, ids > 0)
    # Padded as int32 (0 = unseen): not every backend pads booleans.
    keys_ok = _windows(ops.cast(keys_ok, "int32"), block, 0) > 0  # (B, nb, 3h)
    queries_ok = _blocks(ops.cast(queries_ok, "int32"), block, 0) > 0  # (B, nb, h)
    visible = ops.logical_and(ops.expand_dims(keys_ok, 2), ops.expand_dims(queries_ok, 3))
    visible = ops.logical_and(visible, ops.expand_dims(seen, 0))
    if segment_ids is not None:
        same = ops.equal(ops.expand_dims(_blocks(ids, block, -1), 3),
                         ops.expand_dims(_windows(ids, block, -2), 2))
        visible = ops.logical_and(visible, same)
    visible = ops.expand_dims(visible, 1)  # (B, 1, nb, h, 3h)

    # A key that no query of a block sees is zeroed in that block's window:
    # `0 * NaN` would carry a NaN in padding into the block's answers.
    seen_keys = ops.any(visible, axis=3)  # (B, 1, nb, 3h)
    seen_keys = ops.expand_dims(ops.transpose(seen_keys, (0, 2, 3, 1)), -1)  # (B, nb, 3h, 1, 1)
    k = _windows(key, block, 0.0)  # (B, nb, 3h, N, H)
    v = _windows(value, block, 0.0)
    k = ops.where(seen_keys, k, ops.zeros_like(k))
    v = ops.where(seen_keys, v, ops.zeros_like(v))
    q = _blocks(query * ops.cast(scale, query.dtype), block, 0.0)  # (B, nb, h, N, H)

    logits = ops.einsum("bcqnh,bcknh->bncqk", q, k)  # (B, N, nb, h, 3h)
    softmax_dtype = "float64" if logits.dtype == "float64" else "float32"
    logits = ops.cast(logits, softmax_dtype)
    logits = ops.where(visible, logits, ops.cast(MASKED_LOGIT, softmax_dtype))
    probs = ops.softmax(logits, axis=-1)
    probs = ops.where(visible, probs, ops.zeros_like(probs))
    probs = ops.cast(probs, query.dtype)
    if dropout > 0.0 and training:
        probs = random.dropout(probs, dropout, seed=seed_generator)
    output = ops.einsum("bncqk,bcknh->bcqnh", probs, v)  # (B, nb, h, N, Hv)
    # A query that sees no key answers 0 (`0 * NaN` in its window included).
    answers = ops.transpose(ops.any(visible, axis=-1), (0, 2, 3, 1))  # (B, nb, h, 1)
    output = ops.where(ops.expand_dims(answers, -1), output, ops.zeros_like(output))
    shape = ops.shape(output)
    output = ops.reshape(output, (shape[0], shape[1] * shape[2], shape[3], shape[4]))
    return output[:, :length]
