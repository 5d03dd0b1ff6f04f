import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import MultiHeadAttention
from keras_attn.layers import TransformerBlock
from keras_attn.layers import fused_dot_product_attention
from keras_attn.layers import scaled_dot_product_attention
from test_case import to_numpy

RNG = np.random.default_rng(1)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def numpy_attention(q, k, v, mask):
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs = probs / probs.sum(-1, keepdims=True)
    probs = np.nan_to_num(probs)  # fully masked rows -> 0
    return np.einsum("bnts,bsnh->btnh", probs, v), probs


def test_matches_numpy_formula():
    q, k, v = rand(2, 4, 3, 5), rand(2, 6, 3, 5), rand(2, 6, 3, 7)
    mask = RNG.random((2, 1, 4, 6)) > 0.3
    mask[0, 0, 2] = False  # one fully masked row
    out, probs = scaled_dot_product_attention(q, k, v, mask=mask, return_attention_scores=True)
    want_out, want_probs = numpy_attention(q, k, v, mask)
    np.testing.assert_allclose(to_numpy(out), want_out, atol=1e-5)
    np.testing.assert_allclose(to_numpy(probs), want_probs, atol=1e-6)
    assert (to_numpy(probs)[~np.broadcast_to(mask, (2, 3, 4, 6))] == 0).all()
    np.testing.assert_array_equal(to_numpy(out)[0, 2], 0.0)


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_fused_equals_explicit_for_every_mask_rank(rank):
    q, k, v = rand(2, 5, 2, 4), rand(2, 5, 2, 4), rand(2, 5, 2, 4)
    full = RNG.random((2, 2, 5, 5)) > 0.4
    full[:, :, 0] = False  # fully masked rows
    mask = {2: full[0, 0], 3: full[:, 0], 4: full}[rank]
    for causal in (False, True):
        explicit_mask = mask
        if causal:
            explicit_mask = np.logical_and(np.broadcast_to(mask, full.shape if rank == 4 else mask.shape), np.tril(np.ones((5, 5), bool)))
        fused = fused_dot_product_attention(q, k, v, mask=mask, is_causal=causal)
        explicit = scaled_dot_product_attention(q, k, v, mask=explicit_mask)
        np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("path", ["explicit", "fused"])
def test_fully_masked_rows_are_zero_and_finite(dtype, path):
    q = ops.cast(rand(2, 3, 2, 4) * 30, dtype)  # large logits stress half precision
    k = ops.cast(rand(2, 4, 2, 4) * 30, dtype)
    v = ops.cast(rand(2, 4, 2, 4), dtype)
    mask = np.ones((2, 1, 3, 4), bool)
    mask[0, :, 1] = False  # one fully masked row
    mask[1] = False  # one fully masked sample
    fn = scaled_dot_product_attention if path == "explicit" else fused_dot_product_attention
    out = to_numpy(ops.cast(fn(q, k, v, mask=mask), "float32"))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.abs(out[0, 0]).max() > 0


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_fully_masked_gradients_are_finite(policy):
    """Through a whole block, in a fit step: finite loss and finite weights."""
    keras.config.set_dtype_policy(policy)
    tokens = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(20, 8)(tokens)
    padding = keras.Input((4,), dtype="bool")
    y = TransformerBlock(num_heads=2, intermediate_dim=16)(x, padding_mask=padding)
    y = keras.layers.Dense(1, dtype="float32")(y)
    model = keras.Model([tokens, padding], y)
    model.compile(optimizer="sgd", loss="mse")
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)  # one sample fully masked
    data = [np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), mask]
    history = model.fit(data, np.ones((2, 4, 1)), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    for weight in model.weights:
        assert np.isfinite(to_numpy(weight)).all(), weight.path


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_fully_masked_gradient_values_are_finite(policy):
    """Gradients w.r.t. inputs on the explicit path, fully masked rows included."""
    keras.config.set_dtype_policy(policy)
    layer = MultiHeadAttention(num_heads=2)
    x = rand(2, 4, 8)
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)
    layer(x)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            out = layer(xt, query_mask=mask, value_mask=mask, return_attention_scores=True)[0]
            loss = tf.reduce_sum(tf.cast(out, "float32"))
        grad = tape.gradient(loss, xt).numpy()
    elif keras.backend.backend() == "jax":
        import jax

        def loss_fn(xj):
            out = layer(xj, query_mask=mask, value_mask=mask, return_attention_scores=True)[0]
            return ops.sum(ops.cast(out, "float32"))

        grad = np.asarray(jax.grad(loss_fn)(x))
    else:
        import torch

        xt = torch.tensor(x, requires_grad=True)
        out = layer(xt, query_mask=mask, value_mask=mask, return_attention_scores=True)[0]
        ops.sum(ops.cast(out, "float32")).backward()
        grad = xt.grad.numpy()
    assert np.isfinite(grad).all()


def test_query_key_width_mismatch():
    with pytest.raises(ValueError, match=r"same width per head.*query.shape=\(1, 2, 2, 4\), key.shape=\(1, 3, 2, 5\)"):
        scaled_dot_product_attention(rand(1, 2, 2, 4), rand(1, 3, 2, 5), rand(1, 3, 2, 5))


def test_function_mask_that_does_not_broadcast():
    # (B, T, S) = (1, 2, 3) but the mask has S = 4.
    with pytest.raises(ValueError, match=r"broadcast to \(B, N, T, S\).*Received: mask.shape=\(1, 2, 4\)"):
        scaled_dot_product_attention(
            rand(1, 2, 2, 4), rand(1, 3, 2, 4), rand(1, 3, 2, 4), mask=np.ones((1, 2, 4), bool)
        )


def test_function_mask_of_rank_five():
    with pytest.raises(ValueError, match=r"rank 2 \(T, S\), 3 \(B, T, S\) or 4.*Received: mask.shape=\(1, 1, 1, 2, 3\)"):
        scaled_dot_product_attention(
            rand(1, 2, 2, 4), rand(1, 3, 2, 4), rand(1, 3, 2, 4), mask=np.ones((1, 1, 1, 2, 3), bool)
        )
