import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import MultiHeadAttention
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def test_layer_self_attention(tmp_path):
    run_layer_test(
        MultiHeadAttention,
        init_kwargs={
            "num_heads": 3,
            "key_dim": 5,
            "value_dim": 7,
            "output_dim": 6,
            "dropout": 0.1,
            "use_bias": False,
            "flash_attention": False,
            "kernel_initializer": "he_normal",
            "seed": 3,
        },
        input_data={"query": rand(2, 4, 8)},
        call_kwargs={"use_causal_mask": True},
        expected_output_shape=(2, 4, 6),
        expected_num_trainable_weights=4,
        tmp_path=tmp_path,
    )


def test_layer_cross_attention_with_scores(tmp_path):
    run_layer_test(
        MultiHeadAttention,
        init_kwargs={"num_heads": 2, "bias_initializer": "ones"},
        input_data={
            "query": rand(2, 4, 8),
            "value": rand(2, 6, 10),
            "value_mask": np.array([[1, 1, 1, 0, 0, 0], [1] * 6], bool),
        },
        call_kwargs={"return_attention_scores": True},
        expected_output_shape=((2, 4, 8), (2, 2, 4, 6)),
        expected_num_trainable_weights=8,
        tmp_path=tmp_path,
    )


def test_implicit_keras_mask_equals_explicit_mask():
    tokens = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 0]])
    inputs = keras.Input((5,), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    attention = MultiHeadAttention(num_heads=2)
    implicit = keras.Model(inputs, attention(embedding(inputs)))

    padding = tokens != 0
    embedded = embedding(tokens)  # mask-free copy of the same weights' output
    explicit = attention(
        ops.convert_to_tensor(to_numpy(embedded)), query_mask=padding, value_mask=padding
    )
    np.testing.assert_allclose(
        to_numpy(implicit(tokens)), to_numpy(explicit), atol=1e-6
    )
    # And the mask really changes the result at real positions.
    unmasked = attention(ops.convert_to_tensor(to_numpy(embedded)))
    assert np.abs(to_numpy(unmasked)[0, :3] - to_numpy(explicit)[0, :3]).max() > 1e-4


def test_implicit_cross_attention_masks():
    q_tokens = np.array([[1, 2, 0]])
    v_tokens = np.array([[4, 5, 6, 0, 0]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    attention = MultiHeadAttention(num_heads=2)
    q_in = keras.Input((3,), dtype="int32")
    v_in = keras.Input((5,), dtype="int32")
    model = keras.Model([q_in, v_in], attention(embedding(q_in), embedding(v_in)))
    q, v = to_numpy(embedding(q_tokens)), to_numpy(embedding(v_tokens))
    explicit = attention(q, v, query_mask=q_tokens != 0, value_mask=v_tokens != 0)
    np.testing.assert_allclose(
        to_numpy(model([q_tokens, v_tokens])), to_numpy(explicit), atol=1e-6
    )


@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(causal):
    attention = MultiHeadAttention(num_heads=2)
    x = rand(2, 5, 8)
    short = attention(x, use_causal_mask=causal)
    padded_x = np.concatenate([x, rand(2, 4, 8)], axis=1)
    mask = np.arange(9)[None, :] < 5
    mask = np.repeat(mask, 2, axis=0)
    padded = attention(padded_x, query_mask=mask, value_mask=mask, use_causal_mask=causal)
    np.testing.assert_allclose(to_numpy(padded)[:, :5], to_numpy(short), atol=1e-5)
    # Padded queries get exactly zero attention output before W^O: the
    # output there is the output bias alone.
    bias = to_numpy(attention.output_dense.bias)
    np.testing.assert_allclose(to_numpy(padded)[:, 5:], np.broadcast_to(bias, (2, 4, 8)), atol=1e-6)


def test_causality():
    attention = MultiHeadAttention(num_heads=2)
    x = rand(1, 6, 8)
    changed = x.copy()
    changed[:, 4:] = rand(1, 2, 8)
    a = to_numpy(attention(x, use_causal_mask=True))
    b = to_numpy(attention(changed, use_causal_mask=True))
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-3


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "both"])
def test_fused_path_equals_explicit_path(mask_kind):
    attention = MultiHeadAttention(num_heads=4, key_dim=6)
    x = rand(3, 7, 16)
    mask = np.arange(7)[None, :] < np.array([[7], [4], [1]])
    kwargs = {}
    if mask_kind in ("padding", "both"):
        kwargs.update(query_mask=mask, value_mask=mask)
    if mask_kind in ("causal", "both"):
        kwargs["use_causal_mask"] = True
    fused = attention(x, **kwargs)
    explicit, _ = attention(x, return_attention_scores=True, **kwargs)
    np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), atol=1e-5)


def test_scores_are_probabilities_with_zero_on_masked_keys():
    attention = MultiHeadAttention(num_heads=2)
    value_mask = np.array([[True, True, False, True, False]])
    _, scores = attention(rand(1, 3, 8), rand(1, 5, 8), value_mask=value_mask,
                          return_attention_scores=True)
    scores = to_numpy(scores)
    np.testing.assert_array_equal(scores[..., ~value_mask[0]], 0.0)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)


def test_attention_dropout_only_in_training():
    attention = MultiHeadAttention(num_heads=2, dropout=0.5, seed=1)
    x = rand(2, 6, 8)
    a = to_numpy(attention(x, training=False))
    b = to_numpy(attention(x, training=False))
    np.testing.assert_array_equal(a, b)
    c = to_numpy(attention(x, training=True))
    assert np.abs(a - c).max() > 1e-4


@pytest.mark.parametrize(
    "causal, dims, portable", [(True, {}, False), (False, {}, False),
                               (True, {"key_dim": 3, "value_dim": 5}, False),
                               (True, {}, True), (False, {"key_dim": 3, "value_dim": 5}, True)]
)
def test_cached_self_attention_equals_full_pass(causal, dims, portable):
    # key_dim != value_dim: the cache holds both zero-padded to the larger.
    # portable: the cache written by a gather and a select (ONNX / LiteRT).
    attention = MultiHeadAttention(num_heads=2, **dims)
    attention.portable_cache_write = portable
    x = rand(2, 6, 8)
    attention(x)  # build
    full = to_numpy(attention(x, use_causal_mask=True))
    cache = attention.empty_cache(2, 6)
    steps = []
    # Feed 2 tokens, then 1 at a time: chunks of any size work.
    for start, stop in ((0, 2), (2, 3), (3, 4), (4, 5), (5, 6)):
        out, cache = attention(
            x[:, start:stop], cache=cache, cache_update_index=start, use_causal_mask=causal
        )
        steps.append(to_numpy(out))
    incremental = np.concatenate(steps, axis=1)
    if causal:
        np.testing.assert_allclose(incremental, full, atol=1e-5)
    else:
        # Without the causal flag a chunk sees its own later tokens but never
        # the unwritten cache slots: single-token steps equal the causal pass.
        np.testing.assert_allclose(incremental[:, 2:], full[:, 2:], atol=1e-5)


@pytest.mark.parametrize("dims", [{}, {"key_dim": 6, "value_dim": 2}])
def test_cross_attention_cache_equals_recomputing(dims):
    attention = MultiHeadAttention(num_heads=2, **dims)
    q, enc = rand(2, 3, 8), rand(2, 5, 8)
    expected = to_numpy(attention(q, enc))
    cache = attention.compute_key_value_cache(enc)
    assert tuple(cache.shape) == (2, 2, 5, 2, max(dims.values(), default=4))
    out, _ = attention(q, q, cache=cache)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-6)


# === Bad input: each misuse has its own message ===


@pytest.mark.parametrize("num_heads", [0, -2])
def test_non_positive_num_heads(num_heads):
    with pytest.raises(ValueError, match=rf"Received: num_heads={num_heads}"):
        MultiHeadAttention(num_heads=num_heads)


@pytest.mark.parametrize("num_heads", [2.0, "4", True])
def test_num_heads_not_an_int(num_heads):
    with pytest.raises(ValueError, match=r"positive integer. Received: num_heads="):
        MultiHeadAttention(num_heads=num_heads)


def test_width_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"divisible by `num_heads`.*Received: query width=10"):
        MultiHeadAttention(num_heads=4)(rand(1, 3, 10))


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_dropout_out_of_range(rate):
    with pytest.raises(ValueError, match=rf"\[0, 1\). Received: dropout={rate}"):
        MultiHeadAttention(num_heads=2, dropout=rate)


def test_non_positive_key_dim():
    with pytest.raises(ValueError, match=r"Received: key_dim=0"):
        MultiHeadAttention(num_heads=2, key_dim=0)


def test_bad_flash_attention_flag():
    with pytest.raises(ValueError, match=r"Received: flash_attention='yes'"):
        MultiHeadAttention(num_heads=2, flash_attention="yes")


def test_attention_mask_that_does_not_broadcast():
    attention = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"`attention_mask` must broadcast to \(B, N, T, S\) = \(2, 2, 4, 5\)\. Received: attention_mask.shape=\(2, 4, 3\)"):
        attention(rand(2, 4, 8), rand(2, 5, 8), attention_mask=np.ones((2, 4, 3), bool))


def test_padding_mask_of_wrong_length():
    attention = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"value_mask.*Received: value_mask.shape=\(2, 4\)"):
        attention(rand(2, 4, 8), rand(2, 5, 8), value_mask=np.ones((2, 4), bool))


def test_key_value_length_mismatch():
    attention = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"lengths S of `key` and `value` must be equal. Received: key.shape=\(2, 3, 8\)"):
        attention(rand(2, 4, 8), rand(2, 5, 8), rand(2, 3, 8))


def test_query_of_wrong_rank():
    with pytest.raises(ValueError, match=r"rank 3.*Received: query.shape=\(4, 8\)"):
        MultiHeadAttention(num_heads=2)(rand(4, 8))


def test_cache_index_without_cache():
    attention = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"needs a `cache`.*cache_update_index=3"):
        attention(rand(1, 1, 8), cache_update_index=3)


def test_callers_tensor_keeps_its_mask():
    from keras_attn.ops.masking import get_keras_mask

    x = keras.layers.Embedding(10, 8, mask_zero=True)(np.array([[1, 2, 0]]))
    MultiHeadAttention(num_heads=2)(x)
    np.testing.assert_array_equal(to_numpy(get_keras_mask(x)), [[True, True, False]])


# === Rotary position embeddings (rotary_theta) ===


def test_layer_with_rotary_positions_and_window(tmp_path):
    run_layer_test(
        MultiHeadAttention,
        init_kwargs={"num_heads": 2, "key_dim": 6, "use_bias": False,
                     "rotary_theta": 500.0, "window": 2, "flash_attention": False},
        input_data={"query": rand(2, 5, 8),
                    "segment_ids": np.array([[1, 1, 2, 2, 2], [1, 1, 1, 1, 0]], "int32")},
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=4,
        tmp_path=tmp_path,
    )


def _rotate_half_reference(x, positions, theta):
    """`(B, T, N, H)` turned as transformers' Llama / ModernBERT do it,
    written out in NumPy float64."""
    h = x.shape[-1]
    inverse = theta ** (-np.arange(0, h, 2) / h)
    angles = positions[..., None] * inverse  # (B, T, H/2)
    angles = np.concatenate([angles, angles], -1)[:, :, None]  # (B, T, 1, H)
    half = np.concatenate([-x[..., h // 2:], x[..., : h // 2]], -1)
    return x * np.cos(angles) + half * np.sin(angles)


def test_rotary_scores_are_the_rotated_projections():
    """The scores are softmax(rot(q) . rot(k) / sqrt(H)) with q and k the
    projections, each turned at its own position (0..T-1)."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, rotary_theta=100.0)
    x = rand(2, 6, 8)
    _, scores = layer(x, return_attention_scores=True)
    positions = np.broadcast_to(np.arange(6.0), (2, 6))
    q = _rotate_half_reference(to_numpy(layer.query_dense(x)).astype("float64"), positions, 100.0)
    k = _rotate_half_reference(to_numpy(layer.key_dense(x)).astype("float64"), positions, 100.0)
    logits = np.einsum("btnh,bsnh->bnts", q, k) / 2.0
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(scores), expected, atol=1e-5)


def test_rotary_equals_transformers_modernbert():
    """Our rotation of random queries and keys equals transformers'
    ModernBERT rotary embedding + apply_rotary_pos_emb, for its global and
    local thetas, at float32 round-off."""
    torch = pytest.importorskip("torch")
    modernbert = pytest.importorskip("transformers.models.modernbert.modeling_modernbert")
    from transformers import ModernBertConfig

    from keras_attn.ops.rotary import apply_rotary

    config = ModernBertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=3,
                              global_rope_theta=160000.0, local_rope_theta=10000.0)
    rotary = modernbert.ModernBertRotaryEmbedding(config)
    q, k = rand(2, 2, 40, 16), rand(2, 2, 40, 16)  # (B, N, T, H), transformers' layout
    position_ids = np.stack([np.arange(40), np.arange(100, 140)])
    for layer_type in ("full_attention", "sliding_attention"):
        theta = config.rope_parameters[layer_type]["rope_theta"]
        cos, sin = rotary(torch.from_numpy(q), torch.from_numpy(position_ids), layer_type)
        expected = modernbert.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k),
                                                   cos, sin)
        for theirs, x in zip(expected, (q, k)):
            ours = apply_rotary(np.transpose(x, (0, 2, 1, 3)), position_ids, theta)
            np.testing.assert_allclose(np.transpose(to_numpy(ours), (0, 2, 1, 3)),
                                       theirs.numpy(), atol=1e-5, err_msg=layer_type)


def test_rotary_packed_row_equals_each_sequence_alone():
    """Positions restart with each example: from the segment ids, or given."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, rotary_theta=50.0)
    a, b = rand(1, 3, 8), rand(1, 4, 8)
    row = np.concatenate([a, b, rand(1, 2, 8)], axis=1)
    ids = np.array([[1, 1, 1, 2, 2, 2, 2, 0, 0]], "int32")
    positions = np.array([[0, 1, 2, 0, 1, 2, 3, 0, 0]], "int32")
    alone = [to_numpy(layer(x))[0] for x in (a, b)]
    for kwargs in ({}, {"positions": positions}):
        packed = to_numpy(layer(row, segment_ids=ids, **kwargs))[0]
        np.testing.assert_allclose(packed[:3], alone[0], atol=1e-5)
        np.testing.assert_allclose(packed[3:7], alone[1], atol=1e-5)
    # The rotation is there: without it the same weights answer otherwise.
    unrotated = MultiHeadAttention(num_heads=2, key_dim=4)
    unrotated(b)
    unrotated.set_weights(layer.get_weights())
    assert np.abs(to_numpy(unrotated(b))[0] - alone[1]).max() > 1e-3


def test_rotary_scores_depend_on_distance_only():
    """RoPE's point: the same tokens at positions 32..36 (written into a
    cache whose first 32 slots are masked) get the scores they get at
    0..4."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, rotary_theta=10000.0)
    x = rand(1, 5, 8)
    _, near = layer(x, return_attention_scores=True, use_causal_mask=True)
    unwritten = np.broadcast_to(np.arange(37) >= 32, (1, 5, 37))
    _, far, _ = layer(x, cache=layer.empty_cache(1, 37), cache_update_index=32,
                      attention_mask=unwritten, return_attention_scores=True,
                      use_causal_mask=True)
    np.testing.assert_allclose(to_numpy(far)[..., 32:], to_numpy(near), atol=1e-5)


@pytest.mark.parametrize("options, portable, length", [
    ({"rotary_theta": 1000.0}, False, 5),
    ({"rotary_theta": 1000.0}, True, 5),
    ({"rotary_theta": 1000.0, "window": 4}, False, 6),
])
def test_rotary_and_window_cached_decoding_equals_full_pass(options, portable, length):
    attention = MultiHeadAttention(num_heads=2, **options)
    attention.portable_cache_write = portable
    x = rand(2, length, 8)
    full = to_numpy(attention(x, use_causal_mask=True))
    cache = attention.empty_cache(2, length)
    steps = []
    for start, stop in ((0, 2), (2, 3), (3, length)):
        out, cache = attention(x[:, start:stop], cache=cache, cache_update_index=start,
                               use_causal_mask=True)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_rotary_cross_attention_cache_equals_recomputing():
    attention = MultiHeadAttention(num_heads=2, rotary_theta=1000.0)
    q, enc = rand(2, 3, 8), rand(2, 5, 8)
    expected = to_numpy(attention(q, enc))
    out, _ = attention(q, q, cache=attention.compute_key_value_cache(enc))
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-6)


@pytest.mark.parametrize("theta", [0, -1.0, float("inf"), float("nan"), True, "10000"])
def test_bad_rotary_theta(theta):
    with pytest.raises(ValueError, match=r"`rotary_theta`.*Received: rotary_theta="):
        MultiHeadAttention(num_heads=2, rotary_theta=theta)


def test_rotary_needs_an_even_head_size():
    with pytest.raises(ValueError, match=r"even query/key head size.*Received: key_dim=5"):
        MultiHeadAttention(num_heads=2, key_dim=5, rotary_theta=10000.0)
    with pytest.raises(ValueError, match=r"even query/key head size.*Received: key_dim=3"):
        MultiHeadAttention(num_heads=2, rotary_theta=10000.0)(rand(1, 2, 6))


def test_positions_are_refused_where_they_mean_nothing():
    with pytest.raises(ValueError, match=r"`positions`.*rotary_theta=None"):
        MultiHeadAttention(num_heads=2)(rand(1, 3, 8), positions=np.array([[0, 1, 2]]))
    layer = MultiHeadAttention(num_heads=2, rotary_theta=100.0)
    with pytest.raises(ValueError, match=r"`positions`: positions restart at 0"):
        layer(rand(1, 3, 8), positions=np.array([[0, 2, 3]]))
    with pytest.raises(ValueError, match=r"`positions`: cached decoding"):
        layer(rand(1, 1, 8), cache=layer.empty_cache(1, 4), cache_update_index=0,
              positions=np.array([[0]]))


# === Local (sliding-window) attention ===


def test_window_is_transformers_sliding_window():
    """`window=w` sees what transformers' bidirectional sliding window of
    ModernBERT (`local_attention=w`, `sliding_window = w // 2`) sees."""
    torch = pytest.importorskip("torch")
    masking_utils = pytest.importorskip("transformers.masking_utils")
    from keras_attn.ops.masking import local_mask

    for window in (2, 4, 7):
        theirs = masking_utils.sliding_window_bidirectional_overlay(window // 2)
        i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
        expected = theirs(0, 0, i, j).numpy()
        np.testing.assert_array_equal(to_numpy(local_mask(9, 9, window)), expected)


def test_window_equals_the_band_as_an_attention_mask():
    """With padding and packing: a window is one more mask, the band."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, rotary_theta=100.0, window=2)
    x = rand(2, 7, 8)
    band = np.abs(np.arange(7)[:, None] - np.arange(7)[None]) <= 1
    ids = np.array([[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1]], "int32")
    got = to_numpy(layer(x, segment_ids=ids))
    plain = MultiHeadAttention(num_heads=2, key_dim=4, rotary_theta=100.0)
    plain(x)
    plain.set_weights(layer.get_weights())
    expected = to_numpy(plain(x, segment_ids=ids, attention_mask=band))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert np.abs(to_numpy(plain(x, segment_ids=ids)) - expected).max() > 1e-3
    # A packed row is each example alone, the window inside each example.
    np.testing.assert_allclose(got[0, :4], to_numpy(layer(x[:1, :4]))[0], atol=1e-5)
    np.testing.assert_allclose(got[0, 4:6], to_numpy(layer(x[:1, 4:6]))[0], atol=1e-5)


@pytest.mark.parametrize("window", [0, -4, 2.0, True])
def test_bad_window(window):
    with pytest.raises(ValueError, match=r"Received: window="):
        MultiHeadAttention(num_heads=2, window=window)
