"""The kernel module (issue 61): its dispatch keeps the keras.ops route
wherever no fast kernel applies (every CPU), and its JAX lengths kernel, run
on the CPU through XLA's implementation, gives the reference's values and
gradients on padded rows, and never turns a mask that is not right-padded
into lengths."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.ops import kernels as _kernels
from keras_attn.layers import fused_dot_product_attention
from keras_attn.layers import scaled_dot_product_attention
from keras_attn.ops.masking import causal_mask

N, H = 2, 8


def _inputs(b, t, s, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(b, n, N, H)).astype("float32") for n in (t, s, s))


def _right_padded(lengths, size):
    return np.arange(size)[None, :] < np.asarray(lengths)[:, None]  # (B, L)


def _merged(query_mask, key_mask, t, s, is_causal):
    mask = query_mask[:, None, :, None] & key_mask[:, None, None, :]  # (B, 1, T, S)
    if is_causal:
        mask = mask & ops.convert_to_numpy(causal_mask(t, s))[None, None]
    return mask


def test_on_a_cpu_the_dispatch_keeps_the_keras_ops_route():
    q, k, v = _inputs(2, 8, 8)
    q_mask, k_mask = _right_padded([8, 5], 8), _right_padded([8, 3], 8)
    for dtype in ("float32", "bfloat16"):
        assert _kernels.choose_kernel(
            ops.cast(q, dtype), ops.cast(k, dtype), ops.cast(v, dtype), query_mask=q_mask,
            key_mask=k_mask, right_padded=True) == "keras_ops"
    got = _kernels.attend(q, k, v, query_mask=q_mask, key_mask=k_mask, right_padded=True)
    mask = _merged(q_mask, k_mask, 8, 8, False)
    np.testing.assert_array_equal(ops.convert_to_numpy(got), ops.convert_to_numpy(
        fused_dot_product_attention(q, k, v, mask=mask)))
    np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(
        scaled_dot_product_attention(q, k, v, mask=mask)), atol=1e-5)
    with pytest.raises(ValueError, match="kernel='cudnn'"):
        _kernels.attend(q, k, v, kernel="cudnn")


def test_padding_lengths_flag_masks_that_are_not_right_padded():
    lengths, ok = _kernels.padding_lengths(
        [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0]])
    assert ops.convert_to_numpy(lengths).tolist() == [3, 4, 0, 3, 2]
    assert ops.convert_to_numpy(ok).tolist() == [True, True, True, False, False]


@pytest.mark.backends("jax")
def test_on_a_gpu_the_lengths_kernel_takes_only_promised_half_precision_padding(monkeypatch):
    monkeypatch.setattr(_kernels, "_default_device_is_gpu", lambda: True)
    q, k, v = (ops.cast(x, "bfloat16") for x in _inputs(2, 8, 8))
    pad = _right_padded([8, 5], 8)

    def choose(q=q, k=k, v=v, **kwargs):
        kwargs = {"key_mask": pad, "right_padded": True, **kwargs}
        return _kernels.choose_kernel(q, k, v, **kwargs)

    assert choose() == choose(query_mask=pad, is_causal=True) == "jax_lengths"
    assert choose(right_padded=False) == "keras_ops"  # no promise: no lengths
    assert choose(mask=np.ones((1, 1, 8, 8), bool)) == "keras_ops"  # another mask
    assert choose(key_mask=None) == "keras_ops"  # nothing to say as lengths
    assert choose(flash_attention=False) == "keras_ops"
    assert choose(q=ops.cast(q, "float32"), k=ops.cast(k, "float32"),
                  v=ops.cast(v, "float32")) == "keras_ops"  # cuDNN: half precision only
    assert choose(q=q[..., :4], k=k[..., :4], v=v[..., :4]) == "keras_ops"  # head size 4
    assert choose(q=q[:, :6], query_mask=pad[:, :6], is_causal=True) == "keras_ops"  # T != S


def _values_and_grads(fn, q, k, v):
    import jax

    w = np.random.default_rng(9).normal(size=q.shape).astype("float32")

    def loss(q, k, v):
        out = fn(q, k, v)
        return (out * w).sum(), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return [np.asarray(out)] + [np.asarray(g) for g in grads]


@pytest.mark.backends("jax")
@pytest.mark.parametrize("t, s, is_causal, multiple, queries", [
    (8, 8, False, None, True), (8, 8, True, None, True), (6, 8, False, None, True),
    (8, 8, False, None, False),  # keys padded, every query real
    # Padded to multiples of 8 as for cuDNN, here through XLA.
    (6, 5, False, 8, False), (6, 6, True, 8, True)])
def test_the_lengths_kernel_gives_the_reference_values_and_gradients(
        t, s, is_causal, multiple, queries):
    q_lengths = [t, t - 1, 2, t, 1] if queries else [t] * 5
    k_lengths = [s, s - 2, 3, 0, 1]  # a full row, padded rows, a row with no key
    if is_causal:
        k_lengths[3] = 4  # a causal row sees keys from 0: each query has one
    q, k, v = _inputs(len(q_lengths), t, s, seed=t)
    q_mask, k_mask = _right_padded(q_lengths, t), _right_padded(k_lengths, s)
    k[~k_mask], v[~k_mask] = np.nan, np.inf  # padding never reaches the answer
    mask = _merged(q_mask, k_mask, t, s, is_causal)
    q_mask = q_mask if queries else None

    expected = _values_and_grads(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask=mask), q, k, v)
    if multiple is None:
        def kernel(q, k, v):
            return _kernels.attend(q, k, v, query_mask=q_mask, key_mask=k_mask,
                                   is_causal=is_causal, right_padded=True, kernel="jax_lengths")
    else:
        def kernel(q, k, v):
            return _kernels._jax_lengths(
                q, k, v, q_mask, k_mask, is_causal, None, "xla", multiple=multiple)
    got = _values_and_grads(kernel, q, k, v)
    for name, want, have in zip(("output", "dq", "dk", "dv"), expected, got):
        assert np.isfinite(have).all(), name
        np.testing.assert_allclose(have, want, atol=2e-5, err_msg=name)


def _broken_promise(run):
    """`run(q, k, v, key_mask)` given masks that break the right-padding
    promise in examples 1 and 2: those are NaN, example 0 the reference."""
    q, k, v = _inputs(3, 8, 8)
    k_mask = _right_padded([6, 8, 8], 8)
    k_mask[1, :2] = False  # left-padded: its length (6) would be other keys
    k_mask[2, 3] = False  # a hole
    got = ops.convert_to_numpy(run(q, k, v, k_mask))
    assert np.isnan(got[1:]).all()
    want = ops.convert_to_numpy(scaled_dot_product_attention(
        q, k, v, mask=k_mask[:, None, None, :]))
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)


def test_a_broken_right_padding_promise_is_nan_on_the_keras_ops_route():
    _broken_promise(lambda q, k, v, k_mask: _kernels.attend(
        q, k, v, key_mask=k_mask, right_padded=True))


@pytest.mark.backends("jax")
def test_the_lengths_kernel_never_turns_a_holey_mask_into_lengths():
    import jax

    _broken_promise(lambda q, k, v, k_mask: jax.jit(lambda q, k, v: _kernels.attend(
        q, k, v, key_mask=k_mask, right_padded=True, kernel="jax_lengths"))(q, k, v))


@pytest.mark.backends("tensorflow", "torch")
def test_the_lengths_kernel_is_refused_off_jax():
    q, k, v = _inputs(1, 8, 8)
    with pytest.raises(ValueError, match=f"backend='{keras.backend.backend()}'"):
        _kernels.attend(q, k, v, key_mask=np.ones((1, 8), bool), kernel="jax_lengths")


# Issue 68: a mask holds booleans or exactly 0 and 1, in `attend` as in the
# layers (docs/bad_input.md): 0.5, 2 or NaN is never read as True.
_MASK_SHAPES = {"mask": (3, 1, 4, 4), "query_mask": (3, 4), "key_mask": (3, 4)}


def _bad_mask(argument, value):
    """Inputs and one mask argument of ones whose example 1 holds `value`."""
    q, k, v = _inputs(3, 4, 4)
    mask = np.ones(_MASK_SHAPES[argument], "float32")
    mask[(1,) + (0,) * (mask.ndim - 1)] = value
    return q, k, v, {argument: mask}


def _compiled(fn, monkeypatch):
    """`fn` inside a compiled function, where no check can raise: `jax.jit`,
    `tf.function`; on PyTorch `fn` runs eagerly while `torch.compile`'s
    signal says it is being traced (the signal `concrete_value` reads): a
    real `torch.compile` of `attend` takes 13-25 s here (graph breaks in
    Keras's torch ops), and gave the same answers when run by hand."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, autograph=False)  # autograph's conversion: 10 s
    import torch

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    return fn


@pytest.mark.parametrize("value", [0.5, 2.0, np.nan])
@pytest.mark.parametrize("argument", list(_MASK_SHAPES))
def test_attend_refuses_mask_values_other_than_0_1(argument, value):
    q, k, v, masks = _bad_mask(argument, value)
    with pytest.raises(ValueError, match=rf"`{argument}` must be boolean or hold only 0 and "
                                         rf"1.*Received: {argument} with values {value}"):
        _kernels.attend(q, k, v, **masks)


def _attend_with_masks(q, k, v, mask, query_mask, key_mask):
    return _kernels.attend(q, k, v, mask=mask, query_mask=query_mask, key_mask=key_mask)


@pytest.mark.parametrize("value", [0.5, 2.0, np.nan])
def test_a_bad_mask_value_in_a_compiled_function_makes_that_example_nan(value, monkeypatch):
    """Example 0's `mask`, 1's `query_mask` and 2's `key_mask` hold `value`:
    those examples are NaN, example 3 is the answer of its masks."""
    q, k, v = _inputs(4, 4, 4)
    masks = [np.ones((4,) + shape[1:], "float32")
             for shape in _MASK_SHAPES.values()]
    for example, mask in enumerate(masks):
        mask[(example,) + (0,) * (mask.ndim - 1)] = value
    masks[1][3, 3] = masks[2][3, 2] = 0  # example 3: a padded query and key
    got = ops.convert_to_numpy(_compiled(_attend_with_masks, monkeypatch)(
        *map(ops.convert_to_tensor, [q, k, v] + masks)))
    monkeypatch.undo()
    assert np.isnan(got[:3]).all()
    want = ops.convert_to_numpy(_kernels.attend(
        q, k, v, query_mask=masks[1] == 1, key_mask=masks[2] == 1))
    assert np.isfinite(want[3]).all()
    np.testing.assert_allclose(got[3], want[3], atol=1e-5)
