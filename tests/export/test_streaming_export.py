"""The streaming step exported to LiteRT and ONNX (issue 41, "On device"):
driven chunk by chunk by `keras_attn/export/streaming_runtime.py` in a
fresh process where TensorFlow and Keras cannot be imported, it gives the
greedy tokens of `ConformerCTC.stream_step`; float16 and int8 LiteRT run
and give tokens of the same form; bad input is refused by name and the
state held stays as it was."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn.data import speech
from keras_attn.export.streaming import export_streaming
from keras_attn.models.conformer import build_conformer
from keras_attn.zoo import runs
from test_case import to_numpy

# One worker (`-n 2 --dist loadgroup`): the module's fixture trains, exports
# and runs the fresh process once, not once on each worker.
pytestmark = [pytest.mark.tf_only, pytest.mark.xdist_group("streaming_export")]

RUNNER = os.path.join(os.path.dirname(__file__), "_run_streaming.py")
# The streaming digits recipe, tiny (one layer of 16, three steps).
TINY_RUN = [
    "model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
    "model.overrides.kernel_size=5", "data.utterances=24", "data.test_size=4",
    "data.validation_size=4", "training.batch_size=4", "training.epochs=1",
    "training.steps_per_epoch=3", "training.jit_compile=false",
    "evaluation.streaming_chunk_sizes=[]",
]


def keras_tokens(model, wave, chunk_size):
    """`ConformerCTC.stream_step` over `wave` in chunks of `chunk_size`
    encoder frames (the last one padded, its valid samples given), then
    `flush`: the greedy tokens and the final logit_length."""
    n = chunk_size * model.streamer(chunk_size).step  # 4 (8: FastConformer) x frame_step
    state, ids = model.initial_state(1, chunk_size), []
    for start in range(0, len(wave), n):
        piece = wave[start:start + n]
        valid = np.array([len(piece)], "int32")
        outputs, state = model.stream_step(np.pad(piece, (0, n - len(piece)))[None], state,
                                           valid, chunk_size=chunk_size)
        ids += to_numpy(outputs["token_ids"])[0].tolist()
    outputs, state = model.flush(state, chunk_size=chunk_size)
    ids += to_numpy(outputs["token_ids"])[0].tolist()
    return [t for t in ids if t >= 0], int(to_numpy(state["logit_length"])[0])


def _emit_tokens(model, wave):
    """Three steps teach a CTC model to say blank everywhere: a comparison of
    tokens needs tokens. The blank's bias is lowered so that about half of
    `wave`'s frames emit one: by the midpoint of the widest gap between two
    neighbouring margins (blank over the best token) in the middle half of
    the frames. Not by the median itself: that frame would then be a tie,
    which float rounding in either runtime decides (seen: LiteRT emitting
    one token more than Keras on one machine and not on another)."""
    outputs = model({"waveform": wave[None], "waveform_length": np.array([len(wave)])})
    logits = to_numpy(outputs["logits"])[0]
    margin = np.sort(logits[:, 0] - logits[:, 1:].max(axis=-1))
    quarter = len(margin) // 4
    middle = margin[quarter:len(margin) - quarter]
    widest = int(np.argmax(np.diff(middle)))
    head = model.get_layer("ctc_logits")
    kernel, bias = head.get_weights()
    bias[0] -= (middle[widest] + middle[widest + 1]) / 2
    head.set_weights([kernel, bias])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny trained run, its step exported once per case: LiteRT float32
    through `runs.export` (chunks of the recipe's 8 frames), ONNX float32
    at 4 frames, LiteRT float16 and int8; the fresh process's report."""
    root = tmp_path_factory.mktemp("streaming_export")
    run = str(root / "run")
    runs.train("conformer_tiny_digits_streaming", TINY_RUN, output=run, export=False,
               verbose=0)
    _, task, model, _ = runs.load_run(run)
    waves, _ = speech.load_spoken_digits(6, seed=7)
    waves = [np.asarray(w, "float32") for w in waves[:5]]
    _emit_tokens(model, waves[0])
    keras.saving.save_model(model, os.path.join(run, "model.keras"))  # what runs.export reads
    paths = {("litert", "float32", 8): runs.export(run, format="litert", streaming=True)[0]}
    for format, precision, chunk_size in (("onnx", "float32", 4), ("litert", "float16", 8),
                                          ("litert", "int8", 8)):
        path = str(root / f"{format}_{precision}_{chunk_size}")
        export_streaming(model, path, format, precision, chunk_size=chunk_size,
                         vocabulary=task.vocabulary)
        paths[format, precision, chunk_size] = path
    # One utterance shorter than a chunk, one a whole number of chunks.
    waves += [waves[0][:3000], waves[1][:5120 * 2]]
    np.savez(root / "waves.npz", **{str(i): w for i, w in enumerate(waves)})
    job = {"exports": list(paths.values()), "waveforms": str(root / "waves.npz"),
           "sampling_rate": model.conformer_config.sampling_rate,
           "refusals": paths["litert", "float32", 8]}
    result = subprocess.run([sys.executable, RUNNER, json.dumps(job)], capture_output=True,
                            text=True, timeout=900, cwd=str(root))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("RESULT")[-1])
    return {"model": model, "task": task, "paths": paths, "waves": waves, "report": report,
            "run": run}


@pytest.mark.slow
def test_the_runtime_process_imports_neither_tensorflow_nor_keras(exported):
    assert exported["report"]["imported"] == []


@pytest.mark.slow
@pytest.mark.parametrize("format, chunk_size", [("litert", 8), ("onnx", 4)])
def test_float32_streamed_tokens_are_keras_stream_step_tokens(exported, format, chunk_size):
    model = exported["model"]
    got = exported["report"]["exports"][exported["paths"][format, "float32", chunk_size]]
    expected = [keras_tokens(model, wave, chunk_size) for wave in exported["waves"]]
    # Tokens and every frame brought out by the flush (logit_length).
    assert [tuple(item) for item in got] == [(ids, length) for ids, length in expected]
    # A comparison of something: the model emits tokens.
    assert sum(len(ids) for ids, _ in expected) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float16", "int8"])
def test_float16_and_int8_litert_stream_tokens_of_the_vocabulary(exported, precision):
    got = exported["report"]["exports"][exported["paths"]["litert", precision, 8]]
    reference = exported["report"]["exports"][exported["paths"]["litert", "float32", 8]]
    vocabulary_size = exported["model"].vocabulary_size
    assert len(got) == len(exported["waves"])
    for (ids, length), (_, expected_length) in zip(got, reference):
        assert all(isinstance(t, int) and 1 <= t <= vocabulary_size for t in ids)
        assert length == expected_length  # the same frames, whatever the weights' precision


@pytest.mark.slow
def test_serving_json_describes_the_state_a_runtime_carries(exported):
    from keras_attn.export.portable import read_contract

    path = exported["paths"]["litert", "float32", 8]
    contract = read_contract(path)
    streaming = contract["streaming"]
    config = exported["model"].conformer_config
    assert streaming["chunk_samples"] == 8 * 4 * config.frame_step
    assert streaming["sampling_rate"] == config.sampling_rate
    assert streaming["blank_id"] == 0
    assert streaming["vocabulary"] == list(exported["task"].vocabulary)
    # runs.export wrote where it came from.
    assert contract["run"]["recipe"] == "conformer_tiny_digits_streaming"
    assert contract["run"]["directory"] == os.path.abspath(exported["run"])
    inputs = {spec["name"]: spec for spec in contract["inputs"]}
    outputs = {spec["name"]: spec for spec in contract["outputs"]}
    assert inputs["chunk"]["shape"] == [1, streaming["chunk_samples"]]
    for spec in streaming["state"]:
        # Each state tensor goes in and comes out with one shape and dtype.
        assert inputs[spec["input"]]["shape"] == outputs[spec["output"]]["shape"] == spec["shape"]
        assert inputs[spec["input"]]["dtype"] == outputs[spec["output"]]["dtype"] == spec["dtype"]
    assert len(inputs) == len(streaming["state"]) + 2
    assert outputs["token_ids"]["shape"] == [1, 8]


REFUSED = {
    "another export": r"`state`: it belongs to another export",
    "short chunk": r"`chunk`: this export takes \(1, 5120\).*Received: chunk.shape=\(1, 5119\)",
    "rank 1": r"`chunk`: .*rank 2\. Received: chunk.shape=\(5120,\)",
    "rank 3": r"`chunk`: .*rank 2\. Received: chunk.shape=\(1, 1, 5120\)",
    "integers": r"`chunk`: float audio.*Received: chunk.dtype=int16",
    "nan": r"`chunk`: audio samples must be finite\. Received: chunk with NaN or inf in row",
    "sampling rate": r"`sampling_rate`: this model takes 16000 Hz.*Received: sampling_rate=8000",
    "not a state": r"`state`: a StreamState.*Received: state of type dict",
    "long last samples": r"`last_samples`: .*\(1, 1..5120\).*Received: last_samples.shape="
                         r"\(1, 5121\)",
    "ended": r"`state`: its stream has ended.*Received: state.ended=True",
    "int16 range": r"`chunk`: audio samples must lie in \[-1, 1\].*Received: chunk\[0, \d+\]=",
    "negative counter": r"`state`: entry 'logit_length' cannot be below 0. Received: "
                        r"state.tensors\['logit_length'\]=\[-5\]",
}


@pytest.mark.slow
def test_bad_input_is_refused_by_name_and_the_held_state_is_untouched(exported):
    import re

    report = exported["report"]["refusals"]
    assert sorted(report["messages"]) == sorted(REFUSED)
    for name, pattern in REFUSED.items():
        message = report["messages"][name]
        assert message is not None and re.search(pattern, message), (name, message)
    assert report["unchanged"] and not report["writable"]
    # The stream goes on from the held state as if nothing had been refused.
    expected = exported["report"]["exports"][exported["paths"]["litert", "float32", 8]][0][0]
    assert report["tokens"] == expected
    # In the step itself, where nothing raises: int16-range samples give
    # NaN logits and tokens -2; counters just below int32's limit step as from 0 and
    # come out small (they wrapped: a stream of 37 h lost its frames).
    graph = report["graph"]
    assert graph["loud_logits_nan"]
    assert set(graph["loud_tokens"]) == {-2}  # never -1, which reads as silence
    assert max(graph["far_differences"]) < 1e-4, graph
    assert all(0 <= length < 2 ** 30 for length in graph["far_lengths"]), graph


@pytest.mark.slow
def test_the_fast_conformer_step_streams_keras_tokens_in_onnx_and_litert(tmp_path):
    """The FastConformer (issue 59; untrained, tiny, its blank bias lowered):
    FastConvSubsampling's stage buffers are state tensors of fixed shapes,
    and the exported step, driven by StreamingRecognizer in the fresh
    process, gives the tokens and frame count of Keras's stream_step."""
    keras.utils.set_random_seed(59)
    model = build_conformer(
        "conformer_tiny", vocabulary_size=5, subsampling="fast", subsampling_filters=4,
        scale_input=True, num_layers=1, hidden_dim=16, num_heads=2, kernel_size=5,
        num_mel_bins=16, chunk_size=2, left_context=3, causal_conv=True,
        feature_normalization="none")
    rng = np.random.default_rng(59)
    # A final partial chunk, one shorter than a chunk, whole chunks.
    waves = [(rng.standard_normal(n) * 0.1).astype("float32") for n in (9000, 1500, 5120)]
    _emit_tokens(model, waves[0])
    paths = []
    for format in ("onnx", "litert"):
        paths.append(export_streaming(model, str(tmp_path / format), format))
    np.savez(tmp_path / "waves.npz", **{str(i): w for i, w in enumerate(waves)})
    job = {"exports": paths, "waveforms": str(tmp_path / "waves.npz"),
           "sampling_rate": 16000, "refusals": None}
    result = subprocess.run([sys.executable, RUNNER, json.dumps(job)], capture_output=True,
                            text=True, timeout=600, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("RESULT")[-1])
    expected = [keras_tokens(model, wave, 2) for wave in waves]
    assert [length for _, length in expected] == [8, 2, 5]  # ceil((1 + samples // 160) / 8)
    assert sum(len(ids) for ids, _ in expected) >= 3, expected
    for path in paths:
        assert [tuple(item) for item in report["exports"][path]] == expected, path
    streaming = json.load(open(os.path.join(paths[0], "serving.json")))["streaming"]
    assert streaming["chunk_samples"] == 2 * 8 * 160
    assert {spec["name"] for spec in streaming["state"]} >= {
        f"subsampling/{entry}_{stage}" for entry in ("frames", "mask") for stage in (1, 2, 3)}


def test_a_model_that_cannot_stream_or_a_format_without_state_is_refused(tmp_path):
    offline = build_conformer("conformer_tiny", vocabulary_size=5, num_layers=1, hidden_dim=16,
                              num_mel_bins=20)
    with pytest.raises(ValueError, match=r"`chunk_size`: streaming needs a model built with "
                                         r"chunk_size.*Received: a model with chunk_size=None"):
        export_streaming(offline, tmp_path / "out", "litert")
    with pytest.raises(ValueError, match=r"exported as \('onnx', 'litert'\).*"
                                         r"Received: format='saved_model'"):
        export_streaming(offline, tmp_path / "out", "saved_model")
    with pytest.raises(ValueError, match=r"`precision` must be one of \('float32', 'float16'\) "
                                         r"for format='onnx'"):
        export_streaming(offline, tmp_path / "out", "onnx", "int8")
    assert not os.path.exists(tmp_path / "out")
