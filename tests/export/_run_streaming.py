"""Drives exported streaming steps with `keras_attn/export/streaming_runtime.py`,
loaded by its path, in a fresh process where TensorFlow, Keras and the
keras_attn package cannot be imported (an import of any of them raises):
what a device without them runs.

argv[1]: a JSON object `{"exports": [dir, ...], "waveforms": npz file,
"sampling_rate": int, "refusals": dir or null}`. Prints `RESULT` and a JSON
object: per export the greedy token ids and final `logit_length` of each
waveform, and for `refusals` the message of each bad call (None where a
call was not refused), whether the held state stayed as it was, and the
tokens of the utterance streamed on from that state."""

import importlib.abc
import importlib.util
import json
import os
import sys

BLOCKED = ("tensorflow", "keras", "keras_attn")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not importable in this process")


import numpy as np  # noqa: E402  (imports none of BLOCKED)

RUNTIME = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "keras_attn", "export", "streaming_runtime.py")


def load_runtime():
    spec = importlib.util.spec_from_file_location("streaming_runtime", RUNTIME)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transcribe(recognizer, wave, rate):
    """Tokens and final logit_length of one utterance, chunk by chunk."""
    n, ids = recognizer.chunk_samples, []
    state = recognizer.initial_state()
    whole = len(wave) - (len(wave) % n or n)
    for start in range(0, whole, n):
        outputs, state = recognizer.step(wave[None, start:start + n], state, sampling_rate=rate)
        ids += outputs["token_ids"][0].tolist()
    outputs, state = recognizer.finish(state, wave[None, whole:], sampling_rate=rate)
    ids += outputs["token_ids"][0].tolist()
    return [t for t in ids if t >= 0], int(state.tensors["logit_length"][0])


def refusals(recognizer, other, wave, rate):
    """Each bad call on a state held after the first chunk; then the
    utterance streamed on from that state."""
    n = recognizer.chunk_samples
    state = recognizer.initial_state()
    outputs, state = recognizer.step(wave[None, :n], state, sampling_rate=rate)
    ids = outputs["token_ids"][0].tolist()
    before = {name: value.copy() for name, value in state.tensors.items()}
    good = wave[None, n:2 * n]
    nan = good.copy()
    nan[0, 5] = np.nan
    calls = {
        "another export": lambda: recognizer.step(good, other.initial_state()),
        "short chunk": lambda: recognizer.step(wave[None, n:2 * n - 1], state),
        "rank 1": lambda: recognizer.step(wave[n:2 * n], state),
        "rank 3": lambda: recognizer.step(good[None], state),
        "integers": lambda: recognizer.step((good * 32767).astype("int16"), state),
        "nan": lambda: recognizer.step(nan, state),
        "sampling rate": lambda: recognizer.step(good, state, sampling_rate=rate // 2),
        "not a state": lambda: recognizer.step(good, dict(state.tensors)),
        "long last samples": lambda: recognizer.finish(state, wave[None, :n + 1]),
        "int16 range": lambda: recognizer.step(good * 32768, state),
        "negative counter": lambda: recognizer.step(good, type(state)(
            dict(state.tensors, logit_length=np.array([-5], "int32")), state.export)),
    }
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    try:  # the held arrays are read-only: no caller can half-update them either
        state.tensors["logit_length"][0] = 5
        writable = True
    except ValueError:
        writable = False
    unchanged = all(np.array_equal(state.tensors[name], value) for name, value in before.items())
    whole = len(wave) - (len(wave) % n or n)
    for start in range(n, whole, n):
        outputs, state = recognizer.step(wave[None, start:start + n], state, sampling_rate=rate)
        ids += outputs["token_ids"][0].tolist()
    outputs, ended = recognizer.finish(state, wave[None, whole:], sampling_rate=rate)
    ids += outputs["token_ids"][0].tolist()
    try:
        recognizer.step(good, ended)
        messages["ended"] = None
    except ValueError as error:
        messages["ended"] = str(error)
    return {"messages": messages, "unchanged": unchanged, "writable": writable,
            "tokens": [t for t in ids if t >= 0], "graph": in_the_graph(recognizer, wave)}


def in_the_graph(recognizer, wave):
    """The step itself, where nothing raises: int16-range samples make the
    row's logits NaN; counters just below int32's limit (a stream of days)
    step as the same state counted from 0, and come out small."""
    n = recognizer.chunk_samples
    hop = n // (4 * int(recognizer.streaming["chunk_size"]))

    def run(tensors, chunk):
        inputs = dict(tensors, chunk=chunk.astype("float32"),
                      chunk_length=np.full((1,), n, "int32"))
        outputs = recognizer.artifact(**inputs)
        run.token_ids = outputs["token_ids"].copy()
        return outputs["logits"].copy(), {spec["input"]: outputs[spec["output"]].copy()
                                          for spec in recognizer.streaming["state"]}

    _, near = run(recognizer.initial_state().tensors, wave[None, :n])
    loud, _ = run(near, wave[None, n:2 * n] * 32768)
    loud_tokens = run.token_ids.ravel().tolist()
    frames = (2 ** 31 - 4 * n) // hop - int(near["log_mel_next_frame"][0])
    far = dict(near, log_mel_next_frame=near["log_mel_next_frame"] + frames,
               log_mel_length=near["log_mel_length"] + frames * hop)
    differences, counters = [], []
    for start in (n, 2 * n):
        expected, near = run(near, wave[None, start:start + n])
        got, far = run(far, wave[None, start:start + n])
        differences.append(float(np.abs(got - expected).max()))
        counters.append(int(far["log_mel_length"][0]))
    return {"loud_logits_nan": bool(np.isnan(loud).all()), "loud_tokens": loud_tokens,
            "far_differences": differences,
            "far_lengths": counters}


def main(job):
    runtime = load_runtime()
    with np.load(job["waveforms"]) as stored:
        waves = [stored[key] for key in sorted(stored.files, key=int)]
    rate = job["sampling_rate"]
    result = {"exports": {}}
    recognizers = {path: runtime.StreamingRecognizer(path) for path in job["exports"]}
    for path, recognizer in recognizers.items():
        result["exports"][path] = [transcribe(recognizer, wave, rate) for wave in waves]
    if job["refusals"]:
        recognizer = recognizers[job["refusals"]]
        other = next(r for p, r in recognizers.items() if p != job["refusals"])
        result["refusals"] = refusals(recognizer, other, waves[0], rate)
    result["imported"] = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    print("RESULT" + json.dumps(result))


if __name__ == "__main__":
    # Here, not at import: pytest's --doctest-modules imports this file into
    # the test process, where the blocker would refuse keras_attn to every
    # test collected after it.
    sys.meta_path.insert(0, _Refuse())
    main(json.loads(sys.argv[1]))
