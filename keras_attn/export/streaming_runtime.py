"""Streaming speech recognition on a device: the step that
`keras_attn.export.streaming` exported (ONNX or LiteRT), driven chunk by
chunk with NumPy and its runtime (onnxruntime, ai_edge_litert), decoded
greedily. Neither TensorFlow nor Keras is imported, here or in
`portable.py`, the only module of the package this one uses. On a machine
without them, install the package without its dependencies (`pip install
--no-deps keras-attn`: `import keras_attn` then loads no Keras), or copy the
two files and load this one by its path (it then loads `portable.py`
beside it).

    recognizer = StreamingRecognizer("exported/streaming_litert")
    state = recognizer.initial_state()
    for chunk in chunks:          # (B, recognizer.chunk_samples) float32
        outputs, state = recognizer.step(chunk, state, sampling_rate=16000)
        print(recognizer.text(outputs["token_ids"][0]), end="")   # partial results
    outputs, state = recognizer.finish(state, last_samples)       # (B, m), m <= chunk
"""

import dataclasses
import importlib.util
import os
import sys

import numpy as np


def _portable():
    """keras_attn.export.portable, or the file beside this one when this
    module was loaded by its path (a device without Keras: importing the
    package would import Keras)."""
    if __package__:
        from keras_attn.export import portable

        return portable
    name = "keras_attn_portable"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "portable.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


@dataclasses.dataclass(frozen=True)
class StreamState:
    """The state carried between chunks: `tensors` `{input name: array}`
    (read-only), `export` the sha256 of the model it belongs to, and
    `ended` whether `finish` has run. A call never changes a state: it
    returns a new one, so a refused call leaves the caller's valid."""

    tensors: dict
    export: str
    ended: bool = False


class StreamingRecognizer:
    """An exported streaming step in its runtime (the module docstring).

    Args:
        path: the directory `keras-attn export RUN_DIR --streaming` (or
            `export_streaming`) wrote; its files are checked against the
            sha256 in `serving.json` when it loads (`portable.Artifact`).
        num_threads: the runtime's intra-op threads (None: its default).

    Attributes:
        chunk_samples: samples per chunk (`chunk_size` encoder frames).
        sampling_rate: the model's, in Hz.
        batch_size: utterances streamed side by side.
        vocabulary: the tokens of ids 1..V (None if not recorded); id 0 is
            the blank.
    """

    def __init__(self, path, num_threads=None):
        self.artifact = _portable().Artifact(path, num_threads=num_threads)
        contract = self.artifact.contract
        streaming = contract.get("streaming")
        if not isinstance(streaming, dict) or "state" not in streaming:
            raise ValueError(
                "Invalid value for argument `path`: an export of the streaming step "
                "(`keras-attn export RUN_DIR --streaming`), whose serving.json has "
                f"'streaming'. Received: path={os.fspath(path)!r}")
        self.path = os.fspath(path)
        self.streaming = streaming
        self.chunk_samples = int(streaming["chunk_samples"])
        self.sampling_rate = int(streaming["sampling_rate"])
        self.batch_size = int(streaming["batch_size"])
        self.vocabulary = streaming.get("vocabulary")
        self._id = contract["sha256"][contract["file"]]

    # === State ===

    def initial_state(self):
        """The state before the first chunk."""
        return self._state({spec["input"]: np.full(spec["shape"], spec["initial"], spec["dtype"])
                            for spec in self.streaming["state"]})

    def _state(self, tensors, ended=False):
        for value in tensors.values():
            value.flags.writeable = False
        return StreamState(tensors, self._id, ended)

    def _check_state(self, state):
        if not isinstance(state, StreamState):
            raise ValueError(
                "Invalid value for argument `state`: a StreamState from `initial_state`, "
                f"`step` or `finish`. Received: state of type {type(state).__name__}")
        if state.export != self._id:
            raise ValueError(
                "Invalid value for argument `state`: it belongs to another export "
                f"(model sha256 {state.export[:12]}...), not {self.path} (sha256 "
                f"{self._id[:12]}...). Received: state.export={state.export!r}")
        if state.ended:
            raise ValueError(
                "Invalid value for argument `state`: its stream has ended (`finish` ran); "
                "start the next one from `initial_state()`. Received: state.ended=True")
        # Counters that cannot be (the step would give that row NaN logits).
        for name, low in (("log_mel_length", 0), ("logit_length", 0), ("decoder_last", -1),
                          ("decoder_skip", 0)):  # decoder_skip: a transducer's step
            value = state.tensors.get(name)
            if value is not None and (np.asarray(value) < low).any():
                raise ValueError(
                    f"Invalid value for argument `state`: entry {name!r} cannot be below "
                    f"{low}. Received: state.tensors[{name!r}]={np.asarray(value).tolist()}")

    # === Steps ===

    def step(self, chunk, state, sampling_rate=None):
        """Feeds the next `chunk_samples` samples of each utterance.

        Args:
            chunk: `(batch_size, chunk_samples)` finite float audio in
                [-1, 1] at the model's sampling rate.
            state: the previous step's state (`initial_state` at first).
            sampling_rate: the chunk's rate in Hz, checked when given.

        Returns:
            `(outputs, new_state)`: `outputs["token_ids"]` `(B, C)` int32
            the greedy CTC token each encoder frame of the chunk that just
            completed emits, -1 where it emits none; `outputs["logits"]`
            `(B, C, V + 1)`. A row's ids >= 0, over all steps and `finish`,
            are its transcript (those of `ConformerCTC.stream_step`). A
            transducer's step: `outputs["token_ids"]` `(B, C x
            max_symbols_per_step)` the labels its walk emitted, -1 after
            them, and `outputs["frames"]` (those of
            `ConformerTransducer.stream_step`).

        Raises:
            ValueError: a state from another export or an ended stream, a
                chunk of another rank, length or batch, a non-finite or
                non-float sample or one outside [-1, 1], another sampling
                rate, a state counter below its range. `state` is
                unchanged.
        """
        self._check_state(state)
        self._check_rate(sampling_rate)
        chunk = self._check_samples("chunk", chunk, exact=True)
        lengths = np.full((self.batch_size,), self.chunk_samples, "int32")
        return self._run(chunk, lengths, state)

    def finish(self, state, last_samples=None, sampling_rate=None):
        """Ends the stream: the last samples (fewer than a chunk, zero-padded
        here, their count given to the model as `chunk_length`), then
        `flush_chunks` chunks of zeros of length 0, which bring out the
        frames still held. Returns `(outputs, final_state)` as `step`, the
        outputs of these calls concatenated along the frames."""
        self._check_state(state)
        self._check_rate(sampling_rate)
        outputs, tensors = [], state
        chunks = []
        if last_samples is not None:
            last = self._check_samples("last_samples", last_samples, exact=False)
            width = last.shape[1]
            chunks.append((np.pad(last, ((0, 0), (0, self.chunk_samples - width))),
                           np.full((self.batch_size,), width, "int32")))
        silence = np.zeros((self.batch_size, self.chunk_samples), "float32")
        chunks += [(silence, np.zeros((self.batch_size,), "int32"))] * int(
            self.streaming["flush_chunks"])
        for chunk, lengths in chunks:
            step_outputs, tensors = self._run(chunk, lengths, tensors)
            outputs.append(step_outputs)
        merged = {name: np.concatenate([o[name] for o in outputs], axis=1)
                  for name in outputs[0]}
        return merged, self._state(dict(tensors.tensors), ended=True)

    def _run(self, chunk, lengths, state):
        inputs = dict(state.tensors)
        inputs[self.streaming["chunk_input"]] = chunk
        inputs[self.streaming["chunk_length_input"]] = lengths
        outputs = self.artifact(**inputs)
        # Copies: LiteRT's output buffers are the interpreter's, reused by the next call.
        tensors = {spec["input"]: np.array(outputs[spec["output"]])
                   for spec in self.streaming["state"]}
        # A CTC step's logits, or a transducer step's frames (what its joint read).
        result = {name: np.array(outputs[name]) for name in ("logits", "frames", "token_ids")
                  if name in outputs}
        return result, self._state(tensors)

    # === Checks ===

    def _check_rate(self, sampling_rate):
        if sampling_rate is not None and sampling_rate != self.sampling_rate:
            raise ValueError(
                f"Invalid value for argument `sampling_rate`: this model takes "
                f"{self.sampling_rate} Hz audio (resample it first). Received: "
                f"sampling_rate={sampling_rate!r}")

    def _check_samples(self, name, samples, exact):
        array = np.asarray(samples)
        shape = (self.batch_size, self.chunk_samples)
        if array.ndim != 2:
            raise ValueError(
                f"Invalid value for argument `{name}`: (batch_size, samples) = (B, n) audio, "
                f"rank 2. Received: {name}.shape={array.shape}")
        if array.shape[0] != self.batch_size or (
                array.shape[1] != self.chunk_samples if exact
                else not 0 < array.shape[1] <= self.chunk_samples):
            wanted = f"{shape}" if exact else f"({self.batch_size}, 1..{self.chunk_samples})"
            raise ValueError(
                f"Invalid value for argument `{name}`: this export takes {wanted} samples "
                f"(batch_size, chunk_samples){'' if exact else ' at the end'}. "
                f"Received: {name}.shape={array.shape}")
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(
                f"Invalid value for argument `{name}`: float audio in [-1, 1]. "
                f"Received: {name}.dtype={array.dtype}")
        finite = np.isfinite(array)
        if not finite.all():
            rows = np.flatnonzero(~finite.all(axis=1)).tolist()
            raise ValueError(
                f"Invalid value for argument `{name}`: audio samples must be finite. "
                f"Received: {name} with NaN or inf in row(s) {rows}")
        outside = np.abs(array) > 1.0
        if outside.any():
            row, column = (int(i) for i in np.argwhere(outside)[0])
            raise ValueError(
                f"Invalid value for argument `{name}`: audio samples must lie in [-1, 1] "
                f"(16-bit PCM: divide by 32768). Received: {name}[{row}, {column}]="
                f"{float(array[row, column])!r}")
        return array.astype("float32")

    # === Decoding ===

    def transcribe(self, waveform, sampling_rate=None):
        """The greedy token ids of each row of `waveform` `(B, N)`, streamed
        chunk by chunk: a list of `B` lists of ids 1..V."""
        waveform = np.asarray(waveform)
        if waveform.ndim != 2 or waveform.shape[1] < 1:
            raise ValueError(
                "Invalid value for argument `waveform`: (batch_size, samples) audio. "
                f"Received: waveform.shape={waveform.shape}")
        state, ids = self.initial_state(), []
        whole = waveform.shape[1] - (waveform.shape[1] % self.chunk_samples or
                                     self.chunk_samples)
        for start in range(0, whole, self.chunk_samples):
            outputs, state = self.step(waveform[:, start:start + self.chunk_samples], state,
                                       sampling_rate)
            ids.append(outputs["token_ids"])
        outputs, state = self.finish(state, waveform[:, whole:], sampling_rate)
        ids = np.concatenate(ids + [outputs["token_ids"]], axis=1)
        return [[int(token) for token in row if token >= 0] for row in ids]

    def text(self, token_ids):
        """The vocabulary's tokens of `token_ids` (ids < 1 left out), joined."""
        if self.vocabulary is None:
            raise ValueError(f"{self.path}/serving.json records no vocabulary: export with "
                             "`vocabulary=` to decode text. Received: vocabulary=None")
        return "".join(self.vocabulary[int(token) - 1] for token in np.ravel(token_ids)
                       if token > 0)
