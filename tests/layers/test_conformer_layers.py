import numpy as np
import pytest

from keras_attn.layers import ConformerBlock
from keras_attn.layers import ConformerConvModule
from keras_attn.layers import ConvSubsampling
from keras_attn.layers import RelativeMultiHeadAttention
from keras_attn.layers import SpecAugment
from keras_attn.layers import subsampled_length
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(4)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def lengths_mask(lengths, steps):
    return np.arange(steps)[None, :] < np.asarray(lengths)[:, None]


# === Generic layer tests, non-default arguments ===


def test_relative_attention_layer(tmp_path):
    run_layer_test(
        RelativeMultiHeadAttention,
        init_kwargs={
            "num_heads": 2, "key_dim": 3, "dropout": 0.1, "use_bias": False,
            "max_wavelength": 500.0, "kernel_initializer": "he_normal",
            "bias_initializer": "random_normal", "seed": 2,
        },
        input_data={"inputs": rand(2, 5, 8), "padding_mask": lengths_mask([5, 3], 5)},
        expected_output_shape=(2, 5, 8),
        # query, key, value, output kernels + position kernel + u + v
        expected_num_trainable_weights=7,
        tmp_path=tmp_path,
    )


def test_conv_module_layer(tmp_path):
    run_layer_test(
        ConformerConvModule,
        init_kwargs={
            "kernel_size": 4, "expansion": 3, "dropout": 0.1, "layer_norm_epsilon": 1e-3,
            "batch_norm_momentum": 0.9, "batch_norm_epsilon": 1e-5,
            "kernel_initializer": "he_uniform", "depthwise_initializer": "ones",
        },
        input_data={"inputs": rand(2, 7, 6), "padding_mask": lengths_mask([7, 4], 7)},
        expected_output_shape=(2, 7, 6),
        # LN 2 + pointwise 2 + depthwise 2 + BN gamma/beta 2 + pointwise 2
        expected_num_trainable_weights=10,
        tmp_path=tmp_path,
    )


def test_batch_norm_epsilon_reaches_the_batch_norm():
    block = ConformerBlock(num_heads=2, kernel_size=3, batch_norm_epsilon=1e-5)
    block.build((None, None, 8))
    assert block.conv_module.batch_norm.epsilon == 1e-5
    assert ConformerBlock.from_config(block.get_config()).batch_norm_epsilon == 1e-5
    default = ConformerConvModule(kernel_size=3)
    default.build((None, None, 8))
    assert default.batch_norm.epsilon == 1e-3  # Keras's, as before


@pytest.mark.slow
def test_conformer_block_layer(tmp_path):
    # With the streaming options (issue 41) too: one harness run of the
    # block (an XLA-compiled fit step, 5 builds) covers both. The BatchNorm
    # convolution module passes the harness alone (test_conv_module_layer),
    # and in a block every model test (tests/models/test_conformer.py).
    run_layer_test(
        ConformerBlock,
        init_kwargs={
            "num_heads": 2, "intermediate_dim": 12, "kernel_size": 5, "dropout": 0.05,
            "attention_dropout": 0.1, "conv_expansion": 4, "layer_norm_epsilon": 1e-3,
            "kernel_initializer": "he_normal", "causal_conv": True, "conv_norm": "layer_norm",
            "batch_norm_epsilon": 1e-5,
        },
        input_data={"inputs": rand(2, 6, 8), "padding_mask": lengths_mask([6, 2], 6)},
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=6 + 13 + 10 + 6 + 2,
        tmp_path=tmp_path,
    )


def test_conv_subsampling_layer(tmp_path):
    run_layer_test(
        ConvSubsampling,
        init_kwargs={"hidden_dim": 8, "filters": 3, "kernel_initializer": "he_uniform"},
        input_data={"inputs": rand(2, 20, 12)},
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=6,
        tmp_path=tmp_path,
    )


def test_spec_augment_layer(tmp_path):
    run_layer_test(
        SpecAugment,
        init_kwargs={
            "freq_mask_count": 1, "freq_mask_width": 3, "time_mask_count": 2,
            "time_mask_ratio": 0.2, "time_mask_width": 4, "mask_value": -1.0, "seed": 5,
        },
        input_data={"inputs": rand(2, 20, 12)},
        expected_output_shape=(2, 20, 12),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
    )


# === Relative attention: the formula ===


def numpy_sinusoid(position, depth, base=10000.0):
    k = np.arange(depth // 2)
    angle = position / base ** (2 * k / depth)
    out = np.empty(depth)
    out[0::2], out[1::2] = np.sin(angle), np.cos(angle)
    return out


def test_relative_attention_matches_numpy():
    layer = RelativeMultiHeadAttention(num_heads=2, bias_initializer="random_normal")
    x = rand(1, 4, 6)
    mask = lengths_mask([3], 4)
    out, scores = layer(x, padding_mask=mask, return_attention_scores=True)

    w = lambda sub: [to_numpy(v) for v in sub.weights]  # noqa: E731
    wq, bq = w(layer.query_dense)
    wk, bk = w(layer.key_dense)
    wv, bv = w(layer.value_dense)
    (wr,) = w(layer.position_dense)
    wo, bo = w(layer.output_dense)
    u, v = to_numpy(layer.content_bias), to_numpy(layer.position_bias)
    q = np.einsum("td,dnh->tnh", x[0], wq) + bq
    k = np.einsum("td,dnh->tnh", x[0], wk) + bk
    val = np.einsum("td,dnh->tnh", x[0], wv) + bv
    t, n, h = q.shape
    logits = np.zeros((n, t, t))
    for head in range(n):
        for i in range(t):
            for j in range(t):
                r = np.einsum("d,dh->h", numpy_sinusoid(i - j, 6), wr[:, head])
                logits[head, i, j] = ((q[i, head] + u[head]) @ k[j, head] + (q[i, head] + v[head]) @ r) / np.sqrt(h)
    valid = mask[0][:, None] & mask[0][None, :]
    logits = np.where(valid, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs = np.nan_to_num(probs / probs.sum(-1, keepdims=True))
    attended = np.einsum("nts,snh->tnh", probs, val)
    expected = np.einsum("tnh,nhd->td", attended, wo) + bo
    np.testing.assert_allclose(to_numpy(scores)[0], probs, atol=1e-5)
    np.testing.assert_allclose(to_numpy(out)[0], expected, atol=1e-5)


def test_relative_attention_is_translation_invariant_in_position():
    """Only distances matter: a sequence and the same sequence after padding
    on the left (masked) give the same outputs for the shared frames."""
    layer = RelativeMultiHeadAttention(num_heads=2)
    x = rand(1, 5, 8)
    shifted = np.concatenate([rand(1, 3, 8), x], axis=1)
    mask = np.array([[False] * 3 + [True] * 5])
    np.testing.assert_allclose(
        to_numpy(layer(shifted, padding_mask=mask))[:, 3:], to_numpy(layer(x)), atol=1e-5
    )


# === Padding never leaks ===


@pytest.mark.parametrize("training", [False, True])
def test_conv_module_valid_frames_ignore_padding(training):
    module = ConformerConvModule(kernel_size=5)
    x = rand(2, 6, 8)
    base = to_numpy(module(x, padding_mask=lengths_mask([6, 6], 6), training=training))
    for extra in (1, 4):
        padded = np.concatenate([x, rand(2, extra, 8) * 100], axis=1)
        out = to_numpy(module(padded, padding_mask=lengths_mask([6, 6], 6 + extra), training=training))
        np.testing.assert_allclose(out[:, :6], base, atol=1e-5)


def test_conformer_block_valid_frames_ignore_padding():
    block = ConformerBlock(num_heads=2, kernel_size=3)
    x = rand(2, 5, 8)
    base = to_numpy(block(x))
    padded = np.concatenate([x, rand(2, 3, 8) * 50], axis=1)
    out = to_numpy(block(padded, padding_mask=lengths_mask([5, 5], 8)))
    np.testing.assert_allclose(out[:, :5], base, atol=1e-5)


# === Subsampling lengths and masks ===


@pytest.mark.parametrize("length", [7, 8, 9, 10, 11, 25, 101])
def test_subsampled_length_matches_the_convolutions(length):
    layer = ConvSubsampling(4)
    out = layer(rand(1, length, 16))
    assert out.shape[1] == subsampled_length(length) == ((length - 3) // 2 + 1 - 3) // 2 + 1


def test_subsampled_mask_and_padding_invariance():
    layer = ConvSubsampling(8)
    x = rand(2, 30, 16)
    lengths = [30, 17]
    mask = lengths_mask(lengths, 30)
    sub_mask = to_numpy(layer.output_padding_mask(mask))
    assert sub_mask.sum(1).tolist() == [subsampled_length(30), subsampled_length(17)]
    out = to_numpy(layer(x, padding_mask=mask))
    # Valid output frames of utterance 2 only see its 17 valid input frames.
    garbage = x.copy()
    garbage[1, 17:] = 1e3
    out_garbage = to_numpy(layer(garbage, padding_mask=mask))
    valid = subsampled_length(17)
    np.testing.assert_allclose(out_garbage[1, :valid], out[1, :valid], atol=1e-5)


def test_subsampling_propagates_the_keras_mask():
    import keras

    inputs = keras.Input((30, 16))
    masked = keras.layers.Masking(0.0)(inputs)
    out = ConvSubsampling(8)(masked)
    assert out._keras_mask is not None
    x = rand(1, 30, 16)
    x[:, 20:] = 0.0
    model = keras.Model(inputs, ConformerBlock(num_heads=2, kernel_size=3)(out))
    assert model(x).shape == (1, subsampled_length(30), 8)


# === SpecAugment ===


def test_spec_augment_is_identity_at_inference():
    x = rand(2, 40, 10)
    np.testing.assert_array_equal(to_numpy(SpecAugment()(x, training=False)), x)


def test_spec_augment_masks_are_bands_within_limits():
    layer = SpecAugment(freq_mask_count=2, freq_mask_width=4, time_mask_count=3,
                        time_mask_ratio=0.1, seed=3)
    x = np.ones((64, 100, 30), "float32")
    lengths = RNG.integers(40, 101, 64)
    out = to_numpy(layer(x, padding_mask=lengths_mask(lengths, 100), training=True))
    zero = out == 0
    freq_bands = zero.all(axis=1)  # (B, F): whole columns masked
    time_spans = zero.all(axis=2)  # (B, T): whole rows masked
    # every masked cell is on a masked column or row: no scattered noise
    assert (zero == (freq_bands[:, None, :] | time_spans[:, :, None])).all()
    assert freq_bands.sum(1).max() <= 2 * 4
    for b in range(64):
        assert not time_spans[b, lengths[b]:].any()  # never in the padding
        assert time_spans[b].sum() <= 3 * int(0.1 * lengths[b])
    assert freq_bands.any() and time_spans.any()


@pytest.mark.parametrize("name, value", [("freq_mask_count", -1), ("time_mask_width", 2.5)])
def test_spec_augment_bad_counts(name, value):
    with pytest.raises(ValueError, match=rf"Received: {name}={value}"):
        SpecAugment(**{name: value})


def test_spec_augment_bad_ratio():
    with pytest.raises(ValueError, match=r"Received: time_mask_ratio=1.5"):
        SpecAugment(time_mask_ratio=1.5)


# === Bad input ===


def test_glu_needs_an_even_channel_count():
    with pytest.raises(ValueError, match=r"Received: expansion=1, width=5"):
        ConformerConvModule(kernel_size=3, expansion=1)(rand(1, 4, 5))


def test_conv_module_non_positive_kernel():
    with pytest.raises(ValueError, match=r"Received: kernel_size=0"):
        ConformerConvModule(kernel_size=0)


def test_conv_module_padding_mask_of_wrong_shape():
    with pytest.raises(ValueError, match=r"Received: padding_mask.shape=\(1, 3\)"):
        ConformerConvModule(kernel_size=3)(rand(1, 4, 8), padding_mask=np.ones((1, 3), bool))


def test_relative_attention_width_not_divisible():
    with pytest.raises(ValueError, match=r"num_heads=3\). Received: width=8"):
        RelativeMultiHeadAttention(num_heads=3)(rand(1, 4, 8))


def test_relative_attention_mask_of_wrong_shape():
    with pytest.raises(ValueError, match=r"Received: attention_mask.shape=\(1, 4, 3\)"):
        RelativeMultiHeadAttention(num_heads=2)(rand(1, 4, 8), attention_mask=np.ones((1, 4, 3), bool))


def test_subsampling_too_few_frames():
    layer = ConvSubsampling(4)
    with pytest.raises(ValueError, match=r"at least 7 frames. Received: T=6"):
        layer(rand(1, 6, 16))


def test_subsampling_too_few_bins():
    with pytest.raises(ValueError, match=r"at least 7 feature bins. Received: F=6"):
        ConvSubsampling(4)(rand(1, 10, 6))


def test_conformer_block_bad_dropout():
    with pytest.raises(ValueError, match=r"Received: dropout=1.2"):
        ConformerBlock(num_heads=2, dropout=1.2)


# === Log-mel front end ===


def test_log_mel_layer(tmp_path):
    from keras_attn.layers import LogMelFeatures

    run_layer_test(
        LogMelFeatures,
        init_kwargs={"sampling_rate": 8000, "num_mel_bins": 12, "frame_length": 200,
                     "frame_step": 80, "fft_length": 256, "epsilon": 1e-3, "stft": "convolution"},
        input_data={"waveform": rand(2, 1600) * 0.1, "waveform_length": np.array([1600, 900], "int32")},
        expected_output_shape=(2, 21, 12),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
    )


def test_log_mel_normalises_valid_frames_and_zeroes_padding():
    from keras_attn.layers import LogMelFeatures

    layer = LogMelFeatures(num_mel_bins=20)
    wave = rand(2, 8000) * 0.1
    lengths = np.array([8000, 4000], "int32")
    features = to_numpy(layer(wave, lengths))
    frames = 1 + 4000 // 160
    np.testing.assert_allclose(features[1, :frames].mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(features[1, :frames].std(0), 1.0, atol=1e-3)
    np.testing.assert_array_equal(features[1, frames:], 0.0)


def test_log_mel_makes_a_row_with_a_sample_outside_unit_range_nan():
    """16-bit PCM given as floats (x 32768) would make other features, not an
    error: inside a graph that row becomes NaN; its padding may hold anything,
    and the other rows keep their own features."""
    from keras_attn.layers import LogMelFeatures

    layer = LogMelFeatures(num_mel_bins=20)
    wave = np.clip(rand(3, 4000) * 0.1, -1, 1)
    lengths = np.array([4000, 3000, 3000], "int32")
    before = to_numpy(layer(wave, lengths))
    wave[1, 10] *= 32768.0  # a valid sample
    wave[2, 3500] = 5.0  # padding
    after = to_numpy(layer(wave, lengths))
    assert np.isnan(after[1]).all()
    np.testing.assert_array_equal(after[[0, 2]], before[[0, 2]])
    assert np.isnan(to_numpy(layer(wave[1:2] * 1.0))).all()  # no lengths given


def test_log_mel_by_convolution_equals_the_fft():
    """The exportable STFT (a strided convolution with windowed cosines and
    sines) gives the FFT path's features; a window shorter than the FFT is
    centred in it as the FFT path centres it."""
    from keras_attn.layers import LogMelFeatures

    settings = {"sampling_rate": 8000, "num_mel_bins": 12, "frame_length": 200,
                "frame_step": 80, "fft_length": 256}
    wave, lengths = rand(2, 1650) * 0.1, np.array([1650, 777], "int32")
    fft = LogMelFeatures(**settings)
    convolution = LogMelFeatures(stft="convolution", **settings)
    expected = to_numpy(fft(wave, lengths))
    np.testing.assert_allclose(to_numpy(convolution(wave, lengths)), expected, atol=1e-4)
    assert np.abs(expected).max() > 1.0  # normalised features, not zeros
    assert LogMelFeatures.from_config(convolution.get_config()).stft == "convolution"
    with pytest.raises(ValueError, match=r"Received: stft='rfft'"):
        LogMelFeatures(stft="rfft")


def test_log_mel_fft_shorter_than_frame():
    from keras_attn.layers import LogMelFeatures

    with pytest.raises(ValueError, match=r"Received: fft_length=256, frame_length=400"):
        LogMelFeatures(fft_length=256)


@pytest.mark.parametrize("kernel_size", [1, 4, 7, 32])
def test_depthwise_sum_equals_keras_depthwise_conv(kernel_size):
    module = ConformerConvModule(kernel_size=kernel_size, depthwise_initializer="random_normal")
    x = rand(2, 9, 8)
    module(x)
    inner = rand(2, 9, module._inner)
    np.testing.assert_allclose(
        to_numpy(module._depthwise(inner)), to_numpy(module.depthwise_conv(inner)), atol=1e-5
    )


# === Streaming options (issue 41): config, mixed precision, save / load ===


def _log_mel_features():
    from keras_attn.layers import LogMelFeatures

    return LogMelFeatures


STREAMING_OPTIONS = {
    # LN 2 + pointwise 2 + depthwise 2 + conv LN gamma/beta 2 + pointwise 2
    "conv_module": (lambda: ConformerConvModule, {
        "kernel_size": 4, "dropout": 0.1, "causal": True, "norm": "layer_norm",
        "depthwise_initializer": "random_normal"}, (2, 7, 6), 10),
    # The block with causal_conv and conv_norm="layer_norm": test_conformer_block_layer.
    "log_mel": (_log_mel_features, {
        "sampling_rate": 8000, "num_mel_bins": 12, "frame_length": 200, "frame_step": 80,
        "fft_length": 256, "normalization": "none"}, (2, 21, 12), 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STREAMING_OPTIONS))
def test_streaming_options_pass_the_layer_harness(name, tmp_path):
    layer_cls, init_kwargs, shape, weights = STREAMING_OPTIONS[name]
    if name == "log_mel":
        data = {"waveform": rand(2, 1600) * 0.1,
                "waveform_length": np.array([1600, 900], "int32")}
    else:
        data = {"inputs": rand(*shape), "padding_mask": lengths_mask([7, 4], 7)}
    run_layer_test(layer_cls(), init_kwargs=init_kwargs, input_data=data,
                   expected_output_shape=shape, expected_num_trainable_weights=weights,
                   tmp_path=tmp_path)
