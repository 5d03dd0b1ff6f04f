"""Local attention on its band only (issue 72, `ops.local_attention`): the
same values and gradients as the `(T, S)`-masked reference, with padding and
packed rows; `MultiHeadAttention(window=...)` takes it where the band is the
smaller and answers as the masked route; and no `(T, S)` tensor is made."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import MultiHeadAttention
from keras_attn.ops.attention import scaled_dot_product_attention
from keras_attn.ops.local_attention import banded_attention
from keras_attn.ops.masking import local_mask
from keras_attn.ops.masking import merge_masks
from keras_attn.ops.masking import segment_mask
from test_case import values_and_grads

B, N, H = 2, 2, 4


def _case(length, kind, seed=0):
    """`(q, k, v, banded keyword arguments, reference mask (B, 1, T, T))`."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, length, N, H)).astype("float32") for _ in range(3))
    kwargs, masks = {}, []
    if kind == "padding":  # the second row's last 3 positions are padding
        real = np.ones((B, length), bool)
        real[1, length - 3:] = False
        kwargs = {"query_mask": real, "key_mask": real}
        masks = [real[:, None, :, None], real[:, None, None, :]]
        k[1, length - 3:] = np.nan  # padding holds anything: never seen
        v[1, length - 3:] = np.nan
    elif kind == "packed":  # two examples, then padding, in the first row
        ids = np.ones((B, length), "int32")
        ids[0, length // 2:] = 2
        ids[0, length - 2:] = 0
        kwargs = {"segment_ids": ids}
        masks = [ops.expand_dims(segment_mask(ids), 1)]
    return q, k, v, kwargs, masks


@pytest.mark.parametrize("length, window", [(20, 4), (17, 5), (9, 1), (6, 64), (33, 8)])
@pytest.mark.parametrize("kind", ["none", "padding", "packed"])
def test_the_band_gives_the_masked_attention_and_its_gradients(length, window, kind):
    q, k, v, kwargs, masks = _case(length, kind)
    mask = merge_masks(ops.expand_dims(local_mask(length, length, window), (0, 1)), *masks)
    (band, band_grads), (full, full_grads) = values_and_grads([
        lambda q, k, v: banded_attention(q, k, v, window, **kwargs),
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask=mask)], q, k, v)
    assert np.isfinite(band).all() and np.isfinite(np.concatenate(
        [g.ravel() for g in band_grads])).all()
    np.testing.assert_allclose(band, full, atol=1e-5)
    for name, got, expected in zip("qkv", band_grads, full_grads):
        np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=name)
    if kind == "padding":  # a padded query answers zero
        assert (band[1, length - 3:] == 0).all()


def test_the_layer_takes_the_band_where_it_is_smaller_and_answers_as_the_mask():
    layer = MultiHeadAttention(num_heads=N, key_dim=H, window=6, rotary_theta=10000.0)
    x = np.random.default_rng(1).normal(size=(B, 20, 8)).astype("float32")
    real = np.ones((B, 20), bool)
    real[1, 14:] = False
    ids = np.ones((B, 20), "int32")
    ids[0, 9:], ids[1, 15:] = 2, 0
    everything = np.ones((20, 20), bool)  # a pairwise mask keeps the (T, S) route
    for call in ({"query_mask": real}, {"segment_ids": ids}):
        band = ops.convert_to_numpy(layer(x, **call))
        full = ops.convert_to_numpy(layer(x, attention_mask=everything, **call))
        np.testing.assert_allclose(band, full, atol=1e-5)
    taken = dict(masks={"attention_mask": None}, self_attention=True, cache=None,
                 use_causal_mask=False, return_attention_scores=False)
    assert layer._takes_the_band(ops.zeros((1, 10, N, H)), **taken)  # 10 > 3 x 3
    assert not layer._takes_the_band(ops.zeros((1, 9, N, H)), **taken)
    assert not layer._takes_the_band(ops.zeros((1, 10, N, H)), **dict(taken, cache=1))


def test_bad_arguments_are_named():
    q = np.zeros((1, 8, N, H), "float32")
    with pytest.raises(ValueError, match="window"):
        banded_attention(q, q, q, 0)
    with pytest.raises(ValueError, match="self-attention"):
        banded_attention(q, np.zeros((1, 9, N, H), "float32"), np.zeros((1, 9, N, H)), 4)


@pytest.mark.backends("jax")
def test_no_tensor_of_the_band_route_grows_with_length_squared():
    # The compiled program of a 1,024-token layer call, window 16: its largest
    # intermediate is the band's (B, N, T / 8, 8, 24) scores, nowhere T x T.
    import jax

    length = 1024
    layer = MultiHeadAttention(num_heads=N, key_dim=H, window=16)
    x = np.zeros((1, length, 8), "float32")
    layer(x[:, :32])  # built
    weights = [v.value for v in layer.trainable_variables]

    def call(weights, x):
        return layer.stateless_call(weights, [], x)[0]

    def sizes(jaxpr):  # every equation's outputs, nested programs included
        for equation in jaxpr.eqns:
            yield from (int(np.prod(v.aval.shape)) for v in equation.outvars
                        if hasattr(v.aval, "shape"))
            for param in equation.params.values():
                for inner in param if isinstance(param, (list, tuple)) else [param]:
                    inner = getattr(inner, "jaxpr", inner)
                    if hasattr(inner, "eqns"):
                        yield from sizes(inner)

    largest = max(sizes(jax.make_jaxpr(call)(weights, x).jaxpr))
    assert largest < length * length // 4, largest
    # The same call with the (T, S) mask route (a pairwise mask) does make them.
    masked = jax.make_jaxpr(lambda w, x: layer.stateless_call(
        w, [], x, attention_mask=np.ones((length, length), bool))[0])(weights, x)
    assert max(sizes(masked.jaxpr)) >= length * length
    assert keras.backend.backend() == "jax"
