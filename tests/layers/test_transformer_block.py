import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import TransformerBlock
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(2)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_layer(norm_position, tmp_path):
    run_layer_test(
        TransformerBlock,
        init_kwargs={
            "num_heads": 2,
            "intermediate_dim": 12,
            "key_dim": 3,
            "value_dim": 4,
            "norm_position": norm_position,
            "activation": "gelu",
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "activation_dropout": 0.05,
            "layer_norm_epsilon": 1e-6,
            "use_causal_mask": True,
            "use_bias": False,
            "flash_attention": False,
            "kernel_initializer": "he_normal",
            "bias_initializer": "ones",
        },
        input_data={"inputs": rand(2, 5, 8), "padding_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)},
        expected_output_shape=(2, 5, 8),
        # 4 attention kernels, 2 FFN kernels, 2 LayerNorms x (gamma, beta)
        expected_num_trainable_weights=10,
        tmp_path=tmp_path,
    )


def test_layer_with_scores(tmp_path):
    run_layer_test(
        TransformerBlock,
        init_kwargs={"num_heads": 4, "intermediate_dim": 16, "activation": "silu"},
        input_data={"inputs": rand(2, 3, 8)},
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=((2, 3, 8), (2, 4, 3, 3)),
        expected_num_trainable_weights=16,
        tmp_path=tmp_path,
    )


def _sublayer_numpy(block, x):
    """The block's math written out from its own weights, no masks."""
    def ln(layer, y):
        mean = y.mean(-1, keepdims=True)
        var = y.var(-1, keepdims=True)
        return (y - mean) / np.sqrt(var + layer.epsilon) * to_numpy(layer.gamma) + to_numpy(layer.beta)

    def attention(y):
        mha = block.self_attention
        w = {name: [to_numpy(v) for v in getattr(mha, name).weights] for name in ("query_dense", "key_dense", "value_dense", "output_dense")}
        q = np.einsum("btd,dnh->btnh", y, w["query_dense"][0]) + w["query_dense"][1]
        k = np.einsum("btd,dnh->btnh", y, w["key_dense"][0]) + w["key_dense"][1]
        v = np.einsum("btd,dnh->btnh", y, w["value_dense"][0]) + w["value_dense"][1]
        logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("bnts,bsnh->btnh", probs, v)
        return np.einsum("btnh,nhd->btd", out, w["output_dense"][0]) + w["output_dense"][1]

    def ffn(y):
        w1, b1 = (to_numpy(v) for v in block.feed_forward.intermediate_dense.weights)
        w2, b2 = (to_numpy(v) for v in block.feed_forward.output_dense.weights)
        return np.maximum(y @ w1 + b1, 0) @ w2 + b2

    ln1, ln2 = block.self_attention_layer_norm, block.feed_forward_layer_norm
    if block.norm_position == "post":
        y = ln(ln1, x + attention(x))
        return ln(ln2, y + ffn(y))
    y = x + attention(ln(ln1, x))
    return y + ffn(ln(ln2, y))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_post_and_pre_norm_compute_the_reference_math(norm_position):
    block = TransformerBlock(num_heads=2, intermediate_dim=16, norm_position=norm_position)
    x = rand(2, 4, 8)
    out = to_numpy(block(x))
    np.testing.assert_allclose(out, _sublayer_numpy(block, x), atol=1e-5)


def test_implicit_keras_mask_equals_explicit_padding_mask():
    tokens = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 0]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    block = TransformerBlock(num_heads=2, intermediate_dim=16)
    inputs = keras.Input((5,), dtype="int32")
    implicit = keras.Model(inputs, block(embedding(inputs)))
    explicit = block(ops.convert_to_tensor(to_numpy(embedding(tokens))), padding_mask=tokens != 0)
    got, want = to_numpy(implicit(tokens)), to_numpy(explicit)
    np.testing.assert_allclose(got, want, atol=1e-6)
    no_mask = to_numpy(block(ops.convert_to_tensor(to_numpy(embedding(tokens)))))
    assert np.abs(no_mask[0, :3] - want[0, :3]).max() > 1e-4


def test_mask_propagates_through_stacked_blocks():
    tokens = np.array([[5, 6, 0, 0]])
    inputs = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    x = TransformerBlock(num_heads=2, intermediate_dim=16)(x)
    x = TransformerBlock(num_heads=2, intermediate_dim=16)(x)
    stacked = keras.Model(inputs, x)
    # the second block must see the mask too: padding content cannot leak
    changed = np.array([[5, 6, 0, 0]])
    a = to_numpy(stacked(tokens))
    np.testing.assert_allclose(a, to_numpy(stacked(changed)))
    assert x._keras_mask is not None


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(norm_position, causal):
    block = TransformerBlock(num_heads=2, intermediate_dim=16, norm_position=norm_position, use_causal_mask=causal)
    x = rand(2, 4, 8)
    short = to_numpy(block(x))
    padded = np.concatenate([x, rand(2, 3, 8) * 100], axis=1)
    mask = np.repeat(np.arange(7)[None] < 4, 2, axis=0)
    np.testing.assert_allclose(to_numpy(block(padded, padding_mask=mask))[:, :4], short, atol=1e-5)


def test_causality():
    block = TransformerBlock(num_heads=2, intermediate_dim=16, use_causal_mask=True)
    x = rand(1, 6, 8)
    changed = x.copy()
    changed[:, 3:] = rand(1, 3, 8)
    a, b = to_numpy(block(x)), to_numpy(block(changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert np.abs(a[:, 3:] - b[:, 3:]).max() > 1e-3


def test_unknown_norm_position():
    with pytest.raises(ValueError, match=r"Received: norm_position='middle'"):
        TransformerBlock(num_heads=2, intermediate_dim=8, norm_position="middle")


def test_unknown_activation():
    with pytest.raises(ValueError, match=r"Received: activation='relu6x'"):
        TransformerBlock(num_heads=2, intermediate_dim=8, activation="relu6x")


def test_hidden_size_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"divisible by `num_heads` \(num_heads=3\). Received: hidden size=8"):
        TransformerBlock(num_heads=3, intermediate_dim=8)(rand(1, 2, 8))


@pytest.mark.parametrize("name", ["dropout", "attention_dropout", "activation_dropout"])
def test_rates_out_of_range(name):
    with pytest.raises(ValueError, match=rf"Received: {name}=1.0"):
        TransformerBlock(num_heads=2, intermediate_dim=8, **{name: 1.0})


def test_non_positive_layer_norm_epsilon():
    with pytest.raises(ValueError, match=r"Received: layer_norm_epsilon=0"):
        TransformerBlock(num_heads=2, intermediate_dim=8, layer_norm_epsilon=0)


def test_padding_mask_of_wrong_shape():
    block = TransformerBlock(num_heads=2, intermediate_dim=8)
    with pytest.raises(ValueError, match=r"query_mask.*Received: query_mask.shape=\(2, 4\)"):
        block(rand(2, 5, 8), padding_mask=np.ones((2, 4), bool))


def test_bad_flash_attention_flag_at_construction():
    with pytest.raises(ValueError, match=r"Received: flash_attention='auto'"):
        TransformerBlock(num_heads=2, intermediate_dim=8, flash_attention="auto")


# === ModernBERT's options: rotary positions, a gated FFN, no biases ===


def test_layer_rotary_gated_local_without_biases(tmp_path):
    run_layer_test(
        TransformerBlock,
        init_kwargs={"num_heads": 2, "intermediate_dim": 12, "norm_position": "pre",
                     "activation": "gelu", "use_bias": False, "rotary_theta": 160000.0,
                     "gated": True, "window": 2, "layer_norm_center": False},
        input_data={"inputs": rand(2, 5, 8),
                    "segment_ids": np.array([[1, 1, 1, 2, 2], [1, 1, 1, 1, 0]], "int32")},
        expected_output_shape=(2, 5, 8),
        # 4 attention kernels, 2 FFN kernels (the first 2F wide), 2 LayerNorms' gammas:
        # not one bias
        expected_num_trainable_weights=8,
        tmp_path=tmp_path,
    )


def test_options_reach_the_sublayers():
    block = TransformerBlock(num_heads=2, intermediate_dim=6, use_bias=False,
                             rotary_theta=10000.0, gated=True, activation="silu")
    x = ops.convert_to_tensor(rand(2, 4, 8))
    block(x)
    assert block.self_attention.rotary_theta == 10000.0 and not block.self_attention.use_bias
    assert block.feed_forward.gated and not block.feed_forward.use_bias
    assert block.self_attention.window is None
    assert block.self_attention_layer_norm.center and block.feed_forward_layer_norm.center
    assert to_numpy(block.feed_forward.intermediate_dense.kernel).shape == (8, 12)
    # The block is the two sublayers wired as post-norm says.
    ln1, ln2 = block.self_attention_layer_norm, block.feed_forward_layer_norm
    y = ln1(x + block.self_attention(x))
    np.testing.assert_allclose(to_numpy(block(x)), to_numpy(ln2(y + block.feed_forward(y))),
                               atol=1e-5)


def test_rotary_block_padding_invariance_and_positions():
    """Padding at the end changes nothing; a packed row equals each example
    alone, with positions given or implied by the segment ids."""
    block = TransformerBlock(num_heads=2, intermediate_dim=12, norm_position="pre",
                             rotary_theta=100.0, gated=True, activation="gelu")
    a, b = rand(1, 4, 8), rand(1, 3, 8)
    alone = [to_numpy(block(x))[0] for x in (a, b)]
    padded = np.concatenate([a, rand(1, 2, 8)], axis=1)
    got = to_numpy(block(padded, padding_mask=np.array([[1, 1, 1, 1, 0, 0]], bool)))
    np.testing.assert_allclose(got[0, :4], alone[0], atol=1e-5)
    row = np.concatenate([a, b, rand(1, 1, 8)], axis=1)
    ids = np.array([[1, 1, 1, 1, 2, 2, 2, 0]], "int32")
    for kwargs in ({}, {"positions": np.array([[0, 1, 2, 3, 0, 1, 2, 0]])}):
        got = to_numpy(block(row, segment_ids=ids, **kwargs))[0]
        np.testing.assert_allclose(got[:4], alone[0], atol=1e-5)
        np.testing.assert_allclose(got[4:7], alone[1], atol=1e-5)


def test_layer_without_attention_norm(tmp_path):
    run_layer_test(
        TransformerBlock,
        init_kwargs={"num_heads": 2, "intermediate_dim": 6, "norm_position": "pre",
                     "activation": "gelu", "dropout": 0.1, "layer_norm_epsilon": 1e-6,
                     "use_bias": False, "layer_norm_center": False, "gated": True,
                     "rotary_theta": 500.0, "window": 4, "attention_norm": False},
        input_data={"inputs": rand(2, 7, 8),
                    "padding_mask": np.array([[1] * 7, [1] * 4 + [0] * 3], bool)},
        expected_output_shape=(2, 7, 8),
        # 4 attention kernels, 2 feed-forward kernels, the feed-forward LayerNorm's gamma
        expected_num_trainable_weights=7,
        tmp_path=tmp_path,
    )


def test_without_attention_norm_the_attention_reads_the_input_as_it_is():
    """ModernBERT's first block: x + MHA(x), then the normalised FFN."""
    block = TransformerBlock(num_heads=2, intermediate_dim=6, norm_position="pre",
                             attention_norm=False)
    x = ops.convert_to_tensor(rand(1, 5, 8))
    block(x)
    assert block.self_attention_layer_norm is None
    y = x + block.self_attention(x)
    want = y + block.feed_forward(block.feed_forward_layer_norm(y))
    np.testing.assert_allclose(to_numpy(block(x)), to_numpy(want), atol=1e-5)
    assert TransformerBlock(num_heads=2, intermediate_dim=6).get_config()["attention_norm"]


# === DINOv2's option: LayerScale ===


def test_layer_with_layer_scale_and_swiglu(tmp_path):
    run_layer_test(
        TransformerBlock,
        init_kwargs={"num_heads": 2, "intermediate_dim": 12, "norm_position": "pre",
                     "activation": "silu", "gated": True, "layer_scale_init": 0.5},
        input_data={"inputs": rand(2, 5, 8),
                    "padding_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)},
        expected_output_shape=(2, 5, 8),
        # 4 attention kernels and biases, 2 FFN kernels and biases, 2 LayerNorms x
        # (gamma, beta), 2 LayerScale vectors
        expected_num_trainable_weights=18,
        tmp_path=tmp_path,
    )


def test_layer_scale_multiplies_each_sublayer_output():
    block = TransformerBlock(num_heads=2, intermediate_dim=6, norm_position="pre",
                             layer_scale_init=1e-5)
    x = ops.convert_to_tensor(rand(2, 4, 8))
    block(x)
    np.testing.assert_allclose(to_numpy(block.self_attention_layer_scale), 1e-5)
    gamma1, gamma2 = rand(8), rand(8)
    block.self_attention_layer_scale.assign(gamma1)
    block.feed_forward_layer_scale.assign(gamma2)
    ln1, ln2 = block.self_attention_layer_norm, block.feed_forward_layer_norm
    y = x + ops.convert_to_tensor(gamma1) * block.self_attention(ln1(x))
    want = y + ops.convert_to_tensor(gamma2) * block.feed_forward(ln2(y))
    np.testing.assert_allclose(to_numpy(block(x)), to_numpy(want), atol=1e-5)
    assert TransformerBlock(num_heads=2, intermediate_dim=6).get_config()["layer_scale_init"] is None


@pytest.mark.parametrize("kwargs, match", [
    ({"layer_scale_init": 0.0}, r"Received: layer_scale_init=0.0"),
    ({"rotary_theta": -1.0}, r"Received: rotary_theta=-1.0"),
    ({"rotary_theta": 1e4, "key_dim": 3}, r"even query/key head size.*Received: key_dim=3"),
    ({"gated": "yes"}, r"Received: gated='yes'"),
    ({"window": 0}, r"Received: window=0"),
    ({"layer_norm_center": 0}, r"Received: layer_norm_center=0"),
    ({"attention_norm": "no", "norm_position": "pre"}, r"Received: attention_norm='no'"),
    ({"attention_norm": False}, r"Received: attention_norm=False, norm_position='post'"),
])
def test_bad_options_are_refused_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerBlock(num_heads=2, intermediate_dim=4, **kwargs)
