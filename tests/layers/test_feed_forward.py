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


# === Gated (GeGLU / SwiGLU) ===


def test_layer_gated(tmp_path):
    run_layer_test(
        FeedForward,
        init_kwargs={"intermediate_dim": 12, "activation": "silu", "gated": True,
                     "use_bias": False, "activation_dropout": 0.1},
        input_data={"inputs": np.random.rand(2, 4, 6).astype("float32")},
        expected_output_shape=(2, 4, 6),
        expected_num_trainable_weights=2,
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize(
    "activation, fn",
    [
        ("gelu", lambda h: 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))),
        ("silu", lambda h: h / (1 + np.exp(-h))),
    ],
    ids=["geglu", "swiglu"],
)
def test_gated_values(activation, fn):
    """act(x W + b) * (x V + c): W is the first half of the input kernel's
    columns, V the second (ModernBERT's `Wi` order)."""
    layer = FeedForward(5, activation=activation, gated=True, bias_initializer="random_normal")
    x = np.random.rand(2, 3, 4).astype("float32") - 0.5
    out = to_numpy(layer(x))
    w, b = (to_numpy(t) for t in layer.intermediate_dense.weights)
    w2, b2 = (to_numpy(t) for t in layer.output_dense.weights)
    assert w.shape == (4, 10) and w2.shape == (5, 4)
    hidden = fn(x @ w[:, :5] + b[:5]) * (x @ w[:, 5:] + b[5:])
    np.testing.assert_allclose(out, hidden @ w2 + b2, atol=1e-5)


def test_gated_equals_transformers_modernbert_mlp():
    """ModernBERT's MLP weights copied as they are (Wi: (2F, D) -> our
    (D, 2F) kernel) give its outputs."""
    torch = pytest.importorskip("torch")
    modernbert = pytest.importorskip("transformers.models.modernbert.modeling_modernbert")
    from transformers import ModernBertConfig

    config = ModernBertConfig(hidden_size=6, intermediate_size=5, mlp_bias=True,
                              hidden_activation="gelu")
    theirs = modernbert.ModernBertMLP(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    layer = FeedForward(5, activation="gelu", gated=True)
    x = np.random.rand(2, 3, 6).astype("float32")
    layer(x)
    layer.set_weights([theirs.Wi.weight.detach().numpy().T, theirs.Wi.bias.detach().numpy(),
                       theirs.Wo.weight.detach().numpy().T, theirs.Wo.bias.detach().numpy()])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-5)


@pytest.mark.parametrize("gated", [1, "yes", None])
def test_gated_must_be_a_bool(gated):
    with pytest.raises(ValueError, match=r"`gated`.*Received: gated="):
        FeedForward(4, gated=gated)
