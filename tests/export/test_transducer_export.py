"""A ConformerTransducer served from a SavedModel, and from ONNX and
LiteRT with their runtimes alone: the traced greedy walk
(`transducer_greedy_ids`, one while loop, with any batch and length) gives
the model's transcripts, with their text; a NaN row answers -2; the traced
beam search is refused by name."""

import numpy as np
import pytest

from keras_attn.export import export_speech_recognizer
from keras_attn.models.conformer import build_conformer_transducer

pytestmark = [pytest.mark.large, pytest.mark.tf_only]


def _model(durations):
    model = build_conformer_transducer(
        "conformer_tiny", vocabulary_size=5, num_layers=1, hidden_dim=16, num_mel_bins=20,
        freq_mask_width=8, predictor_dim=8, durations=durations, max_symbols_per_step=3)
    rng = np.random.default_rng(2)  # drawn away from the start: labels get emitted
    for weight in model.predictor.weights + model.joint.weights:
        weight.assign(rng.normal(0, 1.0, weight.shape).astype("float32"))
    return model


@pytest.mark.parametrize("durations", [None, [0, 1, 2]])
def test_the_saved_model_transcribes_as_the_model(tmp_path, durations):
    import tensorflow as tf

    model = _model(durations)
    path = export_speech_recognizer(model, tmp_path / "asr", vocabulary=list("abcde"))
    loaded = tf.saved_model.load(str(path))
    rng = np.random.default_rng(0)
    lengths = np.array([9000, 4000, 6500], "int32")
    wave = np.zeros((3, 9000), "float32")
    for i, n in enumerate(lengths):
        wave[i, :n] = rng.standard_normal(n) * 0.1
    want = model.decode({"waveform": wave, "waveform_length": lengths})
    served = loaded.signatures["serving_default"](waveform=wave, waveform_length=lengths)
    got = served["token_ids"].numpy()
    assert [row[row > 0].tolist() for row in got] == [row[row > 0].tolist() for row in want]
    assert (got > 0).sum() >= 3
    texts = [t.decode() for t in served["text"].numpy()]
    assert texts == ["".join("abcde"[i - 1] for i in row[row > 0]) for row in want]
    wave[-1, 5] = 3000.0  # 16-bit PCM as floats: NaN where nothing raises
    got = loaded.serve(wave, lengths)["token_ids"].numpy()
    assert (got[-1] == -2).all()


# Each converter once, each walk once (the walk is one function: the
# duration branch is what TDT adds).
@pytest.mark.parametrize("format, durations", [("onnx", [0, 1, 2]), ("litert", None)])
def test_onnx_and_litert_transcribe_as_the_model_with_their_runtime(tmp_path, format,
                                                                      durations):
    from keras_attn.export import SpeechRecognizerArtifact

    model = _model(durations)
    path = export_speech_recognizer(model, tmp_path / "asr", format=format,
                                    vocabulary=list("abcde"))
    recognizer = SpeechRecognizerArtifact(str(path))
    rng = np.random.default_rng(0)
    lengths = np.array([9000, 4000], "int32")
    wave = np.zeros((2, 9000), "float32")
    for i, n in enumerate(lengths):
        wave[i, :n] = rng.standard_normal(n) * 0.1
    want = [row[row > 0].tolist()
            for row in model.decode({"waveform": wave, "waveform_length": lengths})]
    outputs = recognizer.artifact(waveform=wave, waveform_length=lengths)
    got = np.asarray(outputs["token_ids"])
    assert [row[row > 0].tolist() for row in got] == want and sum(map(len, want)) >= 3
    assert got.shape[1] == 3 * np.asarray(outputs["frames"]).shape[1]  # T' x max_symbols
    texts = recognizer([wave[0, :9000], wave[1, :4000]])["text"]
    assert texts == ["".join("abcde"[i - 1] for i in row) for row in want]
    wave[-1, 5] = 3000.0  # outside [-1, 1]: the graph answers -2, never a transcript
    got = np.asarray(recognizer.artifact(waveform=wave, waveform_length=lengths)["token_ids"])
    assert (got[-1] == -2).all() and [r[r > 0].tolist() for r in got[:1]] == want[:1]


def _tones(rows, samples, seed=0):
    """Tones that change every 0.1 s: encoder frames that differ."""
    rng = np.random.default_rng(seed)
    pitch = np.repeat(rng.uniform(200, 3000, (rows, samples // 1600 + 1)), 1600, axis=1)
    return (0.3 * np.sin(2 * np.pi * pitch[:, :samples] * np.arange(samples) / 16000)
            ).astype("float32")


# The streaming step: ONNX with TDT, LiteRT with RNN-T (as above).
@pytest.mark.parametrize("format, durations", [("onnx", [0, 1, 2, 3]), ("litert", None)])
def test_the_streaming_step_transcribes_as_the_model_offline(tmp_path, format, durations):
    """The exported step (encoder chunk, then the walk over its frames from
    the decoder state it carries) run by `StreamingRecognizer` with the
    runtime alone: each row's labels are the offline transcript of the
    chunk-masked model (`decode`), TDT's moves past a chunk's end included."""
    from keras_attn.export import export_streaming
    from keras_attn.export.streaming_runtime import StreamingRecognizer
    from test_case import redraw_transducer

    model = build_conformer_transducer(
        "conformer_tiny", vocabulary_size=5, num_layers=2, hidden_dim=16, num_heads=2,
        kernel_size=5, num_mel_bins=20, freq_mask_width=4, predictor_dim=8,
        durations=durations, max_symbols_per_step=3, chunk_size=2, left_context=4,
        causal_conv=True, feature_normalization="none")
    redraw_transducer(model, 1)
    if durations is not None:  # longer moves: some pass a chunk's end
        bias = model.joint.head.bias
        bias.assign(np.asarray(bias) + np.eye(bias.shape[0])[-1].astype("float32") * 3.0)
    wave = _tones(2, 12800)
    wave[1, 7000:] = 0.0
    want = [row[row > 0].tolist() for row in model.decode(
        {"waveform": wave, "waveform_length": np.array([12800, 12800], "int32")})]
    path = export_streaming(model, tmp_path / "step", format=format, batch_size=2,
                            vocabulary=list("abcde"))
    recognizer = StreamingRecognizer(str(path))
    assert recognizer.transcribe(wave) == want and sum(map(len, want)) >= 3
    # Step by step: the state carries the walk's skip past a chunk's end.
    state, skips, labels = recognizer.initial_state(), [], [[], []]
    chunk = recognizer.chunk_samples
    whole = 12800 - (12800 % chunk or chunk)
    for start in range(0, whole, chunk):
        outputs, state = recognizer.step(wave[:, start:start + chunk], state)
        skips.append(int(state.tensors["decoder_skip"].max()))
        assert outputs["token_ids"].shape[1] == 2 * 3  # chunk_size x max_symbols_per_step
        for row, ids in enumerate(outputs["token_ids"]):
            labels[row] += ids[ids > 0].tolist()
    outputs, state = recognizer.finish(state, wave[:, whole:])
    for row, ids in enumerate(outputs["token_ids"]):
        labels[row] += ids[ids > 0].tolist()
    assert labels == want
    assert (max(skips) > 0) == (durations is not None), skips
    # A negative skip: refused by the runtime's wrapper; the step itself
    # (nothing raises in a graph) answers -2 for that row, never labels;
    # a valid step right after gives the labels it gave before.
    held = recognizer.initial_state()
    first = recognizer.step(wave[:, :chunk], held)[0]["token_ids"]
    bad = dict(held.tensors, decoder_skip=np.array([0, -1], "int32"))
    with pytest.raises(ValueError, match=r"'decoder_skip' cannot be below 0"):
        recognizer.step(wave[:, :chunk], type(held)(bad, held.export))
    inputs = dict(bad, chunk=wave[:, :chunk], chunk_length=np.full(2, chunk, "int32"))
    ids = np.asarray(recognizer.artifact(**inputs)["token_ids"])
    assert (ids[1] == -2).all() and (ids[0] != -2).all()
    np.testing.assert_array_equal(recognizer.step(wave[:, :chunk], held)[0]["token_ids"], first)


def test_what_the_export_refuses(tmp_path):
    model = _model(None)
    with pytest.raises(ValueError, match=r"walks greedily.*strategy='beam_search'"):
        export_speech_recognizer(model, tmp_path / "b", strategy="beam_search")
