"""The layers' streaming paths (issue 41): fed chunk by chunk, each layer
gives what its whole-utterance call gives (with the chunk attention mask),
carries only the state it returns, and refuses a state that is not its own."""

import keras
import numpy as np
import pytest

from keras_attn.layers import ConformerBlock
from keras_attn.layers import ConformerConvModule
from keras_attn.layers import ConvSubsampling
from keras_attn.layers import LogMelFeatures
from keras_attn.layers import RelativeMultiHeadAttention
from keras_attn.layers.streaming import chunk_attention_mask
from test_case import to_numpy

RNG = np.random.default_rng(41)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def lengths_mask(lengths, steps):
    return np.arange(steps)[None, :] < np.asarray(lengths)[:, None]


def stream(step, inputs, mask, state, chunk):
    """Feeds `inputs` (B, T, ...) to `step(x, state, mask) -> (y, state)` in
    chunks of `chunk` frames; the outputs concatenated and the last state."""
    outputs = []
    for start in range(0, inputs.shape[1], chunk):
        y, state = step(inputs[:, start:start + chunk], state, mask[:, start:start + chunk])
        outputs.append(to_numpy(y))
    return np.concatenate(outputs, axis=1), state


# === The mask ===


@pytest.mark.parametrize("length, chunk, left", [(7, 3, 0), (7, 3, 2), (9, 4, 8), (5, 1, 1)])
def test_chunk_mask_is_the_chunk_and_its_left_context(length, chunk, left):
    mask = to_numpy(chunk_attention_mask(length, chunk, left))
    expected = np.zeros((length, length), bool)
    for t in range(length):
        start = (t // chunk) * chunk
        expected[t, max(0, start - left):min(length, start + chunk)] = True
    np.testing.assert_array_equal(mask, expected)


@pytest.mark.parametrize("name, value", [("chunk_size", 0), ("left_context", -1),
                                         ("left_context", 1.5)])
def test_chunk_mask_bad_arguments(name, value):
    kwargs = {"length": 4, "chunk_size": 2, "left_context": 1, name: value}
    with pytest.raises(ValueError, match=rf"Received: {name}={value}"):
        chunk_attention_mask(**kwargs)


# === Relative attention ===


@pytest.mark.parametrize("chunk, left", [(2, 0), (2, 3), (3, 6), (7, 2)])
def test_relative_attention_streamed_equals_the_chunk_mask(chunk, left):
    layer = RelativeMultiHeadAttention(num_heads=2, bias_initializer="random_normal")
    x, mask = rand(2, 7, 8), lengths_mask([7, 4], 7)
    expected = to_numpy(layer(x, padding_mask=mask,
                              attention_mask=np.broadcast_to(
                                  to_numpy(chunk_attention_mask(7, chunk, left)), (2, 7, 7))))
    got, cache = stream(layer.stream_step, x, mask, layer.initial_cache(2, left), chunk)
    np.testing.assert_allclose(got[mask], expected[mask], atol=1e-5)
    assert tuple(cache["key"].shape) == (2, left, 2, 4)


def test_relative_attention_cache_carries_keys_at_their_distance():
    """The second chunk's outputs depend on the cached frames and on how far
    they are: the same chunk after another first chunk, or with the cache
    shifted by one frame, gives other outputs."""
    layer = RelativeMultiHeadAttention(num_heads=2)
    first, second = rand(1, 3, 8), rand(1, 3, 8)
    with pytest.raises(ValueError, match=r"Received: relative_multi_head_attention\w* with built=False"):
        layer.initial_cache(1, 3)
    layer(first)
    _, cache = layer.stream_step(first, layer.initial_cache(1, 3))
    out, _ = layer.stream_step(second, cache)
    _, other_cache = layer.stream_step(rand(1, 3, 8), layer.initial_cache(1, 3))
    assert not np.allclose(to_numpy(layer.stream_step(second, other_cache)[0]), to_numpy(out))
    # The same keys one frame further back: a different relative position.
    shifted = {name: keras.ops.concatenate([value[:, 1:], value[:, :1] * 0], axis=1)
               for name, value in cache.items() if name != "mask"}
    shifted["mask"] = keras.ops.concatenate([cache["mask"][:, 1:], cache["mask"][:, :1] & False], 1)
    assert not np.allclose(to_numpy(layer.stream_step(second, shifted)[0]), to_numpy(out))


def test_relative_attention_step_leaves_the_cache_given():
    layer = RelativeMultiHeadAttention(num_heads=2)
    layer(rand(1, 3, 8))
    cache = layer.initial_cache(1, 2)
    before = {name: to_numpy(value).copy() for name, value in cache.items()}
    layer.stream_step(rand(1, 3, 8), cache)
    for name, value in before.items():
        np.testing.assert_array_equal(to_numpy(cache[name]), value)


def test_relative_attention_bad_cache():
    layer = RelativeMultiHeadAttention(num_heads=2)
    layer(rand(1, 3, 8))
    cache = layer.initial_cache(2, 2)
    with pytest.raises(ValueError, match=r"entry 'key' must be float32 of shape \(1, 2, 2, 4\)"):
        layer.stream_step(rand(1, 3, 8), cache)  # a batch of 2
    with pytest.raises(ValueError, match=r"Received: cache=\['key', 'mask'\]"):
        layer.stream_step(rand(2, 3, 8), {"key": cache["key"], "mask": cache["mask"]})
    half = dict(cache, value=keras.ops.cast(cache["value"], "float16"))
    with pytest.raises(ValueError, match=r"state\['value'\] of shape \(2, 2, 2, 4\) and dtype float16"):
        layer.stream_step(rand(2, 3, 8), half)


# === Convolution module ===


def test_causal_conv_module_reads_no_future_frame():
    module = ConformerConvModule(kernel_size=4, causal=True)
    x = rand(1, 9, 8)
    later = x.copy()
    later[:, 5:] = rand(1, 4, 8) * 10
    np.testing.assert_allclose(to_numpy(module(later))[:, :5], to_numpy(module(x))[:, :5], atol=1e-6)
    # ... and is the Keras depthwise convolution padded on the left only.
    inner = rand(2, 9, module._inner)
    padded = np.pad(inner, ((0, 0), (3, 0), (0, 0)))
    reference = keras.layers.DepthwiseConv1D(4, padding="valid")
    reference.build(padded.shape)
    reference.set_weights(module.depthwise_conv.get_weights())
    np.testing.assert_allclose(to_numpy(module._depthwise(inner)), to_numpy(reference(padded)),
                               atol=1e-5)


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm"])
@pytest.mark.parametrize("chunk", [1, 3, 9])
def test_causal_conv_module_streamed_equals_offline(norm, chunk):
    module = ConformerConvModule(kernel_size=5, causal=True, norm=norm,
                                 depthwise_initializer="random_normal")
    x, mask = rand(2, 9, 8), lengths_mask([9, 5], 9)
    module(x)
    if norm == "batch_norm":  # moving statistics that are not the identity
        module.batch_norm.moving_mean.assign(rand(module._inner))
        module.batch_norm.moving_variance.assign(np.abs(rand(module._inner)) + 0.5)
    expected = to_numpy(module(x, padding_mask=mask))
    got, cache = stream(module.stream_step, x, mask, module.initial_cache(2), chunk)
    np.testing.assert_allclose(got[mask], expected[mask], atol=1e-5)
    assert tuple(cache.shape) == (2, 4, module._inner)


def test_conv_module_inference_norm_is_per_frame():
    """At inference neither normalisation mixes frames: a frame's output of
    the kernel-1 module does not move when the other frames change."""
    for norm in ("batch_norm", "layer_norm"):
        module = ConformerConvModule(kernel_size=1, norm=norm)
        x = rand(2, 6, 8)
        other = x.copy()
        other[:, 1:] = rand(2, 5, 8) * 5
        np.testing.assert_allclose(to_numpy(module(other))[:, 0], to_numpy(module(x))[:, 0],
                                   atol=1e-6)


def test_conv_module_stream_needs_causal_and_its_own_cache():
    module = ConformerConvModule(kernel_size=3)
    module(rand(1, 4, 8))
    with pytest.raises(ValueError, match=r"Received: causal=False"):
        module.initial_cache(1)
    causal = ConformerConvModule(kernel_size=3, causal=True)
    causal(rand(1, 4, 8))
    with pytest.raises(ValueError, match=r"entry 'cache' must be float32 of shape \(1, 2, 8\)"):
        causal.stream_step(rand(1, 4, 8), keras.ops.zeros((1, 3, 8)))
    with pytest.raises(ValueError, match=r"Received: norm='group_norm'"):
        ConformerConvModule(norm="group_norm")
    with pytest.raises(ValueError, match=r"Received: causal=1"):
        ConformerConvModule(causal=1)


# === Conformer block ===


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm"])
@pytest.mark.parametrize("chunk, left", [(3, 0), (3, 4), (4, 2), (11, 3)])
def test_conformer_block_streamed_equals_the_chunk_mask(norm, chunk, left):
    block = ConformerBlock(num_heads=2, kernel_size=5, causal_conv=True, conv_norm=norm)
    x, mask = rand(2, 11, 8), lengths_mask([11, 6], 11)
    expected = to_numpy(block(x, padding_mask=mask,
                              attention_mask=chunk_attention_mask(11, chunk, left)))
    got, state = stream(block.stream_step, x, mask, block.initial_state(2, left), chunk)
    np.testing.assert_allclose(got[mask], expected[mask], atol=1e-5)
    assert sorted(state) == ["conv", "key", "mask", "value"]


def test_conformer_block_chunk_mask_changes_the_outputs():
    """The mask reaches the attention: a chunk of 2 with no left context
    gives other outputs than full attention (a chunk covering everything)."""
    block = ConformerBlock(num_heads=2, kernel_size=3)
    x = rand(1, 6, 8)
    full = to_numpy(block(x))
    np.testing.assert_allclose(to_numpy(block(x, attention_mask=chunk_attention_mask(6, 6, 0))),
                               full, atol=1e-6)
    assert not np.allclose(to_numpy(block(x, attention_mask=chunk_attention_mask(6, 2, 0))), full)


def test_conformer_block_bad_state():
    block = ConformerBlock(num_heads=2, kernel_size=3, causal_conv=True)
    block(rand(1, 4, 8))
    state = block.initial_state(1, 2)
    with pytest.raises(ValueError, match=r"Received: state=\['key', 'mask', 'value'\]"):
        block.stream_step(rand(1, 2, 8), {k: v for k, v in state.items() if k != "conv"})
    with pytest.raises(ValueError, match=r"entry 'conv' must be float32"):
        block.stream_step(rand(1, 2, 8), dict(state, conv=keras.ops.zeros((1, 5, 8))))


# === Subsampling ===


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 30])
def test_subsampling_streamed_equals_offline(chunk):
    layer = ConvSubsampling(8)
    x, mask = rand(2, 30, 12), lengths_mask([30, 17], 30)
    expected = to_numpy(layer(x, padding_mask=mask))
    state, outputs, masks = layer.initial_state(2), [], []
    for start in range(0, 30, chunk):
        y, y_mask, state = layer.stream_step(x[:, start:start + chunk], state,
                                             mask[:, start:start + chunk])
        outputs.append(to_numpy(y))
        masks.append(to_numpy(y_mask))
    np.testing.assert_allclose(np.concatenate(outputs, 1), expected, atol=1e-5)
    np.testing.assert_array_equal(np.concatenate(masks, 1),
                                  to_numpy(layer.output_padding_mask(mask)))
    assert state["frames"].shape[1] <= 6  # only what the next output reads


def test_subsampling_bad_state():
    layer = ConvSubsampling(8)
    layer(rand(1, 8, 12))
    with pytest.raises(ValueError, match=r"entry 'frames' must be float32 of shape \(1, None, 12\)"):
        layer.stream_step(rand(1, 4, 12), {"frames": keras.ops.zeros((1, 2, 10)),
                                           "mask": keras.ops.zeros((1, 2), "bool")})


# === Log-mel features ===

SETTINGS = {"sampling_rate": 8000, "num_mel_bins": 12, "frame_length": 200,
            "frame_step": 80, "fft_length": 256}


def stream_log_mel(layer, wave, lengths, chunk):
    state, features, masks = layer.initial_state(len(wave)), [], []
    for start in range(0, wave.shape[1], chunk):
        piece = wave[:, start:start + chunk]
        valid = np.clip(lengths - start, 0, piece.shape[1]).astype("int32")
        f, m, state = layer.stream_step(piece, state, valid)
        features.append(to_numpy(f))
        masks.append(to_numpy(m))
    f, m, state = layer.flush(state)
    return np.concatenate(features + [to_numpy(f)], 1), np.concatenate(masks + [to_numpy(m)], 1)


@pytest.mark.parametrize("stft", ["fft", "convolution"])
@pytest.mark.parametrize("chunk", [50, 333, 5000])
def test_log_mel_streamed_equals_offline(stft, chunk):
    layer = LogMelFeatures(normalization="none", stft=stft, **SETTINGS)
    wave = rand(3, 1650) * 0.1
    lengths = np.array([1650, 777, 100], "int32")
    expected = to_numpy(layer(wave, lengths))
    features, masks = stream_log_mel(layer, wave, lengths, chunk)
    np.testing.assert_allclose(features, expected, atol=1e-4)
    np.testing.assert_array_equal(masks.sum(1), 1 + lengths // 80)


def test_log_mel_without_normalisation_is_the_decibels():
    layer = LogMelFeatures(normalization="none", **SETTINGS)
    wave = rand(1, 800) * 0.1
    features = to_numpy(layer(wave))
    power = to_numpy(layer.mel_spectrogram(np.pad(wave, ((0, 0), (0, 128)))))  # (1, M, T')
    decibels = np.maximum(10 * np.log10(power.transpose(0, 2, 1)[:, :11]), -100)
    np.testing.assert_allclose(features, decibels, atol=1e-4)
    assert LogMelFeatures.from_config(layer.get_config()).normalization == "none"


def test_log_mel_stream_refuses_bad_input():
    with pytest.raises(ValueError, match=r"Received: normalization='utterance'"):
        LogMelFeatures(**SETTINGS).initial_state(1)
    with pytest.raises(ValueError, match=r"Received: normalization='global'"):
        LogMelFeatures(normalization="global")
    layer = LogMelFeatures(normalization="none", **SETTINGS)
    layer.build((None, None))
    state = layer.initial_state(2)
    bad = rand(2, 160) * 0.1
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf in row\(s\) \[1\]"):
        layer.stream_step(bad, state)
    # int16-range samples as floats (x 32768): other features, silently.
    loud = rand(2, 160) * 0.1
    loud[1, 7] = 3276.5
    with pytest.raises(ValueError, match=r"`samples`: audio samples must lie in \[-1, 1\].*"
                                         r"Received: samples\[1, 7\]=3276.5"):
        layer.stream_step(loud, state)
    _, _, ended = layer.stream_step(rand(2, 160) * 0.1, state, np.array([160, 50], "int32"))
    with pytest.raises(ValueError, match=r"Received: chunk_length=\[160, 10\]"):
        layer.stream_step(rand(2, 160) * 0.1, ended, np.array([160, 10], "int32"))
    with pytest.raises(ValueError, match=r"Received: chunk_length=\[160, 4294967301\]"):
        layer.stream_step(rand(2, 160) * 0.1, state, np.array([160, 2 ** 32 + 5], "int64"))
    with pytest.raises(ValueError, match=r"`state`: entry 'length' counts samples: it cannot be "
                                         r"negative. Received: state\['length'\]=\[160, -5\]"):
        layer.stream_step(rand(2, 160) * 0.1, dict(state, length=np.array([160, -5], "int32")))


def test_log_mel_counters_do_not_wrap_past_int32():
    """A stream of days passes 2**31 samples (37 h at 16 kHz): the state's
    counters stay far below int32's limit, so a state whose counters are
    just below it steps as the same state counted from 0 does."""
    layer = LogMelFeatures(normalization="none", **SETTINGS)
    layer.build((None, None))
    wave = rand(2, 800) * 0.1
    _, _, state = layer.stream_step(wave[:, :400], layer.initial_state(2))
    # Shifted by whole frames to just below 2**31 samples: the next 400 cross it.
    frames = (2 ** 31 - 600) // 80
    far = dict(state, received=to_numpy(state["received"]) + frames * 80,
               next_frame=to_numpy(state["next_frame"]) + frames,
               length=to_numpy(state["length"]) + frames * 80)
    far = {name: keras.ops.convert_to_tensor(value) for name, value in far.items()}
    for _ in range(2):  # the first step leaves the counters small: the next runs from there
        expected, expected_mask, state = layer.stream_step(wave[:, 400:], state)
        got, mask, far = layer.stream_step(wave[:, 400:], far)
        np.testing.assert_array_equal(to_numpy(mask), to_numpy(expected_mask))
        np.testing.assert_allclose(to_numpy(got), to_numpy(expected), atol=1e-5)
        assert int(to_numpy(far["received"])) < 2 ** 30
    with pytest.raises(ValueError, match=r"Received: samples.shape=\(2, 160, 1\)"):
        layer.stream_step(rand(2, 160, 1), state)
