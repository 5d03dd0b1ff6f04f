"""Transcribe a WAV file with a trained speech run (`keras-attn transcribe`).

```
from keras_attn.zoo.transcribe import Transcriber

recognizer = Transcriber("runs/conformer_tiny_digits_streaming")
recognizer.transcribe("audio.wav")                         # '407'
for partial in recognizer.stream("audio.wav", chunk_ms=320):
    print(partial.seconds, partial.text, partial.final)    # 0.32 '4' False ...
```

The WAV file is read by the package's one WAV reader, the one training
files go through (`keras_attn.data.files.wav_samples`, a RIFF parser of its
own): integer PCM of 16, 24 or 32 bits, one channel, plain or
WAVE_FORMAT_EXTENSIBLE with the PCM sub-format. A stereo
file is refused rather than mixed down (two channels out of phase cancel in
a mix; `sox in.wav -c 1 out.wav` says what the user wants); 8-bit PCM is
refused because its quantisation noise (-48 dB) sits far above the silence
of the 16-bit audio the models learn from, which a model on raw decibels
(the streaming recipe) reads as sound; so are a file cut short (fewer
samples than its header says), an empty one and a sample rate outside 8 to
192 kHz (checked before resampling). A file shorter than the model's
subsampling reads (7 feature frames: 60 ms at 16 kHz) is refused with that
minimum. A file at another sample rate is resampled to the model's with
`scipy.signal.resample_poly` (a polyphase filter, as the embedded data's
synthesis does). The file is read whole, then fed to the model chunk by
chunk as a live source would deliver it.

Decoding is greedy in both modes: CTC's, or a transducer's walk (a
`speech_transducer` run, whose `stream_step` carries its decoder's state). Streaming (`stream`) needs a model
trained for it (`chunk_size` in its recipe); an offline model is refused
by name, since its attention and convolution read the whole utterance (a
caller who wants partial results from it re-runs it on the growing prefix,
what benchmarks/streaming.py measures). The model attends in chunks of the
recipe's `chunk_size` whatever `chunk_ms` is, so the streamed text is the
offline text of the same model, exactly.
"""

import dataclasses
import os

import numpy as np

from keras_attn.data.files import resample
from keras_attn.data.files import wav_samples
from keras_attn._base.errors import DataFileError
from keras_attn._base.zoo_files import MODEL
from keras_attn._base.zoo_files import RECIPE

# ConvSubsampling's first output frame reads 7 feature frames.
_MIN_FRAMES = 7


def read_wav(audio):
    """`(samples, sampling_rate)` of the mono integer-PCM WAV file `audio`:
    float32 samples in [-1, 1). `DataFileError`s (`ValueError`s) name the
    file and what it holds (not a WAV file, stereo, 8-bit, compressed, cut
    short, empty, a sample rate outside 8 to 192 kHz):
    `keras_attn.data.files.wav_samples`, the reader of training files."""
    return wav_samples(audio, "audio")


@dataclasses.dataclass(frozen=True)
class Partial:
    """What a stream has said after `seconds` of audio: `text` so far;
    `final` on the last one (after the end-of-stream flush)."""

    seconds: float
    text: str
    final: bool = False


class Transcriber:
    """A trained speech run's model, ready to transcribe files.

    Args:
        run_dir: a run directory of a `speech_ctc` or `speech_transducer`
            recipe (`keras-attn train`): its model.keras, or its newest
            checkpoint when the run has not finished.
    """

    def __init__(self, run_dir):
        from keras_attn._base.zoo_files import read_json
        from keras_attn.zoo.recipe import validate_recipe
        from keras_attn.zoo.runs import load_run
        from keras_attn.zoo.tasks import make_task

        if not os.path.isfile(os.path.join(run_dir, RECIPE)):
            raise ValueError(f"Invalid value for argument `run_dir`: {run_dir} is not a run "
                             f"directory (it has no {RECIPE}). Received: run_dir={run_dir!r}")
        recipe = validate_recipe(read_json(os.path.join(run_dir, RECIPE)))
        if recipe["task"] not in ("speech_ctc", "speech_transducer"):
            raise ValueError(
                f"Invalid value for argument `run_dir`: transcribing needs a speech run "
                f"(task speech_ctc or speech_transducer); {run_dir} is a {recipe['task']} run of "
                f"{recipe['name']}. Received: run_dir={run_dir!r}")
        task = make_task(recipe)
        if os.path.isfile(os.path.join(run_dir, MODEL)):
            # model.keras alone: the task's load_model would make the data set.
            import importlib

            import keras

            importlib.import_module("keras_attn.models.conformer")  # registers the classes
            self.model = keras.saving.load_model(os.path.join(run_dir, MODEL), compile=False)
        else:
            _, task, self.model, _ = load_run(run_dir)
        task.assume_data_sizes()
        self.vocabulary = task.vocabulary
        self.name = recipe["name"]
        self.config = self.model.conformer_config
        if self.config.input_type != "waveform":
            raise ValueError(f"Invalid value for argument `run_dir`: {run_dir}'s model reads "
                             f"features, not audio. Received: run_dir={run_dir!r}")
        self.sampling_rate = self.config.sampling_rate

    @property
    def streaming(self):
        """Whether the model was trained to stream (a recipe with chunk_size)."""
        return self.config.chunk_size is not None

    @property
    def frames_per_step(self):
        """Feature frames per encoder frame: 4, or 8 for the FastConformer."""
        from keras_attn.models.conformer.streaming import subsampling_factor

        return subsampling_factor(self.model.get_layer("subsampling"))

    @property
    def step_ms(self):
        """The stream's step: one encoder frame (4 feature frames, 8 for the
        FastConformer), in ms."""
        return 1000.0 * self.frames_per_step * self.config.frame_step / self.sampling_rate

    def load(self, audio):
        """The samples of the WAV file `audio` at the model's rate; a
        `DataFileError` naming the minimum for a file too short for the
        model's subsampling (7 feature frames, `1 + n // frame_step` of
        `n` samples)."""
        samples, rate = read_wav(audio)
        resampled = resample(samples, rate, self.sampling_rate)
        needed = (_MIN_FRAMES - 1) * self.config.frame_step
        if len(resampled) < needed:
            raise DataFileError(
                f"Invalid value for argument `audio`: {audio} holds {len(samples)} samples "
                f"({len(samples) / rate:g} s); the model needs at least {needed} samples "
                f"({needed / self.sampling_rate:g} s) at {self.sampling_rate} Hz, the "
                f"{_MIN_FRAMES} feature frames its subsampling reads. "
                f"Received: audio={os.fspath(audio)!r}")
        return resampled

    def text(self, ids):
        from keras_attn.data.speech import decode_ids

        return decode_ids([int(i) for i in np.asarray(ids).reshape(-1)], self.vocabulary)

    def transcribe(self, audio):
        """The greedy transcript of the WAV file `audio`, whole-utterance."""
        samples = self.load(audio)
        decoded = self.model.decode({"waveform": samples[None],
                                     "waveform_length": np.array([len(samples)], "int32")})
        return self.text(np.asarray(decoded))

    def chunk_samples(self, chunk_ms):
        """Samples per piece of `chunk_ms` ms; a ValueError naming the valid
        values where it is not a whole number of the model's steps."""
        step = self.frames_per_step * self.config.frame_step
        valid = [k * self.step_ms for k in range(1, 5)]
        shown = ", ".join(f"{v:g}" for v in valid)
        samples = chunk_ms * self.sampling_rate / 1000.0 if isinstance(
            chunk_ms, (int, float)) and not isinstance(chunk_ms, bool) else None
        if samples is None or samples <= 0 or samples != int(samples) or int(samples) % step:
            raise ValueError(
                f"Invalid value for argument `chunk_ms`: a multiple of the model's step, "
                f"{self.step_ms:g} ms ({step} samples at {self.sampling_rate} Hz): {shown}, "
                f"... Received: chunk_ms={chunk_ms!r}")
        return int(samples)

    def stream(self, audio, chunk_ms=None):
        """Partial transcripts of the WAV file `audio` fed in pieces of
        `chunk_ms` ms (default: the model's attention chunk), one `Partial`
        per piece and a final one after the flush.

        The model attends in chunks of its recipe's `chunk_size` whatever
        `chunk_ms` is: text appears as each such chunk completes, and the
        final text is the offline transcript's.
        """
        if not self.streaming:
            raise ValueError(
                f"Invalid value for argument `stream`: {self.name} was not trained for "
                "streaming (its model has no chunk_size; its attention reads the whole "
                "utterance): transcribe it whole (stream=False), or train a streaming recipe "
                "such as conformer_tiny_digits_streaming. Received: stream=True")
        if chunk_ms is None:
            chunk_ms = self.config.chunk_size * self.step_ms
        piece = self.chunk_samples(chunk_ms)
        samples = self.load(audio)
        state = self.model.initial_state(1)
        ids = []
        for start in range(0, max(len(samples), 1), piece):
            chunk = samples[start:start + piece]
            valid = len(chunk)
            chunk = np.pad(chunk, (0, piece - valid))[None]
            outputs, state = self.model.stream_step(chunk, state,
                                                    np.array([valid], "int32"))
            ids.extend(np.asarray(outputs["token_ids"]).reshape(-1).tolist())
            yield Partial((start + valid) / self.sampling_rate, self.text(ids))
        outputs, state = self.model.flush(state)
        ids.extend(np.asarray(outputs["token_ids"]).reshape(-1).tolist())
        yield Partial(len(samples) / self.sampling_rate, self.text(ids), final=True)


def transcribe(run_dir, audio, stream=False, chunk_ms=None):
    """The greedy transcript of the WAV file `audio` by the run `run_dir`,
    whole-utterance or (`stream`) streamed in pieces of `chunk_ms` ms; for
    the partial results, iterate `Transcriber(run_dir).stream(audio)`."""
    recognizer = Transcriber(run_dir)
    if not stream:
        if chunk_ms is not None:
            raise ValueError("Invalid value for argument `chunk_ms`: it sizes the pieces of a "
                             f"stream (stream=True). Received: chunk_ms={chunk_ms!r}")
        return recognizer.transcribe(audio)
    *_, last = recognizer.stream(audio, chunk_ms)
    return last.text
