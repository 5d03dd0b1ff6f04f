import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import TransformerDecoderBlock
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_layer_encoder_decoder(norm_position, tmp_path):
    run_layer_test(
        TransformerDecoderBlock,
        init_kwargs={
            "num_heads": 2,
            "intermediate_dim": 12,
            "key_dim": 5,
            "value_dim": 3,
            "norm_position": norm_position,
            "activation": "gelu",
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "activation_dropout": 0.1,
            "layer_norm_epsilon": 1e-3,
            "use_bias": False,
            "flash_attention": False,
            "kernel_initializer": "he_uniform",
            "bias_initializer": "ones",
        },
        input_data={
            "decoder_sequence": rand(2, 4, 8),
            "encoder_sequence": rand(2, 6, 10),
            "encoder_padding_mask": np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], bool),
        },
        expected_output_shape=(2, 4, 8),
        # 2 attentions x 4 kernels + 2 FFN kernels + 3 LayerNorms x 2
        expected_num_trainable_weights=16,
        tmp_path=tmp_path,
    )


def test_layer_decoder_only(tmp_path):
    run_layer_test(
        TransformerDecoderBlock,
        init_kwargs={"num_heads": 4, "intermediate_dim": 16},
        input_data={"decoder_sequence": rand(2, 5, 8)},
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=16,  # one attention (8) + FFN (4) + 2 LNs (4)
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("precompute_cross", [True, False])
@pytest.mark.parametrize("dims", [{}, {"key_dim": 2, "value_dim": 4}])
def test_cached_decoding_equals_full_pass(norm_position, precompute_cross, dims):
    # dims: a small key size, as in the paper's Table 3 row (B).
    block = TransformerDecoderBlock(
        num_heads=2, intermediate_dim=16, norm_position=norm_position, **dims
    )
    target, source = rand(3, 6, 8), rand(3, 5, 8)
    source_mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
    full = to_numpy(block(target, source, encoder_padding_mask=source_mask))
    cache = block.self_attention.empty_cache(3, 6)
    cross = block.compute_cross_attention_cache(source) if precompute_cross else None
    steps = []
    for i in range(6):
        out, cache, cross_out = block(
            target[:, i : i + 1],
            None if precompute_cross else source,
            encoder_padding_mask=source_mask,
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
            cross_attention_cache=cross,
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_cached_decoding_inside_a_while_loop():
    """The cache index as a tensor, as in a compiled decoding loop."""
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    target, source = rand(2, 5, 8), rand(2, 3, 8)
    full = to_numpy(block(target, source))
    cross = block.compute_cross_attention_cache(source)

    def body(i, cache, outputs):
        token = ops.slice(target, (0, i, 0), (2, 1, 8))  # (B, 1, D)
        out, cache, _ = block(
            token,
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
            cross_attention_cache=cross,
        )
        return i + 1, cache, ops.slice_update(outputs, (0, i, 0), out)

    state = (0, block.self_attention.empty_cache(2, 5), ops.zeros((2, 5, 8)))
    _, _, outputs = ops.while_loop(lambda i, cache, outputs: i < 5, body, state)
    np.testing.assert_allclose(to_numpy(outputs), full, atol=1e-5)


def test_causality_and_source_padding_invariance():
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    target, source = rand(1, 5, 8), rand(1, 4, 8)
    base = to_numpy(block(target, source))
    changed = target.copy()
    changed[:, 3:] = rand(1, 2, 8)
    np.testing.assert_allclose(to_numpy(block(changed, source))[:, :3], base[:, :3], atol=1e-6)
    padded_source = np.concatenate([source, rand(1, 3, 8) * 50], axis=1)
    mask = np.arange(7)[None] < 4
    np.testing.assert_allclose(
        to_numpy(block(target, padded_source, encoder_padding_mask=mask)), base, atol=1e-5
    )


def test_implicit_masks_equal_explicit_masks():
    tgt_tokens = np.array([[1, 2, 3, 0]])
    src_tokens = np.array([[4, 5, 0, 0, 0]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    tgt_in = keras.Input((4,), dtype="int32")
    src_in = keras.Input((5,), dtype="int32")
    model = keras.Model([tgt_in, src_in], block(embedding(tgt_in), embedding(src_in)))
    tgt = ops.convert_to_tensor(to_numpy(embedding(tgt_tokens)))
    src = ops.convert_to_tensor(to_numpy(embedding(src_tokens)))
    explicit = block(tgt, src, decoder_padding_mask=tgt_tokens != 0, encoder_padding_mask=src_tokens != 0)
    np.testing.assert_allclose(to_numpy(model([tgt_tokens, src_tokens])), to_numpy(explicit), atol=1e-6)


def test_missing_encoder_sequence():
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=8)
    block(rand(1, 2, 8), rand(1, 3, 8))
    with pytest.raises(ValueError, match=r"needs `encoder_sequence`.*Received: encoder_sequence=None"):
        block(rand(1, 2, 8))


def test_encoder_sequence_for_a_decoder_only_block():
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=8)
    block(rand(1, 2, 8))
    with pytest.raises(ValueError, match=r"built without cross-attention"):
        block(rand(1, 2, 8), rand(1, 3, 8))
    with pytest.raises(ValueError, match=r"has no cross-attention"):
        block.compute_cross_attention_cache(rand(1, 3, 8))
