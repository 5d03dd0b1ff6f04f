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
# The full matrix runs on TensorFlow; JAX and PyTorch run one case of each
# contract (JAX traces each new shape: a few cases keep its run short).
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"


def streamable(**overrides):
    """A tiny streamable ConformerCTC from its config (causal convolution
    modules, log-mel features without per-utterance normalisation, chunked
    attention), with BatchNorm moving statistics that are not the identity."""
    fields = dict(TINY, chunk_size=3, left_context=4, causal_conv=True,
                  feature_normalization="none")
    model = build_conformer("conformer_tiny", vocabulary_size=5, **dict(fields, **overrides))
    rng = np.random.default_rng(3)
    for block in (layer for layer in model.layers if isinstance(layer, ConformerBlock)):
        norm = getattr(block.conv_module, "batch_norm", None)
        if norm is None:
            continue
        norm.moving_mean.assign(rng.standard_normal(norm.moving_mean.shape) * 0.1)
        norm.moving_variance.assign(rng.uniform(0.5, 2.0, norm.moving_variance.shape))
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


CHUNKINGS = [(3, 4, STEP), (2, 0, 5 * STEP), (4, 8, 32 * STEP)]


@pytest.mark.parametrize("chunk_size, left_context, samples_per_chunk",
                         CHUNKINGS if ON_TENSORFLOW else CHUNKINGS[1:2])
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


def test_the_configured_chunk_mask_is_the_offline_model(model):
    """A model built with chunk_size and left_context applies their chunk
    mask in its own offline call: the streamer's reference at those sizes is
    that call, and streaming leaves the model's offline outputs as they were."""
    lengths = np.array([6400, 4000], "int32")
    inputs = {"waveform": audio(2, 6400, seed=4), "waveform_length": lengths}
    before = to_numpy(model(inputs, training=False)["logits"])
    config = model.conformer_config
    streamer = ConformerStreamer(model, chunk_size=config.chunk_size,
                                 left_context=config.left_context)
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
    with pytest.raises(ValueError, match=r"`chunk_size`.*Received: a model with chunk_size=None"):
        offline.initial_state(1)
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


# === The model's streaming API: ConformerCTC.initial_state / stream_step / flush ===


def stream_tokens(model, wave, lengths, samples_per_chunk, chunk_size=None):
    """Each row's greedy tokens and the concatenated logits, streamed
    through the model's API in pieces of `samples_per_chunk` (the last one
    padded), then flushed."""
    state, logits, ids = model.initial_state(len(wave), chunk_size), [], []
    for start in range(0, wave.shape[1], samples_per_chunk):
        piece = wave[:, start:start + samples_per_chunk]
        piece = np.pad(piece, ((0, 0), (0, samples_per_chunk - piece.shape[1])))
        valid = np.clip(lengths - start, 0, samples_per_chunk).astype("int32")
        outputs, state = model.stream_step(piece, state, valid, chunk_size=chunk_size)
        logits.append(to_numpy(outputs["logits"]))
        ids.append(to_numpy(outputs["token_ids"]))
    outputs, state = model.flush(state, chunk_size=chunk_size)
    logits.append(to_numpy(outputs["logits"]))
    ids.append(to_numpy(outputs["token_ids"]))
    ids = np.concatenate(ids, axis=1)
    return [row[row >= 0].tolist() for row in ids], np.concatenate(logits, axis=1), state


def offline_tokens(model, wave, lengths):
    outputs = model({"waveform": wave, "waveform_length": lengths}, training=False)
    decoded = greedy(to_numpy(outputs["logits"]), to_numpy(outputs["logit_lengths"]))
    return [row[row >= 0].tolist() for row in decoded], outputs


@pytest.fixture(scope="module")
def peaky():
    """A streamable model whose head makes the greedy path emit tokens and
    repeats (the random tiny model mostly says blank): the head's bias
    favours labels over the blank."""
    model = streamable(chunk_size=2, left_context=4)
    head = model.get_layer("ctc_logits")
    head.bias.assign(np.array([-1.0, 0.5, 0.4, 0.3, 0.2, 0.1], "float32"))
    return model


# Samples per stream_step, in encoder frames of 640 samples. JAX and
# PyTorch run 5: like 1 and 7, a step that ends inside a 2-frame chunk (a
# frame carried to the next step), and the shapes of
# test_streamed_logits_equal_the_chunk_masked_forward's case there (the
# same batch and waveform width, pieces of 5 frames into 2-frame chunks):
# JAX compiles them once for both.
CASES = [1, 2, 7] if ON_TENSORFLOW else [5]


@pytest.mark.parametrize("frames_per_step", CASES)
def test_streamed_tokens_are_the_offline_models(peaky, frames_per_step):
    """The model built with chunk_size=2 streams the tokens and logits of
    its own offline call (which applies the chunk mask): one utterance a
    final partial chunk, one shorter than a chunk, one ending before the
    batch's last chunk; repeats across chunk boundaries are merged."""
    lengths = np.array([12800, 9000, 1000], "int32")
    wave = audio(3, 12800, seed=7) * (np.arange(12800)[None, :] < lengths[:, None])
    padded = -(-12800 // (frames_per_step * STEP)) * frames_per_step * STEP
    wave = np.pad(wave, ((0, 0), (0, padded - 12800))).astype("float32")
    expected, outputs = offline_tokens(peaky, wave, lengths)
    got, logits, state = stream_tokens(peaky, wave, lengths, frames_per_step * STEP)
    expected_lengths = to_numpy(outputs["logit_lengths"])
    np.testing.assert_array_equal(to_numpy(state["logit_length"]), expected_lengths)
    real = np.arange(logits.shape[1])[None, :] < expected_lengths[:, None]
    np.testing.assert_allclose(logits[real], to_numpy(outputs["logits"])[:, :logits.shape[1]][real],
                               atol=1e-4)
    assert got == expected
    assert sum(len(row) for row in got) > 0


def test_a_token_repeated_across_chunks_is_emitted_once(peaky):
    """A head that says label 2 at every frame: each utterance's greedy
    transcript is [2] although every chunk's frames say it again."""
    head = peaky.get_layer("ctc_logits")
    kernel, bias = to_numpy(head.kernel).copy(), to_numpy(head.bias).copy()
    head.kernel.assign(np.zeros_like(kernel))
    head.bias.assign(np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], "float32"))
    try:
        lengths = np.array([6400, 3000], "int32")
        got = stream_tokens(peaky, audio(2, 6400, seed=10), lengths, 2 * STEP)[0]
    finally:
        head.kernel.assign(kernel)
        head.bias.assign(bias)
    assert got == [[2], [2]]


def test_an_utterance_shorter_than_a_chunk_streams_on_flush(peaky):
    wave, lengths = audio(1, 1800, seed=8), np.array([1800], "int32")
    padded = np.pad(wave, ((0, 0), (0, 2 * STEP * 2 - 1800)))
    state = peaky.initial_state(1)
    outputs, state = peaky.stream_step(padded, state, lengths)
    assert to_numpy(outputs["logits"]).shape == (1, 2, 6)  # one whole chunk of 2 frames
    outputs, state = peaky.flush(state)
    assert to_numpy(state["logit_length"]).tolist() == [2]
    assert stream_tokens(peaky, padded, lengths, 4 * STEP)[0] == offline_tokens(peaky, padded, lengths)[0]


def test_another_chunk_size_streams_its_own_chunk_mask(peaky):
    lengths = np.array([6400], "int32")
    wave = audio(1, 6400, seed=9)
    streamer = peaky.streamer(4)
    reference = streamer.full_forward_with_chunk_mask(wave, lengths)
    expected = greedy(to_numpy(reference["logits"]), to_numpy(reference["logit_lengths"]))
    got = stream_tokens(peaky, wave, lengths, 4 * STEP, chunk_size=4)[0]
    assert got == [expected[0][expected[0] >= 0].tolist()]


def test_the_models_api_refuses_bad_states_whole(peaky):
    state = peaky.initial_state(2)
    chunk = audio(2, 2 * STEP)
    _, stepped = peaky.stream_step(chunk, state)
    held = {name: to_numpy(value).copy() for name, value in stepped.items()}
    with pytest.raises(ValueError, match=r"'decoder/last' entry"):
        peaky.stream_step(chunk, {k: v for k, v in stepped.items() if k != "decoder/last"})
    with pytest.raises(ValueError, match=r"'decoder/last'.*Received: state\['decoder/last'\] of shape \(2,\) and dtype float32"):
        peaky.stream_step(chunk, dict(stepped, **{"decoder/last": np.zeros(2, "float32")}))
    with pytest.raises(ValueError, match=r"different batch sizes. Received: shapes \(3,\) and \(2,\)"):
        peaky.stream_step(chunk, dict(stepped, **{"decoder/last": np.zeros(3, "int32")}))
    bad = chunk.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"with NaN or inf"):
        peaky.stream_step(bad, stepped)
    for name, value in held.items():
        np.testing.assert_array_equal(to_numpy(stepped[name]), value)


def test_audio_outside_minus_one_one_is_refused(peaky):
    """int16-range samples given as floats (x 32768) change the transcript
    silently: the docstrings' float audio in [-1, 1] is checked."""
    loud = audio(1, 2 * STEP) * 32768
    state = peaky.initial_state(1)
    with pytest.raises(ValueError, match=r"`chunk`: audio samples must lie in \[-1, 1\] "
                                         r".*Received: chunk\[0, \d+\]=-?\d+"):
        peaky.stream_step(loud, state)
    with pytest.raises(ValueError, match=r"`chunk`: audio samples must lie in \[-1, 1\]"):
        ConformerStreamer(peaky, 2, 4).stream_step(loud, state)


def test_the_state_records_its_chunk_size_and_counts_up_from_0(peaky):
    # A state started at 4 frames, stepped at the model's 2, then at 4
    # again gave logits of neither chunk mask.
    state = peaky.initial_state(1, chunk_size=4)
    chunk = audio(1, 4 * STEP)
    _, stepped = peaky.stream_step(chunk, state, chunk_size=4)
    with pytest.raises(ValueError, match=r"`chunk_size`: this state streams chunks of 4 encoder "
                                         r"frames.*Received: chunk_size=2, state\['chunk_size'\]=4"):
        peaky.stream_step(chunk, stepped)  # the model's chunk size, 2
    with pytest.raises(ValueError, match=r"Received: chunk_size=2, state\['chunk_size'\]=4"):
        peaky.flush(stepped)
    stepped = peaky.stream_step(chunk, peaky.initial_state(1), chunk_size=2)[1]
    negative = dict(stepped, logit_length=ops.convert_to_tensor(np.array([-5], "int32")))
    with pytest.raises(ValueError, match=r"'logit_length' counts encoder frames: it cannot be "
                                         r"negative. Received: state\['logit_length'\]=\[-5\]"):
        peaky.stream_step(chunk, negative, chunk_size=2)
    with pytest.raises(ValueError, match=r"'log_mel/received' counts samples: it cannot be "
                                         r"negative. Received: state\['log_mel/received'\]=-1"):
        peaky.stream_step(chunk, dict(stepped, **{"log_mel/received": ops.convert_to_tensor(
            np.int32(-1))}), chunk_size=2)


# === The config fields (issue 41, phase 2) ===


@pytest.mark.parametrize("fields, message", [
    (dict(chunk_size=4), r"`chunk_size` and `left_context` go together.*left_context=None"),
    (dict(left_context=4), r"go together.*chunk_size=None, left_context=4"),
    (dict(chunk_size=4, left_context=4, feature_normalization="none"),
     r"needs `causal_conv=True`.*causal_conv=False"),
    (dict(chunk_size=4, left_context=4, causal_conv=True),
     r"feature_normalization=\"none\"`.*feature_normalization='utterance'"),
    (dict(dynamic_chunk_training=True), r"needs `chunk_size`.*chunk_size=None"),
    (dict(chunk_size=0, left_context=1), r"Received: chunk_size=0"),
    (dict(conv_norm="group_norm"), r"Received: conv_norm='group_norm'"),
    (dict(feature_normalization="global"), r"Received: feature_normalization='global'"),
])
def test_streaming_fields_are_checked_in_the_config(fields, message):
    from keras_attn.models.conformer import get_conformer_config

    with pytest.raises(ValueError, match=message):
        get_conformer_config("conformer_tiny", **fields)


def test_features_input_needs_no_feature_normalization_field():
    from keras_attn.models.conformer import get_conformer_config

    config = get_conformer_config("conformer_tiny", input_type="features", chunk_size=2,
                                  left_context=2, causal_conv=True)
    assert config.feature_normalization == "utterance"  # unused: no log-mel layer


def test_presets_and_old_configs_are_offline():
    """Presets keep whole-utterance attention, the centred convolution,
    BatchNorm and per-utterance normalisation; a config saved before these
    fields existed loads to the same model and outputs."""
    from keras_attn.models.conformer import CONFORMER_PRESETS
    from keras_attn.models.conformer import ConformerCTC

    for config in CONFORMER_PRESETS.values():
        assert (config.chunk_size, config.left_context, config.dynamic_chunk_training,
                config.causal_conv, config.conv_norm, config.feature_normalization) == (
            None, None, False, False, "batch_norm", "utterance")
    # One block: the fields are the model's, read once by every block alike.
    offline = build_conformer("conformer_tiny", vocabulary_size=5, **dict(TINY, num_layers=1))
    saved = offline.get_config()
    for name in ("chunk_size", "left_context", "dynamic_chunk_training", "causal_conv",
                 "conv_norm", "feature_normalization"):
        saved.pop(name)
    loaded = ConformerCTC.from_config(saved)
    loaded.set_weights(offline.get_weights())
    inputs = {"waveform": audio(2, 6400, seed=11), "waveform_length": np.array([6400, 3000], "int32")}
    np.testing.assert_array_equal(to_numpy(loaded(inputs)["logits"]),
                                  to_numpy(offline(inputs)["logits"]))
    assert "chunk_mask" not in [layer.name for layer in loaded.layers]


def test_the_fields_reach_the_layers():
    model = streamable(conv_norm="layer_norm")
    blocks = [layer for layer in model.layers if isinstance(layer, ConformerBlock)]
    assert [(b.conv_module.causal, b.conv_module.norm) for b in blocks] == [(True, "layer_norm")] * 2
    assert model.get_layer("log_mel").normalization == "none"
    assert model.get_layer("chunk_mask").chunk_size == 3


def test_dynamic_chunk_training_draws_a_chunk_size_per_batch():
    """In training each call's mask is the chunk mask of one size in 1..25
    frames or of the whole utterance (each seen); at inference the
    configured size's."""
    from keras_attn.layers import chunk_attention_mask
    from keras_attn.models.conformer.conformer_model import ChunkMask

    layer = ChunkMask(3, 2, dynamic=True, max_chunk_size=25, seed=1)
    x = np.zeros((1, 30, 4), "float32")
    candidates = {size: to_numpy(chunk_attention_mask(30, size, 2)) for size in range(1, 31)}
    drawn = []
    for _ in range(24):
        mask = to_numpy(layer(x, training=True))
        sizes = [size for size, candidate in candidates.items()
                 if (size <= 25 or size == 30) and np.array_equal(mask, candidate)]
        assert sizes, "a mask that is no chunk mask"
        drawn.append(min(sizes))
    assert 30 in drawn and any(size < 25 for size in drawn)
    assert len(set(drawn)) > 3
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), candidates[3])


# === The FastConformer (issue 59): subsampling="fast", 8x, x sqrt(D) ===

FAST_STEP = 8 * 160  # samples per 80 ms encoder frame


def fast_streamable(**overrides):
    fields = dict(subsampling="fast", subsampling_filters=4, scale_input=True,
                  batch_norm_epsilon=1e-5, num_mel_bins=16, chunk_size=2, left_context=3)
    model = streamable(**dict(fields, **overrides))
    head = model.get_layer("ctc_logits")  # tokens to compare, as `peaky`
    head.bias.assign(np.array([-1.0, 0.5, 0.4, 0.3, 0.2, 0.1], "float32"))
    return model


@pytest.mark.parametrize("frames_per_step", [1, 3] if ON_TENSORFLOW else [3])
def test_the_fast_conformer_streams_its_offline_logits(frames_per_step):
    """FastConvSubsampling's stages stream (each pads a zero frame before
    and after the utterance) and the x sqrt(D) input scale applies: the
    streamed logits and tokens are those of the model's own offline call
    with its chunk mask (rows ending in a final partial chunk, inside the
    last chunk and before the first one is whole)."""
    model = fast_streamable()
    lengths = np.array([12800, 9000, 1000], "int32")
    step = frames_per_step * FAST_STEP
    padded = -(-12800 // step) * step
    wave = audio(3, 12800, seed=12) * (np.arange(12800)[None, :] < lengths[:, None])
    wave = np.pad(wave, ((0, 0), (0, padded - 12800))).astype("float32")
    expected, outputs = offline_tokens(model, wave, lengths)
    expected_lengths = to_numpy(outputs["logit_lengths"])
    assert expected_lengths.tolist() == [11, 8, 1]  # ceil(frames / 8)
    reference = model.streamer().full_forward_with_chunk_mask(wave, lengths)
    np.testing.assert_allclose(to_numpy(reference["logits"]), to_numpy(outputs["logits"]),
                               atol=1e-5)
    got, logits, state = stream_tokens(model, wave, lengths, step)
    np.testing.assert_array_equal(to_numpy(state["logit_length"]), expected_lengths)
    real = np.arange(logits.shape[1])[None, :] < expected_lengths[:, None]
    np.testing.assert_allclose(logits[real],
                               to_numpy(outputs["logits"])[:, :logits.shape[1]][real], atol=1e-4)
    assert got == expected
    assert sum(len(row) for row in got) > 0


def test_the_fast_conformer_streams_feature_frames():
    model = fast_streamable(input_type="features")
    streamer = model.streamer()
    assert streamer.step == 8
    features = np.random.default_rng(13).standard_normal((2, 48, 16)).astype("float32")
    lengths = np.array([48, 29], "int32")
    outputs = model({"features": features, "feature_length": lengths}, training=False)
    state, logits = streamer.initial_state(2), []
    for start in range(0, 48, 16):
        valid = np.clip(lengths - start, 0, 16).astype("int32")
        step_logits, state = streamer.stream_step(features[:, start:start + 16], state, valid)
        logits.append(to_numpy(step_logits))
    logits.append(to_numpy(streamer.flush(state)[0]))
    got, expected = np.concatenate(logits, 1), to_numpy(outputs["logits"])
    expected_lengths = to_numpy(outputs["logit_lengths"])
    assert expected_lengths.tolist() == [6, 4]
    real = np.arange(got.shape[1])[None, :] < expected_lengths[:, None]
    np.testing.assert_allclose(got[real], expected[:, :got.shape[1]][real], atol=1e-4)
    with pytest.raises(ValueError, match=r"multiple of the subsampling step, 8 frames"):
        streamer.stream_step(features[:, :4], streamer.initial_state(2))


def test_the_parakeet_front_end_does_not_stream_waveforms():
    """Parakeet's features are normalised over the whole utterance: a
    waveform model with them cannot stream; a features model can (its
    features are the caller's)."""
    from keras_attn.models.conformer import get_conformer_config

    fields = dict(chunk_size=2, left_context=2, causal_conv=True)
    with pytest.raises(ValueError, match=r"normalises each feature over the whole utterance.*"
                                         r"Received: chunk_size=2, front_end='parakeet'"):
        get_conformer_config("parakeet_ctc_tiny", **fields)
    config = get_conformer_config("parakeet_ctc_tiny", input_type="features", **fields)
    assert (config.subsampling, config.chunk_size) == ("fast", 2)
    # An offline model (streaming, and its ONNX / LiteRT streaming export,
    # start from `streamer`) is refused for its front end, by name.
    model = build_conformer("parakeet_ctc_tiny", vocabulary_size=5, num_layers=1,
                            hidden_dim=16, subsampling_filters=8, num_mel_bins=20,
                            freq_mask_width=8, causal_conv=True)
    with pytest.raises(ValueError, match=r"Received: a model with front_end='parakeet'"):
        model.streamer(2)
