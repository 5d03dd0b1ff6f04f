"""Scaled dot-product attention: the reference formula and the fused route.

Shape legend: B batch, T query length, S key length, N heads, H head dim.
"""

import functools

import keras
import numpy as np
from keras import ops
from keras import random

from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import static_dim
from keras_attn.ops.masking import causal_mask
from keras_attn.ops.masking import merge_masks

# Masked logits are replaced (not offset) by this value, and the softmax runs
# in float32 or wider, so the constant never overflows float16 or bfloat16.
# Half of float32's largest magnitude keeps `logit - max` finite.
MASKED_LOGIT = float(-0.5 * np.finfo("float32").max)


def _static_dim(tensor, axis):
    return static_dim(tensor.shape[axis])


def _check_qkv(query, key, value):
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if len(tensor.shape) != 4:
            raise ValueError(
                f"`{name}` must have rank 4, (B, T or S, N, H). "
                f"Received: {name}.shape={tuple(tensor.shape)}"
            )
    q_width, k_width = _static_dim(query, -1), _static_dim(key, -1)
    if q_width is not None and k_width is not None and q_width != k_width:
        raise ValueError(
            "`query` and `key` must have the same width per head (Q K^T "
            f"contracts over it). Received: query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    for axis, what in ((1, "sequence length"), (2, "number of heads")):
        k_dim, v_dim = _static_dim(key, axis), _static_dim(value, axis)
        if k_dim is not None and v_dim is not None and k_dim != v_dim:
            raise ValueError(
                f"`key` and `value` must have the same {what}. Received: "
                f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
            )
    q_heads, k_heads = _static_dim(query, 2), _static_dim(key, 2)
    if q_heads is not None and k_heads is not None and q_heads != k_heads:
        raise ValueError(
            "`query` and `key` must have the same number of heads. Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )


def normalize_attention_mask(mask, query, key, name="mask"):
    """Returns `mask` as a boolean tensor of rank 4, (B|1, N|1, T, S).

    Accepted ranks: 2 (T, S), 3 (B, T, S) and 4 (B, N, T, S); each dim must
    match or be 1. Statically known dims are checked here, so a wrong mask is
    a `ValueError` (naming the argument `name`), never a silent broadcast.
    """
    if mask is None:
        return None
    mask = ops.convert_to_tensor(mask)
    received = tuple(static_dim(d) for d in mask.shape)
    rank = len(received)
    # expand_dims, not `mask[:, None]`: a strided slice of booleans with a new
    # axis is not a LiteRT builtin op (the exported model would need the Flex
    # delegate); ExpandDims is.
    if rank == 2:
        mask = ops.expand_dims(mask, (0, 1))
    elif rank == 3:
        mask = ops.expand_dims(mask, 1)
    elif rank != 4:
        raise ValueError(
            f"`{name}` must have rank 2 (T, S), 3 (B, T, S) or 4 (B, N, T, S). "
            f"Received: {name}.shape={received}"
        )
    target = (
        _static_dim(query, 0),
        _static_dim(query, 2),
        _static_dim(query, 1),
        _static_dim(key, 1),
    )
    for got, want in zip(tuple(static_dim(d) for d in mask.shape), target):
        if got is None or want is None or got in (1, want):
            continue
        raise ValueError(
            f"`{name}` must broadcast to (B, N, T, S) = {target}. "
            f"Received: {name}.shape={received}"
        )
    if mask.dtype != "bool":
        mask = ops.cast(mask, "bool")
    return mask


def _hide_unseen_keys(key, value, mask):
    """`key` and `value` `(B, S, N, H)` with the rows no query may see set to
    zero (`mask` rank 4, `(B|1, N|1, T|1, S)`).

    A masked key gets probability exactly 0, but `0 * NaN` is NaN: a NaN or
    inf in a padded position would reach every query through the matmuls
    (and their gradients). Keys hidden from *every* query (padding) are
    replaced by zeros first; a key that some query sees is left as it is,
    so bad data in a real position still shows as NaN where it is seen.
    """
    if mask is None:
        return key, value
    seen = ops.any(mask, axis=2)  # (B|1, N|1, S)
    seen = ops.expand_dims(ops.transpose(seen, (0, 2, 1)), -1)  # (B|1, S, N|1, 1)
    key = ops.where(seen, key, ops.zeros_like(key))
    value = ops.where(seen, value, ops.zeros_like(value))
    return key, value


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale=None,
    bias=None,
    dropout=0.0,
    training=False,
    seed_generator=None,
    return_attention_scores=False,
):
    """`softmax(Q K^T / sqrt(H) + M) V`, written out in `keras.ops`.

    This is the reference path: every step is explicit so the probabilities can
    be returned and dropped out. Masked keys get probability exactly 0, and a
    query with no visible key gets a zero output (never NaN) in float32,
    float16 and bfloat16: the softmax runs in float32 and masked logits are
    replaced, not offset, so no constant overflows a half-precision type.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, N, H)`.
        value: `(B, S, N, Hv)`.
        mask: optional boolean mask, True = attend, broadcastable to
            `(B, N, T, S)`; rank 2 `(T, S)` and rank 3 `(B, T, S)` masks are
            accepted and broadcast over heads. A key no query may see never
            reaches the output, whatever it holds (NaN included).
        scale: multiplier of the logits; defaults to `1 / sqrt(H)`.
        bias: optional additive logits broadcastable to `(B, N, T, S)`,
            added after scaling (relative-position terms); masking still
            replaces masked logits, so a bias never un-masks a key.
        dropout: dropout rate on the attention probabilities (training only).
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        return_attention_scores: also return the probabilities.

    Returns:
        The output `(B, T, N, Hv)` in the query's dtype and, if asked, the
        probabilities `(B, N, T, S)`.

    Example:

    >>> import numpy as np
    >>> q = k = v = np.ones((1, 3, 2, 4), "float32")
    >>> out, probs = scaled_dot_product_attention(
    ...     q, k, v, mask=np.tril(np.ones((3, 3), bool)),
    ...     return_attention_scores=True)
    >>> tuple(out.shape), tuple(probs.shape)
    ((1, 3, 2, 4), (1, 2, 3, 3))
    >>> [float(p) for p in probs[0, 0, 1]]
    [0.5, 0.5, 0.0]
    """
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    _check_qkv(query, key, value)
    dropout = check_rate("dropout", dropout)
    mask = normalize_attention_mask(mask, query, key)
    key, value = _hide_unseen_keys(key, value, mask)
    if scale is None:
        scale = 1.0 / float(np.sqrt(_static_dim(query, -1) or ops.shape(query)[-1]))

    compute_dtype = query.dtype
    # Scaling Q (T x H values) is cheaper than scaling the logits (T x S) and
    # keeps half-precision logits in range.
    query = query * ops.cast(scale, compute_dtype)
    logits = ops.einsum("btnh,bsnh->bnts", query, key)  # (B, N, T, S)
    softmax_dtype = "float64" if logits.dtype == "float64" else "float32"
    logits = ops.cast(logits, softmax_dtype)
    if bias is not None:
        logits = logits + ops.cast(bias, softmax_dtype)
    if mask is not None:
        logits = ops.where(mask, logits, ops.cast(MASKED_LOGIT, softmax_dtype))
    probs = ops.softmax(logits, axis=-1)
    if mask is not None:
        # Exact zeros on masked keys; a fully masked row (uniform over masked
        # logits) becomes all zeros, so its output is 0.
        probs = ops.where(mask, probs, ops.zeros_like(probs))
    probs = ops.cast(probs, compute_dtype)
    dropped = probs
    if dropout > 0.0 and training:
        dropped = random.dropout(probs, dropout, seed=seed_generator)
    output = ops.einsum("bnts,bsnh->btnh", dropped, value)  # (B, T, N, Hv)
    if return_attention_scores:
        return output, probs
    return output


@functools.lru_cache(maxsize=None)
def _default_device_is_cpu():
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


def fused_attention_supports(dtype):
    """Whether `keras.ops.dot_product_attention` runs for `dtype` here.

    XLA on the CPU has no float16 x float16 -> float32 dot, which the JAX
    kernel asks for, so float16 on a JAX CPU takes the explicit path.
    """
    return not (
        keras.backend.backend() == "jax"
        and str(dtype) == "float16"
        and _default_device_is_cpu()
    )


# cuDNN's fused attention (what JAX's `dot_product_attention` uses on an
# NVIDIA GPU) takes only lengths that are multiples of 8 and falls back to a
# slower path otherwise (measured on an H100: ViT-B/16's 197 tokens ran 2.58 ms
# forward + backward against 1.07 ms at 200; ../shared/gpu/BASELINE.md).
KERNEL_LENGTH_MULTIPLE = 8


def default_length_multiple():
    """The multiple that `fused_dot_product_attention` pads lengths to by
    default: `KERNEL_LENGTH_MULTIPLE` where the kernel needs it (JAX on a
    GPU), else 1 (no padding: TensorFlow computes the same ops as the
    explicit path, PyTorch's SDPA kernels take any length, and a CPU has no
    fused kernel)."""
    if keras.backend.backend() == "jax" and not _default_device_is_cpu():
        return KERNEL_LENGTH_MULTIPLE
    return 1


def _padded(x, length):
    """`x (B, L, N, H)` padded with zeros to `length` steps on axis 1."""
    extra = length - x.shape[1]
    return ops.pad(x, [[0, 0], [0, extra], [0, 0], [0, 0]]) if extra else x


def fused_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale=None,
    is_causal=False,
    flash_attention=None,
    length_multiple=None,
):
    """Same result as `scaled_dot_product_attention` through
    `keras.ops.dot_product_attention` (flash / cuDNN kernels where the
    backend has them). No dropout, no probabilities.

    `keras.ops.dot_product_attention` averages the values of a query whose
    keys are all masked; the reference says zero, so those rows are zeroed.

    Lengths that the backend's fast kernel refuses are padded: with
    `length_multiple=m` (default: `default_length_multiple()`), statically
    known query and key lengths are padded with zeros to multiples of `m`,
    the padded keys are masked out (a boolean key mask keeps cuDNN's kernel),
    and the padded queries are sliced off, so every answer and gradient is
    the unpadded one. On that route (`m > 1`) a mask is handed to the kernel
    with its query and key axes full, `(B|1, N|1, T', S')`: cuDNN refuses a
    mask that broadcasts over them.
    """
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    _check_qkv(query, key, value)
    mask = normalize_attention_mask(mask, query, key)
    if length_multiple is None:
        length_multiple = default_length_multiple()
    length_multiple = check_positive_int("length_multiple", length_multiple)
    t, s = _static_dim(query, 1), _static_dim(key, 1)
    pad = length_multiple > 1 and t is not None and s is not None and (
        t % length_multiple or s % length_multiple
    )
    if is_causal and (mask is not None or pad):
        # Fold the causal mask in so that rows it empties are zeroed below.
        causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])
        mask = merge_masks(mask, ops.expand_dims(ops.expand_dims(causal, 0), 0))
        is_causal = False
    key, value = _hide_unseen_keys(key, value, mask)
    if pad:
        t_pad = -(-t // length_multiple) * length_multiple
        s_pad = -(-s // length_multiple) * length_multiple
        query, key, value = _padded(query, t_pad), _padded(key, s_pad), _padded(value, s_pad)
        real_keys = ops.reshape(ops.arange(s_pad) < s, (1, 1, 1, -1))  # (1, 1, 1, S')
        if mask is not None:
            # (B|1, N|1, T|1, S|1) -> (B|1, N|1, T'|1, S'): padded keys
            # hidden; the padded query rows are sliced off below.
            if static_dim(mask.shape[3]) == 1:
                shape = ops.shape(mask)
                mask = ops.broadcast_to(mask, (shape[0], shape[1], shape[2], s))
            rows = 0 if static_dim(mask.shape[2]) == 1 else t_pad - t
            mask = ops.pad(mask, [[0, 0], [0, 0], [0, rows], [0, s_pad - s]])
        mask = merge_masks(mask, real_keys)
    if length_multiple > 1 and mask is not None:
        # cuDNN's kernel takes a mask only as a bias of the full (T, S) (JAX
        # raises "Bias must have same seq length as QKV, got 1 and 200" and
        # Keras falls back to XLA's ops, which the compiled program shows:
        # every masked or padded call ran without the kernel on an H200,
        # 2026-11-26). Batch and head axes may stay 1.
        shape = ops.shape(mask)
        mask = ops.broadcast_to(mask, (shape[0], shape[1], ops.shape(query)[1],
                                       ops.shape(key)[1]))
    output = ops.dot_product_attention(
        query,
        key,
        value,
        mask=mask,
        scale=scale,
        is_causal=is_causal,
        flash_attention=flash_attention,
    )  # (B, T', N, Hv)
    if mask is not None:
        has_key = ops.any(mask, axis=-1, keepdims=True)  # (B|1, N|1, T', 1)
        has_key = ops.transpose(has_key, (0, 2, 1, 3))  # (B|1, T', N|1, 1)
        output = ops.where(has_key, output, ops.zeros_like(output))
    if pad:
        output = output[:, :t]  # (B, T, N, Hv)
    return output
