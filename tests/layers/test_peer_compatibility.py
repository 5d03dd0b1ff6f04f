"""Our layers held against the peers they stand beside, installed here:
`keras.layers.MultiHeadAttention` and keras-hub's `TransformerEncoder`,
`TransformerDecoder`, `PositionEmbedding` and `SinePositionEncoding`.

With the peer's weights copied in, the outputs agree, for every mask rank
Keras accepts, and the cache calls of keras-hub's decoder work unchanged;
what Keras refuses we refuse (docs/compatibility.md lists every argument).
"""

import re

import keras
import keras_hub
import numpy as np
import pytest

from keras_attn.layers import MultiHeadAttention
from keras_attn.layers import PositionEmbedding
from keras_attn.layers import SinusoidalPositionalEncoding
from keras_attn.layers import TransformerBlock
from keras_attn.layers import TransformerDecoderBlock
from test_case import to_numpy

RNG = np.random.default_rng(3)
B, T, S, D, N, H = 2, 5, 6, 8, 2, 4
ATOL = 2e-5


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def copy_attention(ours, theirs):
    """Keras's MHA -> ours: the same four EinsumDense layouts."""
    for mine, peer in ((ours.query_dense, theirs._query_dense),
                       (ours.key_dense, theirs._key_dense),
                       (ours.value_dense, theirs._value_dense),
                       (ours.output_dense, theirs._output_dense)):
        mine.set_weights(peer.get_weights())


def peer_attention_pair(**kwargs):
    theirs = keras.layers.MultiHeadAttention(num_heads=N, key_dim=H, **kwargs)
    ours = MultiHeadAttention(num_heads=N, key_dim=H, **kwargs)
    theirs.build((B, T, D), (B, S, D))
    ours.build((B, T, D), (B, S, D))
    copy_attention(ours, theirs)
    return ours, theirs


def assert_close(a, b, atol=ATOL):
    np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=atol, rtol=0)


# === MultiHeadAttention ===

@pytest.mark.parametrize("rank", [None, 2, 3, 4])
def test_mha_equals_keras_for_every_mask_rank(rank):
    ours, theirs = peer_attention_pair()
    query, value = rand(B, T, D), rand(B, S, D)
    full = RNG.random((B, N, T, S)) > 0.3
    full[..., 0] = True  # every query sees a key
    mask = {None: None, 2: full[0, 0], 3: full[:, 0], 4: full}[rank]
    kwargs = {} if mask is None else {"attention_mask": mask}
    want, want_scores = theirs(query, value, return_attention_scores=True, **kwargs)
    got, got_scores = ours(query, value, return_attention_scores=True, **kwargs)
    assert_close(got, want)
    assert_close(got_scores, want_scores)
    # The fused route (no scores asked for) agrees too.
    assert_close(ours(query, value, **kwargs), want)


def test_mha_causal_and_implicit_masks_equal_keras():
    """Every real query agrees; a padded query is the one difference kept on
    purpose: ours returns zeros there (a row with no visible key is zeros,
    never an average of padding), Keras a uniform average of the values."""
    ours, theirs = peer_attention_pair()
    ids = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 0]])
    real = ids > 0
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    x = embedding(ids)
    got = to_numpy(ours(x, x, use_causal_mask=True))
    want = to_numpy(theirs(x, x, use_causal_mask=True))
    assert_close(got[real], want[real])
    assert np.all(got[~real] == 0)


def test_mha_output_shape_and_compute_output_shape_like_keras():
    theirs = keras.layers.MultiHeadAttention(num_heads=N, key_dim=H, output_shape=(7,))
    ours = MultiHeadAttention(num_heads=N, key_dim=H, output_shape=(7,))
    for layer in (theirs, ours):
        assert tuple(layer(rand(B, T, D), rand(B, S, D)).shape) == (B, T, 7)
        assert tuple(layer.compute_output_shape((B, T, D), (B, S, D))) == (B, T, 7)
    assert ours.get_config()["output_dim"] == 7
    assert MultiHeadAttention(num_heads=N, output_shape=5).output_dim == 5
    with pytest.raises(ValueError, match=r"one axis.*Received: output_shape=\(3, 4\)"):
        MultiHeadAttention(num_heads=N, output_shape=(3, 4))
    with pytest.raises(ValueError, match=r"not both.*output_dim=4, output_shape=4"):
        MultiHeadAttention(num_heads=N, output_dim=4, output_shape=4)
    with pytest.raises(ValueError, match=r"argument `output_shape`.*Received: output_shape=0"):
        MultiHeadAttention(num_heads=N, output_shape=0)


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_mha_errors_name_the_argument_as_keras_does(bad):
    for name, kwargs in (("num_heads", {"num_heads": bad}),
                         ("key_dim", {"num_heads": 2, "key_dim": bad}),
                         ("value_dim", {"num_heads": 2, "key_dim": 4, "value_dim": bad})):
        with pytest.raises(ValueError, match=f"argument `{name}`"):
            keras.layers.MultiHeadAttention(**{"key_dim": 4, **kwargs})
        with pytest.raises(ValueError, match=f"argument `{name}`.*Received: {name}={bad}"):
            MultiHeadAttention(**kwargs)


def test_mha_key_value_length_mismatch_like_keras():
    ours = MultiHeadAttention(num_heads=4, key_dim=2)
    with pytest.raises(ValueError, match="must be equal"):
        ours.compute_output_shape((2, 4, 8), (2, 2, 8), (2, 1, 8))
    with pytest.raises(ValueError, match="must be equal"):
        ours(np.ones((2, 4, 8)), np.ones((2, 2, 8)), np.ones((2, 1, 8)))


# Keras's own MultiHeadAttention tests (keras/src/layers/attention/
# multi_head_attention_test.py: test_flash_attention_with_errors,
# test_multi_head_attention_output_shape_error, test_shape_mismatch_error),
# their inputs and the words they match: ours keeps its sentence after them.
def test_mha_refusals_carry_the_words_keras_tests_match():
    with pytest.raises(ValueError, match="Dropout is not supported when flash attention is "
                                         r"enabled.*Received: flash_attention=True, dropout=0.1"):
        MultiHeadAttention(num_heads=2, key_dim=2, flash_attention=True, dropout=0.1)
    with pytest.raises(ValueError, match=r"Invalid `output_shape`.*Received: output_shape=8.0"):
        MultiHeadAttention(num_heads=2, key_dim=16, output_shape=8.0)
    for query, value, key in (((2, 4, 8), (2, 2, 7), (2,)),
                              ((2, 4, 8), (2, 2, 8), (2, 1, 7)),
                              ((2, 4, 2, 3, 8), (2, 1, 1, 5, 8), (2, 1, 15, 5, 2))):
        layer = MultiHeadAttention(num_heads=4, key_dim=2, value_dim=2)
        received = rf"Received: key.shape={re.escape(str(key))}, value.shape="
        with pytest.raises(ValueError, match=f"must be equal.*{received}"):
            layer.compute_output_shape(query, value, key)
        with pytest.raises(ValueError, match=f"must be equal.*{received}"):
            layer(np.ones(query), np.ones(value), np.ones(key))
        # Keras's layer says the same of these inputs.
        with pytest.raises(ValueError, match="must be equal"):
            keras.layers.MultiHeadAttention(num_heads=4, key_dim=2, value_dim=2)(
                np.ones(query), np.ones(value), np.ones(key))


def test_mha_constraints_and_regularizers_reach_every_projection():
    layer = MultiHeadAttention(num_heads=2, key_dim=2, kernel_constraint="non_neg",
                               bias_constraint="non_neg", kernel_regularizer="l2")
    layer.build((1, 2, 4))
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
        assert isinstance(dense.kernel.constraint, keras.constraints.NonNeg)
        assert isinstance(dense.bias.constraint, keras.constraints.NonNeg)
        assert isinstance(dense.kernel_regularizer, keras.regularizers.L2)
    # The constraint acts when training: every kernel value stays >= 0.
    inputs = keras.Input((3, 4))
    model = keras.Model(inputs, layer.__class__.from_config(layer.get_config())(inputs))
    model.compile("sgd", "mse")
    model.fit(rand(4, 3, 4), rand(4, 3, 4) * 10, epochs=2, verbose=0)
    assert min(float(to_numpy(w).min()) for w in model.trainable_weights) >= 0.0


def test_flash_attention_true_means_the_fused_path_or_an_error():
    with pytest.raises(ValueError, match=r"flash_attention=True, dropout=0.1"):
        MultiHeadAttention(num_heads=2, dropout=0.1, flash_attention=True)
    with pytest.raises(ValueError, match=r"flash_attention=True, attention_dropout=0.1"):
        TransformerBlock(num_heads=2, intermediate_dim=8, attention_dropout=0.1,
                         flash_attention=True)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=6, flash_attention=True)
    with pytest.raises(ValueError, match=r"value_dim == key_dim.*key_dim=4, value_dim=6"):
        layer.build((1, 3, 8))
    layer = MultiHeadAttention(num_heads=2, flash_attention=True)
    layer.build((1, 3, 8))
    with pytest.raises(ValueError, match=r"return_attention_scores=True.*flash_attention=True"):
        layer(rand(1, 3, 8), return_attention_scores=True)
    # Keras refuses the same two.
    with pytest.raises(ValueError):
        keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1,
                                        flash_attention=True)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_output_specs_under_mixed_precision(policy):
    """`compute_output_spec` of float32 specs gives the compute dtype, as
    Keras's MHA does, for the attention layer and both blocks."""
    dtype = policy.split("_")[1]
    query, value = keras.KerasTensor((B, T, D)), keras.KerasTensor((B, S, D))
    peer = keras.layers.MultiHeadAttention(num_heads=N, key_dim=H, dtype=policy)
    assert peer.compute_output_spec(query, value).dtype == dtype
    out, scores = MultiHeadAttention(num_heads=N, dtype=policy).compute_output_spec(
        query, value, return_attention_scores=True)
    assert (out.dtype, out.shape, scores.dtype, scores.shape) == (dtype, (B, T, D), dtype,
                                                                  (B, N, T, S))
    for norm in ("post", "pre"):
        block = TransformerBlock(num_heads=N, intermediate_dim=16, norm_position=norm,
                                 dtype=policy)
        assert block.compute_output_spec(query).dtype == dtype
        decoder = TransformerDecoderBlock(num_heads=N, intermediate_dim=16,
                                          norm_position=norm, dtype=policy)
        spec = decoder.compute_output_spec(query, value)
        assert (spec.dtype, spec.shape) == (dtype, (B, T, D))


# === keras-hub's encoder and decoder ===

def copy_block(ours, theirs, cross=False):
    copy_attention(ours.self_attention, theirs._self_attention_layer)
    ours.self_attention_layer_norm.set_weights(theirs._self_attention_layer_norm.get_weights())
    if cross:
        copy_attention(ours.cross_attention, theirs._cross_attention_layer)
        ours.cross_attention_layer_norm.set_weights(
            theirs._cross_attention_layer_norm.get_weights())
    ours.feed_forward.intermediate_dense.set_weights(
        theirs._feedforward_intermediate_dense.get_weights())
    ours.feed_forward.output_dense.set_weights(theirs._feedforward_output_dense.get_weights())
    ours.feed_forward_layer_norm.set_weights(theirs._feedforward_layer_norm.get_weights())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_transformer_block_equals_keras_hub_encoder(norm):
    theirs = keras_hub.layers.TransformerEncoder(intermediate_dim=16, num_heads=N,
                                                 normalize_first=norm == "pre")
    ours = TransformerBlock(num_heads=N, intermediate_dim=16, norm_position=norm)
    x = rand(B, T, D)
    theirs.build((B, T, D))
    ours.build((B, T, D))
    copy_block(ours, theirs)
    padding = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    attention = np.tril(np.ones((B, T, T), bool))
    assert_close(ours(x), theirs(x))
    assert_close(ours(x, attention_mask=attention), theirs(x, attention_mask=attention))
    # Real tokens agree; padded ones differ on purpose (their attention
    # output is zeros here: see the MHA test above).
    for kwargs in ({"padding_mask": padding},
                   {"padding_mask": padding, "attention_mask": attention}):
        assert_close(to_numpy(ours(x, **kwargs))[padding],
                     to_numpy(theirs(x, **kwargs))[padding])


def _decoder_pair(cross):
    theirs = keras_hub.layers.TransformerDecoder(intermediate_dim=16, num_heads=N)
    ours = TransformerDecoderBlock(num_heads=N, intermediate_dim=16)
    theirs.build((B, T, D), (B, S, D) if cross else None)
    ours.build((B, T, D), (B, S, D) if cross else None)
    copy_block(ours, theirs, cross=cross)
    return ours, theirs


def test_decoder_block_equals_keras_hub_decoder():
    ours, theirs = _decoder_pair(cross=True)
    y, enc = rand(B, T, D), rand(B, S, D)
    enc_padding = np.array([[1] * 4 + [0, 0], [1] * 6], bool)
    assert_close(ours(y, enc), theirs(y, enc))
    assert_close(ours(y, enc, encoder_padding_mask=enc_padding),
                 theirs(y, enc, encoder_padding_mask=enc_padding))


@pytest.mark.parametrize("cross", [True, False], ids=["cross", "decoder_only"])
def test_decoder_cache_calls_as_keras_hub(cross):
    """keras-hub's calling convention, step by step: the first call computes
    the cross cache (`cross_attention_cache_update_index=0`), later calls
    reuse it (None); a block without cross-attention returns two values."""
    ours, theirs = _decoder_pair(cross=cross)
    y = rand(B, T, D)
    enc = rand(B, S, D) if cross else None
    full = to_numpy(theirs(y, enc))
    outputs = {"ours": [], "theirs": []}
    for who, layer in (("ours", ours), ("theirs", theirs)):
        cache = np.zeros((B, 2, T, N, H), "float32")
        cross_cache = np.zeros((B, 2, S, N, H), "float32") if cross else None
        for t in range(T):
            kwargs = {"self_attention_cache": cache, "self_attention_cache_update_index": t}
            if cross:
                kwargs.update(cross_attention_cache=cross_cache,
                              cross_attention_cache_update_index=0 if t == 0 else None)
            result = layer(y[:, t:t + 1], enc, **kwargs)
            assert len(result) == (3 if cross else 2)
            out, cache = result[0], result[1]
            if cross:
                cross_cache = result[2]
            outputs[who].append(to_numpy(out))
    ours_steps = np.concatenate(outputs["ours"], axis=1)
    assert_close(ours_steps, np.concatenate(outputs["theirs"], axis=1))
    assert_close(ours_steps, full, atol=1e-4)


def test_decoder_cross_cache_index_other_than_zero_is_refused():
    ours, _ = _decoder_pair(cross=True)
    cache = np.zeros((B, 2, T, N, H), "float32")
    with pytest.raises(ValueError, match=r"Received: cross_attention_cache_update_index=2"):
        ours(rand(B, 1, D), rand(B, S, D), self_attention_cache=cache,
             self_attention_cache_update_index=0,
             cross_attention_cache=np.zeros((B, 2, S, N, H), "float32"),
             cross_attention_cache_update_index=2)


# === Positions ===

def test_position_embedding_equals_keras_hub():
    theirs = keras_hub.layers.PositionEmbedding(sequence_length=10)
    ours = PositionEmbedding(max_sequence_length=10)
    x = rand(B, T, D)
    theirs.build((B, T, D))
    ours.build((B, T, D))
    ours.set_weights(theirs.get_weights())
    assert_close(ours(x), theirs(x))
    assert_close(ours(x, start_index=3), theirs(x, start_index=3))


def test_sine_position_encoding_equals_keras_hub():
    theirs = keras_hub.layers.SinePositionEncoding()
    ours = SinusoidalPositionalEncoding()
    x = rand(B, 12, D)
    assert_close(ours(x), theirs(x), atol=1e-5)
    assert_close(ours(x, start_index=4), theirs(x, start_index=4), atol=1e-5)


# === Rotary positions and local attention ===

def test_rotary_equals_keras_hub_rotary_embedding():
    """`MultiHeadAttention(rotary_theta=...)` turns its queries and keys as
    keras-hub's `RotaryEmbedding(max_wavelength=theta)` turns a tensor, at
    packed positions too."""
    from keras_attn.ops.rotary import apply_rotary

    x = rand(B, 7, N, 6)  # (B, T, N, H)
    positions = np.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]], "int32")
    theirs = keras_hub.layers.RotaryEmbedding(max_wavelength=500.0)
    assert_close(apply_rotary(x, positions, 500.0), theirs(x, positions=positions), atol=1e-5)


def test_window_equals_keras_sliding_window():
    """Keras's `sliding_window=w` sees `w - 1` keys on each side: our
    `window=2 * w - 1` (`window // 2 = w - 1`)."""
    for w in (1, 3):
        theirs = keras.layers.MultiHeadAttention(num_heads=N, key_dim=H, sliding_window=w)
        ours = MultiHeadAttention(num_heads=N, key_dim=H, window=2 * w - 1)
        theirs.build((B, S, D), (B, S, D))
        ours.build((B, S, D), (B, S, D))
        copy_attention(ours, theirs)
        x = rand(B, S, D)
        assert_close(ours(x), theirs(x, x))
