"""Serving an exported speech recogniser without TensorFlow or Keras: the
ONNX or LiteRT directory that `export_speech_recognizer(...,
vocabulary=...)` (or `keras-attn export RUN_DIR --format onnx` of a
speech_ctc run) wrote, run by its runtime (`portable.Artifact`). Clips of
any lengths go in (arrays at the export's sampling rate, or WAV files read
and resampled as the training files are); the greedy transcripts come out
as text. NumPy, onnxruntime (or ai_edge_litert) and, for WAV files at
another rate, SciPy are all it imports.

    recognizer = SpeechRecognizerArtifact("exported/parakeet_onnx")
    recognizer(["clip0.wav", "clip1.wav"])["text"]     # ["yes no", "no"]
"""

import os

import numpy as np

from keras_attn.export import portable


class SpeechRecognizerArtifact:
    """An exported CTC speech recogniser, audio in, text out (the module
    docstring).

    Args:
        path: the export directory (ONNX or LiteRT); its files are checked
            against the sha256 in `serving.json` when it loads.
        num_threads: the runtime's intra-op threads (None: its default).

    Attributes:
        sampling_rate: the rate the model reads (Hz).
        vocabulary: the token of each id 1..V (None where the export was
            written without it: the answers are ids only).
    """

    def __init__(self, path, num_threads=None):
        self.artifact = portable.Artifact(path, num_threads=num_threads)
        pre = self.artifact.contract.get("preprocessing") or {}
        if sorted(self.artifact.input_names) != ["waveform", "waveform_length"] \
                or "sampling_rate" not in pre:
            raise ValueError(
                "Invalid value for argument `path`: a speech recogniser exported by "
                "export_speech_recognizer (inputs waveform and waveform_length, and the "
                f"sampling rate in serving.json). Received: path={os.fspath(path)!r} with "
                f"inputs {self.artifact.input_names}")
        self.sampling_rate = int(pre["sampling_rate"])
        self.vocabulary = self.artifact.contract.get("vocabulary")

    def _clip(self, index, clip):
        """One clip as float32 samples at the model's rate."""
        if isinstance(clip, (str, os.PathLike)):
            # The reader of the training files (NumPy, SciPy to resample):
            # mono integer PCM, resampled to the model's rate.
            from keras_attn._wav import read_wav

            return read_wav(clip, self.sampling_rate, argument=f"clips[{index}]")
        samples = np.asarray(clip)
        # Samples past [-1, 1] are int16 values cast to float, say: the
        # front end would hear them 32,767 times too loud.
        if samples.ndim != 1 or samples.size == 0 or samples.dtype.kind != "f" \
                or not np.isfinite(samples).all() or np.abs(samples).max() > 1.0:
            raise ValueError(
                f"Invalid value for argument `clips`: clips[{index}] must be a WAV file's path "
                f"or a non-empty 1-D float array of finite samples in [-1, 1] at "
                f"{self.sampling_rate} Hz. Received: shape={samples.shape}, "
                f"dtype={samples.dtype}"
                + (f", largest |sample| {float(np.abs(samples).max()):g}"
                   if samples.size and samples.dtype.kind == "f" else ""))
        return samples.astype("float32")

    def __call__(self, clips):
        """`{"token_ids": [int32 array per clip], "text": [str per clip]}`
        for `clips`, a non-empty list of WAV paths or 1-D float arrays
        ("text" with a vocabulary; None for a clip whose logits are not
        finite). The clips run as one batch, each padded
        to the longest with its length passed: a clip's answer does not
        depend on the others."""
        if isinstance(clips, (str, os.PathLike, np.ndarray)) or not len(clips):
            raise ValueError("Invalid value for argument `clips`: a non-empty list of WAV paths "
                             f"or 1-D arrays. Received: clips={clips!r}"[:300])
        samples = [self._clip(i, clip) for i, clip in enumerate(clips)]
        lengths = np.array([len(s) for s in samples], "int32")
        waveform = np.zeros((len(samples), int(lengths.max())), "float32")
        for row, clip in enumerate(samples):
            waveform[row, : len(clip)] = clip
        outputs = self.artifact(waveform=waveform, waveform_length=lengths)
        # A CTC model's logits, or a transducer's frames (what its joint reads).
        key = "logits" if "logits" in outputs else "frames"
        ids, logits = np.asarray(outputs["token_ids"]), np.asarray(outputs[key])
        frames = np.asarray(outputs["logit_lengths" if key == "logits" else "frame_lengths"])
        # A clip the model answers NaN or inf for gets None, never the
        # transcript its garbage frames would spell.
        token_ids = [row[row > 0].astype("int32") if np.isfinite(logits[i, : frames[i]]).all()
                     else None for i, row in enumerate(ids)]  # -1 after each transcript
        answer = {"token_ids": token_ids}
        if self.vocabulary:
            answer["text"] = [None if row is None else "".join(self.vocabulary[i - 1] for i in row)
                              for row in token_ids]
        return answer
