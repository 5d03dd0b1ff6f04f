import numpy as np
import pytest

from keras_attn.layers import FeedForward
from test_case import run_layer_test
from test_case import to_numpy


def test_layer(tmp_path):
    run_layer_test(
        FeedForward,
        init_kwargs={
            "intermediate_dim": 12,
            "activation": "gelu",
            "dropout": 0.1,
            "activation_dropout": 0.2,
            "output_dim": 5,
            "kernel_initializer": "he_uniform",
        },
        input_data={"inputs": np.random.rand(2, 4, 6).astype("float32")},
        expected_output_shape=(2, 4, 5),
        expected_num_trainable_weights=4,
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize(
    "activation, fn",
    [
        ("relu", lambda h: np.maximum(h, 0)),
        ("swish", lambda h: h / (1 + np.exp(-h))),
    ],
)
def test_values(activation, fn):
    layer = FeedForward(7, activation=activation)
    x = np.random.rand(2, 3, 4).astype("float32") - 0.5
    out = to_numpy(layer(x))
    w1, b1 = (to_numpy(w) for w in layer.intermediate_dense.weights)
    w2, b2 = (to_numpy(w) for w in layer.output_dense.weights)
    np.testing.assert_allclose(out, fn(x @ w1 + b1) @ w2 + b2, atol=1e-5)


def test_gelu_is_exact_erf():
    from math import erf

    layer = FeedForward(3, activation="gelu", kernel_initializer="ones", use_bias=False)
    x = np.array([[[0.7]]], "float32")
    hidden = 0.5 * 0.7 * (1 + erf(0.7 / np.sqrt(2)))
    np.testing.assert_allclose(to_numpy(layer(x))[0, 0, 0], 3 * hidden, atol=1e-6)


def test_unknown_activation():
    with pytest.raises(ValueError, match=r"Received: activation='gelux'"):
        FeedForward(4, activation="gelux")


def test_non_positive_intermediate_dim():
    with pytest.raises(ValueError, match=r"Received: intermediate_dim=0"):
        FeedForward(0)
