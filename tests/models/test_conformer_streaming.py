"""Streaming a ConformerCTC (issue 41): the logits streamed chunk by chunk
are those of the whole-utterance forward with the same chunk mask, on every
backend, and a bad state or chunk is refused without touching the caller's
state."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import ConformerBlock
from keras_attn.models.conformer import ConformerStreamer
from keras_attn.models.conformer import build_conformer
from test_case import to_numpy

TINY = dict(num_layers=2, hidden_dim=16, num_heads=2, kernel_size=5, num_mel_bins=20,
            freq_mask_width=4)
STEP = 4 * 160  # samples per encoder frame


def streamable(**overrides):
    """A tiny ConformerCTC made streamable by hand: causal convolution
    modules and log-mel features without per-utterance normalisation, with
    BatchNorm moving statistics that are not the identity. (Phase 2 builds
    it from the config instead.)"""
    model = build_conformer("conformer_tiny", vocabulary_size=5, **dict(TINY, **overrides))
    rng = np.random.default_rng(3)
    for block in (layer for layer in model.layers if isinstance(layer, ConformerBlock)):
        block.causal_conv = block.conv_module.causal = True
        norm = block.conv_module.batch_norm
        norm.moving_mean.assign(rng.standard_normal(norm.moving_mean.shape) * 0.1)
        norm.moving_variance.assign(rng.uniform(0.5, 2.0, norm.moving_variance.shape))
    if model.conformer_config.input_type == "waveform":
        model.get_layer("log_mel").normalization = "none"
    return model


@pytest.fixture(scope="module")
def model():
    return streamable()


def audio(batch, samples, seed=0):
    return (np.random.default_rng(seed).standard_normal((batch, samples)) * 0.1).astype("float32")


def stream(streamer, wave, lengths, chunk):
    """Feeds `wave` (B, N) in chunks of `chunk` samples (the last one padded,
    each row's valid samples given), then flushes; the logits and state."""
    state, logits = streamer.initial_state(len(wave)), []
    for start in range(0, wave.shape[1], chunk):
        piece = wave[:, start:start + chunk]
        piece = np.pad(piece, ((0, 0), (0, chunk - piece.shape[1])))
        valid = np.clip(lengths - start, 0, chunk).astype("int32")
        step_logits, state = streamer.stream_step(piece, state, valid)
        logits.append(to_numpy(step_logits))
    step_logits, state = streamer.flush(state)
    return np.concatenate(logits + [to_numpy(step_logits)], axis=1), state


def greedy(logits, lengths):
    decoded, _ = ops.ctc_decode(ops.convert_to_tensor(logits), ops.convert_to_tensor(lengths),
                                strategy="greedy", mask_index=0)
    return to_numpy(decoded[0])


def assert_same_as_reference(streamer, wave, lengths, chunk):
    # The reference sees the batch as streamed: padded to whole chunks.
    padded = -(-wave.shape[1] // chunk) * chunk
    wave = np.pad(wave, ((0, 0), (0, padded - wave.shape[1])))
    reference = streamer.full_forward_with_chunk_mask(wave, lengths)
    expected, expected_lengths = to_numpy(reference["logits"]), to_numpy(reference["logit_lengths"])
    got, state = stream(streamer, wave, lengths, chunk)
    np.testing.assert_array_equal(to_numpy(state["logit_length"]), expected_lengths)
    assert got.shape == expected.shape
    real = np.arange(expected.shape[1])[None, :] < expected_lengths[:, None]
    np.testing.assert_allclose(got[real], expected[real], atol=1e-4)
    np.testing.assert_array_equal(greedy(got, expected_lengths), greedy(expected, expected_lengths))
    return expected_lengths


@pytest.mark.parametrize("chunk_size, left_context, samples_per_chunk", [
    (3, 4, STEP), (2, 0, 5 * STEP), (4, 8, 32 * STEP)])
def test_streamed_logits_equal_the_chunk_masked_forward(model, chunk_size, left_context,
                                                        samples_per_chunk):
    """Three utterances that end in different chunks (the second inside a
    chunk: a final partial chunk; the third shorter than one attention chunk)."""
    streamer = ConformerStreamer(model, chunk_size=chunk_size, left_context=left_context)
    lengths = np.array([12800, 9000, 1200], "int32")
    wave = audio(3, 12800) * (np.arange(12800)[None, :] < lengths[:, None])
    logit_lengths = assert_same_as_reference(streamer, wave, lengths, samples_per_chunk)
    assert logit_lengths.tolist() == [19, 13, 1]


def test_an_utterance_shorter_than_one_chunk(model):
    streamer = ConformerStreamer(model, chunk_size=8, left_context=8)
    lengths = np.array([1800], "int32")
    assert assert_same_as_reference(streamer, audio(1, 1800, seed=2), lengths, 2 * STEP).tolist() == [2]


def test_features_input_streams_frame_chunks():
    streamer = ConformerStreamer(streamable(input_type="features"), chunk_size=2, left_context=3)
    features = np.random.default_rng(5).standard_normal((2, 48, 20)).astype("float32")
    lengths = np.array([48, 30], "int32")
    expected = streamer.full_forward_with_chunk_mask(features, lengths)
    state, logits = streamer.initial_state(2), []
    for start in range(0, 48, 8):
        valid = np.clip(lengths - start, 0, 8).astype("int32")
        step_logits, state = streamer.stream_step(features[:, start:start + 8], state, valid)
        logits.append(to_numpy(step_logits))
    logits.append(to_numpy(streamer.flush(state)[0]))
    got, expected_logits = np.concatenate(logits, 1), to_numpy(expected["logits"])
    real = np.arange(got.shape[1])[None, :] < to_numpy(expected["logit_lengths"])[:, None]
    np.testing.assert_allclose(got[real], expected_logits[real], atol=1e-4)


def test_a_chunk_covering_the_utterance_is_the_offline_model(model):
    """With one chunk as long as the utterance the chunk mask hides nothing:
    the reference is the model's own offline call, and streaming leaves the
    model's offline outputs as they were."""
    lengths = np.array([6400, 4000], "int32")
    inputs = {"waveform": audio(2, 6400, seed=4), "waveform_length": lengths}
    before = to_numpy(model(inputs, training=False)["logits"])
    streamer = ConformerStreamer(model, chunk_size=64, left_context=0)
    reference = to_numpy(streamer.full_forward_with_chunk_mask(inputs["waveform"], lengths)["logits"])
    real = np.arange(before.shape[1])[None, :] < np.array([9, 5])[:, None]
    np.testing.assert_allclose(reference[real], before[real], atol=1e-5)
    stream(streamer, inputs["waveform"], lengths, 2 * STEP)
    np.testing.assert_array_equal(to_numpy(model(inputs, training=False)["logits"]), before)


def test_a_state_is_never_changed(model):
    """Stepping twice from one state gives the same answer, and a refused
    step leaves every entry of the caller's state as it was."""
    streamer = ConformerStreamer(model, chunk_size=2, left_context=2)
    _, state = streamer.stream_step(audio(1, 4 * STEP), streamer.initial_state(1))
    held = {name: to_numpy(value).copy() for name, value in state.items()}
    chunk = audio(1, 4 * STEP, seed=1)
    first, _ = streamer.stream_step(chunk, state)
    bad = chunk.copy()
    bad[0, 7] = np.inf
    with pytest.raises(ValueError, match=r"with NaN or inf"):
        streamer.stream_step(bad, state)
    second, _ = streamer.stream_step(chunk, state)
    np.testing.assert_array_equal(to_numpy(first), to_numpy(second))
    assert sorted(held) == sorted(state)
    for name, value in held.items():
        np.testing.assert_array_equal(to_numpy(state[name]), value)


def test_bad_states_and_chunks(model):
    streamer = ConformerStreamer(model, chunk_size=2, left_context=2)
    state = streamer.initial_state(2)
    chunk = audio(2, STEP)
    with pytest.raises(ValueError, match=r"it holds a batch of 2, the chunk one of 3"):
        streamer.stream_step(audio(3, STEP), state)
    half = dict(state, **{"block_1/key": ops.cast(state["block_1/key"], "float16")})
    with pytest.raises(ValueError, match=r"state\['block_1/key'\] of shape \(2, 2, 2, 8\) and dtype float16"):
        streamer.stream_step(chunk, half)
    one_block = ConformerStreamer(streamable(num_layers=1), chunk_size=2, left_context=2)
    with pytest.raises(ValueError, match=r"2 blocks\). Received: a state missing \['block_1/conv'"):
        streamer.stream_step(chunk, one_block.initial_state(2))
    with pytest.raises(ValueError, match=r"left_context is 2.*block_0/mask'\]\.shape=\(2, 5\)"):
        streamer.stream_step(chunk, ConformerStreamer(model, 2, 5).initial_state(2))
    with pytest.raises(ValueError, match=r"Received: chunk.shape=\(2, 640, 1\)"):
        streamer.stream_step(chunk[:, :, None], state)
    with pytest.raises(ValueError, match=r"multiple of the subsampling step, 640 samples.*\(2, 700\)"):
        streamer.stream_step(audio(2, 700), state)
    with pytest.raises(ValueError, match=r"Received: chunk_length=\[640, 700\]"):
        streamer.stream_step(chunk, state, np.array([640, 700], "int32"))


def test_models_that_cannot_stream_are_refused(model):
    offline = build_conformer("conformer_tiny", vocabulary_size=5, **TINY)
    with pytest.raises(ValueError, match=r"blocks \['conformer_block_0', 'conformer_block_1'\] have causal_conv=False"):
        ConformerStreamer(offline, chunk_size=2, left_context=2)
    for block in (layer for layer in offline.layers if isinstance(layer, ConformerBlock)):
        block.conv_module.causal = True
    with pytest.raises(ValueError, match=r"normalization='utterance'"):
        ConformerStreamer(offline, chunk_size=2, left_context=2)
    with pytest.raises(ValueError, match=r"Received: chunk_size=0"):
        ConformerStreamer(model, chunk_size=0, left_context=2)
    with pytest.raises(ValueError, match=r"Received: left_context=-1"):
        ConformerStreamer(model, chunk_size=2, left_context=-1)
    with pytest.raises(ValueError, match=r"Received: model=Dense"):
        ConformerStreamer(keras.layers.Dense(2), chunk_size=2, left_context=2)
