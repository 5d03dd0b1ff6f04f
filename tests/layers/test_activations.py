import math

import keras
import numpy as np
import pytest

from keras_attn.layers import FeedForward
from keras_attn.layers import TransformerBlock
from keras_attn.layers import gelu
from keras_attn.layers.activations import serialize_activation
from test_case import to_numpy


def test_gelu_is_the_exact_gelu():
    x = np.linspace(-12.0, 12.0, 4001).astype("float64")
    want = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got = to_numpy(gelu(x.astype("float32"))).astype("float64")
    # 1 + erf(x / sqrt 2) cancels for x below about -5, where GELU is under
    # 1e-6: those round to about 0 (as in BERT's original code), hence atol.
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    # Keras's "gelu" (through erfc) computes the same function.
    keras_gelu = to_numpy(keras.activations.gelu(x.astype("float32"), approximate=False))
    np.testing.assert_allclose(got, keras_gelu, rtol=2e-6, atol=1e-6)
    # Never NaN at the extremes of float32.
    edge = np.array([-3e38, -1e4, 1e4, 3e38], "float32")
    np.testing.assert_array_equal(to_numpy(gelu(edge)), np.array([0.0, 0.0, 1e4, 3e38], "float32"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_keeps_half_precision(dtype):
    x = keras.ops.cast(np.linspace(-4, 4, 33).astype("float32"), dtype)
    out = gelu(x)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    want = to_numpy(gelu(np.linspace(-4, 4, 33).astype("float32")))
    np.testing.assert_allclose(to_numpy(keras.ops.cast(out, "float32")), want, atol=3e-2)


def test_layers_resolve_gelu_by_name_and_write_the_name_back():
    layer = FeedForward(8, activation="gelu")
    assert layer.activation is gelu
    assert layer.get_config()["activation"] == "gelu"
    assert FeedForward.from_config(layer.get_config()).activation is gelu
    block = TransformerBlock(num_heads=2, intermediate_dim=8, activation="gelu")
    assert block.get_config()["activation"] == "gelu"
    # Other activations go through Keras as before.
    assert serialize_activation(keras.activations.get("relu")) == "relu"
    assert FeedForward(8, activation="relu").get_config()["activation"] == "relu"


def test_gelu_as_a_plain_keras_activation_round_trips():
    # Used outside keras_attn's layers, it serializes by its registered name.
    dense = keras.layers.Dense(3, activation=gelu)
    restored = keras.layers.Dense.from_config(dense.get_config())
    x = np.linspace(-2, 2, 6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(to_numpy(restored.activation(x)), to_numpy(gelu(x)))
