"""The attention kernels: the one place where a backend's own fast attention
is called (issue 61), each beside the `keras.ops` route it must equal.

`keras.ops.dot_product_attention` takes a mask only as a dense bias, so a
padded batch pays for a `(B, 1, T, S)` bias on JAX's cuDNN kernel; cuDNN also
takes padding as per-example sequence lengths (1.08x at T=128 up to 1.7x at
2048, forward + backward, bf16 on an H200: benchmarks/gpu_kernels.py). The
layers call `attend`, which picks one kernel by name:

- `"jax_lengths"`: `jax.nn.dot_product_attention(..., query_seq_lengths=,
  key_value_seq_lengths=, implementation="cudnn")`, taken only on the JAX
  backend whose default device is a GPU, in float16 or bfloat16, for a
  padding mask given as `(B, T)` / `(B, S)` masks that the caller promises are
  right-padded (`right_padded=True`; a True run then a False run per row) and
  no other mask;
- `"keras_ops"`: everything else, `fused_dot_product_attention` (the route
  the layers took before this module).

Masks hold booleans or exactly 0 and 1, as in the layers (`masking.checked_mask`):
another value (0.5, 2, NaN) is a `ValueError` naming the argument where its
values exist, and makes the examples that hold it NaN inside a compiled
function, where nothing can raise.

Lengths are never guessed: without the caller's promise a padding mask takes
`"keras_ops"`, and with it each example's mask is still checked inside the
graph, by every kernel (so a CPU run shows what the GPU gives); an example
whose mask is not a run of True then False (left padding, a hole) gets a NaN
output, never the answer of a different mask.

Layers and models import no backend: this module imports JAX inside
`_jax_lengths` only, which runs only on the JAX backend.

Shape legend: B batch, T query length, S key length, N heads, H head dim.
"""

import functools

import keras
from keras import ops

from keras_attn._checks import static_dim
from keras_attn.ops.attention import KERNEL_LENGTH_MULTIPLE
from keras_attn.ops.attention import fused_dot_product_attention
from keras_attn.ops.masking import checked_mask
from keras_attn.ops.masking import merge_masks
from keras_attn.ops.masking import nan_where

KERAS_OPS = "keras_ops"
JAX_LENGTHS = "jax_lengths"
KERNELS = (KERAS_OPS, JAX_LENGTHS)

# cuDNN's flash attention takes head sizes that are multiples of 8 up to 128
# (larger ones only on some cards and versions): others keep "keras_ops".
_CUDNN_HEAD_DIMS = range(8, 129, 8)


@functools.lru_cache(maxsize=None)
def _default_device_is_gpu():
    device = keras.distribution.list_devices()[0].lower()
    return device.startswith(("gpu", "cuda"))


def padding_lengths(mask):
    """`(lengths, right_padded)` of a padding mask `(B, L)` (True = real):
    each example's count of True, int32 `(B,)`, and whether its mask is that
    many True then only False, boolean `(B,)`.

    >>> lengths, ok = padding_lengths([[1, 1, 0], [0, 1, 1]])
    >>> ops.convert_to_numpy(lengths).tolist(), ops.convert_to_numpy(ok).tolist()
    ([2, 2], [True, False])
    """
    mask = ops.cast(ops.convert_to_tensor(mask), "bool")
    lengths = ops.sum(ops.cast(mask, "int32"), axis=1)  # (B,)
    prefix = ops.expand_dims(ops.arange(ops.shape(mask)[1], dtype="int32"), 0) < (
        ops.expand_dims(lengths, 1))  # (B, L)
    return lengths, ops.all(ops.equal(mask, prefix), axis=1)


def choose_kernel(query, key, value, *, mask=None, query_mask=None, key_mask=None,
                  is_causal=False, flash_attention=None, right_padded=False):
    """The name of the kernel that `attend` runs for these arguments (see the
    module's docstring); on a CPU always `"keras_ops"`."""
    if (keras.backend.backend() != "jax" or flash_attention is False
            or not right_padded or mask is not None
            or (query_mask is None and key_mask is None)):
        return KERAS_OPS
    if str(query.dtype) not in ("float16", "bfloat16") or not _default_device_is_gpu():
        return KERAS_OPS
    head = static_dim(query.shape[-1])
    if (head not in _CUDNN_HEAD_DIMS or static_dim(key.shape[-1]) != head
            or static_dim(value.shape[-1]) != head):
        return KERAS_OPS
    t, s = static_dim(query.shape[1]), static_dim(key.shape[1])
    if t is None or s is None or (is_causal and t != s):
        return KERAS_OPS
    return JAX_LENGTHS


def attend(query, key, value, *, mask=None, query_mask=None, key_mask=None,
           is_causal=False, scale=None, flash_attention=None, right_padded=False,
           kernel=None):
    """`softmax(Q K^T * scale + M) V` without dropout or probabilities, through
    the kernel `choose_kernel` names (or `kernel`, one of `KERNELS`, forced).

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, N, H)`.
        value: `(B, S, N, Hv)`.
        mask: optional mask broadcastable to `(B, N, T, S)`.
        query_mask: optional `(B, T)` padding mask of the queries (True =
            real): a padded query's output is zero.
        key_mask: optional `(B, S)` padding mask of the keys.
            Each mask holds booleans or only 0 and 1 (see the module's
            docstring for another value).
        is_causal: query `i` sees keys `j <= i` only.
        scale: multiplier of the logits; defaults to `1 / sqrt(H)`.
        flash_attention: passed to `keras.ops.dot_product_attention`; False
            also keeps every other kernel out.
        right_padded: the caller's promise that `query_mask` and `key_mask`
            are right-padded (a run of True, then False); checked per
            example inside the graph, by every kernel: an example that
            breaks it gets NaN.
        kernel: force a kernel (tests, benchmarks); `"jax_lengths"` runs on
            the JAX backend only, with XLA's implementation on a CPU.

    Returns:
        `(B, T, N, Hv)`, equal (values and gradients) to
        `scaled_dot_product_attention` with the merged mask.
    """
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    mask, bad_mask = checked_mask(mask, "mask", pairwise=True)
    query_mask, bad_query = checked_mask(query_mask, "query_mask")
    key_mask, bad_key = checked_mask(key_mask, "key_mask")
    output = None
    chosen = kernel
    if kernel is None:
        chosen = choose_kernel(
            query, key, value, mask=mask, query_mask=query_mask, key_mask=key_mask,
            is_causal=is_causal, flash_attention=flash_attention,
            right_padded=right_padded)
    if chosen not in KERNELS:
        raise ValueError(f"`kernel` must be None or one of {KERNELS}. Received: kernel={kernel!r}")
    if chosen == JAX_LENGTHS:
        if keras.backend.backend() != "jax" or mask is not None:
            raise ValueError(
                "The kernel 'jax_lengths' runs on the JAX backend, with padding given "
                "as `query_mask` / `key_mask` only. Received: "
                f"backend={keras.backend.backend()!r}, mask={'None' if mask is None else 'a mask'}")
        try:
            output = _jax_lengths(query, key, value, query_mask, key_mask, is_causal, scale,
                                  "cudnn" if _default_device_is_gpu() else "xla")
        except Exception:  # noqa: BLE001 - the reference below gives the same answer
            if kernel is not None:  # forced: say why it cannot run
                raise
    if output is None:
        output = _keras_ops(query, key, value, mask, query_mask, key_mask, is_causal, scale,
                            flash_attention, right_padded)
    for bad in (bad_mask, bad_query, bad_key):
        output = nan_where(bad, output)
    return output


def _keras_ops(query, key, value, mask, query_mask, key_mask, is_causal, scale,
               flash_attention, right_padded):
    """The `"keras_ops"` kernel: `fused_dot_product_attention` with the
    masks merged (boolean here)."""
    # The promise is checked here too, so that a CPU run shows what a GPU
    # run of the same program gives.
    invalid = _broken_promise(query_mask, key_mask) if right_padded else None
    if query_mask is not None:
        query_mask = ops.expand_dims(ops.cast(query_mask, "bool"), (1, 3))  # (B, 1, T, 1)
    if key_mask is not None:
        key_mask = ops.expand_dims(ops.cast(key_mask, "bool"), (1, 2))  # (B, 1, 1, S)
    if query_mask is not None or key_mask is not None:
        mask = merge_masks(query_mask, key_mask, mask)
    output = fused_dot_product_attention(
        query, key, value, mask=mask, scale=scale, is_causal=is_causal,
        flash_attention=flash_attention)
    return nan_where(invalid, output)


def _broken_promise(query_mask, key_mask):
    """`(B,)` True where `query_mask` or `key_mask` is not right-padded;
    None when both are None."""
    invalid = None
    for mask in (query_mask, key_mask):
        if mask is not None:
            bad = ops.logical_not(padding_lengths(mask)[1])
            invalid = bad if invalid is None else ops.logical_or(invalid, bad)
    return invalid


def _padded_axis1(x, length):
    extra = length - x.shape[1]
    return ops.pad(x, [[0, 0], [0, extra]] + [[0, 0]] * (len(x.shape) - 2)) if extra else x


def _jax_lengths(query, key, value, query_mask, key_mask, is_causal, scale, implementation,
                 multiple=None):
    """`jax.nn.dot_product_attention` with per-example sequence lengths, made
    equal to the reference: keys past a length are zeroed first (a NaN there
    must not reach the answer through `0 * NaN`), lengths are padded to
    multiples of 8 for cuDNN (or `multiple`; the extra steps lie past every
    length, so that a CPU test can run this padding through XLA), padded
    queries and queries with no key get a zero output, and an example whose
    masks are not right-padded gets NaN."""
    import jax

    batch = ops.shape(query)[0]
    t, s = static_dim(query.shape[1]), static_dim(key.shape[1])
    invalid = _broken_promise(query_mask, key_mask)
    q_len = k_len = None
    if query_mask is not None:
        q_len = padding_lengths(query_mask)[0]
    if key_mask is not None:
        k_len = padding_lengths(key_mask)[0]
        # A prefix of length k_len: the same keys as the mask where it is
        # right-padded (the other examples become NaN below).
        real = ops.expand_dims(ops.arange(s, dtype="int32"), 0) < ops.expand_dims(k_len, 1)
        real = ops.expand_dims(real, (2, 3))  # (B, S, 1, 1)
        key = ops.where(real, key, ops.zeros_like(key))
        value = ops.where(real, value, ops.zeros_like(value))
    if q_len is None:
        q_len = ops.full((batch,), t, dtype="int32")
    if k_len is None:
        k_len = ops.full((batch,), s, dtype="int32")
    if multiple is None:
        multiple = KERNEL_LENGTH_MULTIPLE if implementation == "cudnn" else 1
    t_pad, s_pad = -(-t // multiple) * multiple, -(-s // multiple) * multiple
    output = jax.nn.dot_product_attention(
        _padded_axis1(query, t_pad), _padded_axis1(key, s_pad), _padded_axis1(value, s_pad),
        scale=scale, is_causal=is_causal, query_seq_lengths=q_len,
        key_value_seq_lengths=k_len, implementation=implementation)[:, :t]  # (B, T, N, H)
    rows = ops.expand_dims(ops.arange(t, dtype="int32"), 0) < ops.expand_dims(q_len, 1)
    rows = ops.logical_and(rows, ops.expand_dims(k_len > 0, 1))  # (B, T)
    output = ops.where(ops.expand_dims(rows, (2, 3)), output, ops.zeros_like(output))
    return nan_where(invalid, output)
