"""The fused path pads lengths the fast kernel refuses (cuDNN: multiples of
8) and gives the explicit path's outputs and gradients at every length."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import fused_dot_product_attention
from keras_attn.layers import scaled_dot_product_attention
from keras_attn.ops.masking import causal_mask
from keras_attn.ops.attention import KERNEL_LENGTH_MULTIPLE
from keras_attn.ops.attention import default_length_multiple
from test_case import values_and_grads

B, N, H = 2, 2, 4


def _inputs(t, s, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, t, N, H)).astype("float32")
    k = rng.normal(size=(B, s, N, H)).astype("float32")
    v = rng.normal(size=(B, s, N, H)).astype("float32")
    return q, k, v


def _masks(t, s, kind):
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    keys = np.ones((B, 1, 1, s), bool)
    keys[0, ..., s // 2 + 1:] = False  # padding in the first example
    if kind == "padding":
        return keys, False
    return keys, True  # padding and causal


KINDS = ["none", "padding", "causal", "padding_causal"]


def _fused_and_explicit(length, kind):
    mask, is_causal = _masks(length, length, kind)

    def fused(q, k, v):
        return fused_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                           length_multiple=KERNEL_LENGTH_MULTIPLE)

    def explicit(q, k, v):
        full = mask
        if is_causal:
            causal = causal_mask(length, length)[None, None]
            full = causal if mask is None else ops.logical_and(mask, causal)
        return scaled_dot_product_attention(q, k, v, mask=full)

    return [fused, explicit]


# The padding depends on the length modulo the kernel's multiple (8): 1-17
# is every residue twice, on both sides of a multiple; then the sides of 32
# and 64, and 70. (Every length 1-70 took 160 s on JAX: a compile each.)
LENGTHS = [*range(1, 18), 31, 32, 33, 63, 64, 65, 70]


@pytest.mark.parametrize("lengths", [LENGTHS[:12], LENGTHS[12:]], ids=["1-12", "13-70"])
def test_padded_fused_path_equals_the_explicit_one_at_every_length(lengths):
    """Without a mask, with padding, causal, and both."""
    for length in lengths:
        q, k, v = _inputs(length, length, seed=length)
        fns = [fn for kind in KINDS for fn in _fused_and_explicit(length, kind)]
        results = values_and_grads(fns, q, k, v)
        for index, kind in enumerate(KINDS):
            (got, got_grads), (want, want_grads) = results[2 * index:2 * index + 2]
            context = f"{kind}, length {length}"
            assert got.shape == want.shape == (B, length, N, H)
            np.testing.assert_allclose(got, want, atol=2e-5, err_msg=context)
            for a, b in zip(got_grads, want_grads):
                np.testing.assert_allclose(a, b, atol=5e-5, err_msg=f"gradient, {context}")


def test_padding_cross_attention_of_other_lengths_and_a_fully_padded_row():
    q, k, v = _inputs(5, 13, seed=0)
    mask = np.ones((B, 5, 13), bool)
    mask[1, 2] = False  # query 2 of example 1 sees no key
    got = ops.convert_to_numpy(fused_dot_product_attention(
        q, k, v, mask=mask, length_multiple=KERNEL_LENGTH_MULTIPLE))
    want = ops.convert_to_numpy(scaled_dot_product_attention(q, k, v, mask=mask))
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got[1, 2], 0.0)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_the_default_pads_only_where_the_kernel_needs_it():
    # This machine has no GPU: no padding by default on any backend.
    assert default_length_multiple() == 1
    with pytest.raises(ValueError, match="Received: length_multiple=0"):
        q, k, v = _inputs(3, 3, seed=1)
        fused_dot_product_attention(q, k, v, length_multiple=0)


@pytest.mark.parametrize("length", [16, 13])
def test_the_kernel_route_hands_the_kernel_a_mask_of_full_query_and_key_axes(
        monkeypatch, length):
    """cuDNN (JAX on a GPU) takes a mask only as a bias of the full (T, S):
    a key-padding mask (B, 1, 1, S), or the padded keys' own mask, reached
    it broadcast over the queries, was refused and fell back to XLA's ops
    (seen on an H200). The mask the kernel receives is (B|1, N|1, T', S'),
    and the answer is still the explicit path's."""
    import sys

    # The package exports a function of the module's name.
    module = sys.modules["keras_attn.ops.attention"]
    seen = []
    real = module.ops.dot_product_attention

    class Recording:
        def __getattr__(self, name):
            return getattr(ops, name)

        @staticmethod
        def dot_product_attention(query, key, value, mask=None, **kwargs):
            seen.append((tuple(query.shape), tuple(key.shape),
                         None if mask is None else tuple(mask.shape)))
            return real(query, key, value, mask=mask, **kwargs)

    monkeypatch.setattr(module, "ops", Recording())
    q, k, v = _inputs(length, length, seed=3)
    padded = -(-length // KERNEL_LENGTH_MULTIPLE) * KERNEL_LENGTH_MULTIPLE
    keys, _ = _masks(length, length, "padding")
    for mask in (keys, None):
        got = fused_dot_product_attention(q, k, v, mask=mask,
                                          length_multiple=KERNEL_LENGTH_MULTIPLE)
        want = scaled_dot_product_attention(q, k, v, mask=mask)
        np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(want),
                                   atol=2e-5)
    query_shape, key_shape, mask_shape = seen[0]  # the key-padding mask
    assert mask_shape == (B, 1, padded, padded)
    if length == padded:
        assert seen[1][2] is None  # nothing to mask: no mask at all
    else:
        assert seen[1][2] == (1, 1, padded, padded)  # the padded keys' mask
    # Off the kernel route (the default here: no GPU), masks are not grown.
    seen.clear()
    fused_dot_product_attention(q, k, v, mask=keys, length_multiple=1)
    assert seen[0][2] == (B, 1, 1, length)
