"""Speech data: an offline spoken-digits set synthesised with eSpeak NG, and
tf.data pipelines for (audio, transcript) pairs. TensorFlow is imported only
by the pipeline functions.

The embedded default needs no download: the `espeakng-loader` wheel ships
libespeak-ng and its voice data, driven here through ctypes in synchronous
mode. Utterances are digit strings ("4 0 7") spoken with several voices,
rates and pitches, resampled to 16 kHz; the transcript is the digit string
without spaces ("407"), one character token per digit.
"""

import ctypes
import functools
import os
import tempfile
import warnings
import zipfile

import numpy as np

from keras_attn._epochs import bucket_batch_count
from keras_attn._epochs import epoch_permutation
from keras_attn._epochs import epoch_seed
from keras_attn.data._zoo_extra import import_zoo_package
from keras_attn._base.quiet_tensorflow import tensorflow_module
from keras_attn._base.quiet_tensorflow import traced_as_written

DIGIT_VOCABULARY = tuple("0123456789")
VOICES = ("en", "en-us", "en+f3", "en+m3", "en+f2", "en-gb-scotland")
_ESPEAK_SAMPLE_RATE = 22050

# espeak_AUDIO_OUTPUT, espeak_PARAMETER and espeak_POSITION_TYPE values from
# speak_lib.h (the stable eSpeak NG C API).
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_PARAMETER_RATE, _PARAMETER_PITCH = 1, 3
_POSITION_CHARACTER = 1
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Espeak:
    """The process-wide eSpeak NG engine (the C library is a singleton)."""

    def __init__(self):
        espeakng_loader = import_zoo_package("espeakng_loader")

        self._lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
        data_path = espeakng_loader.get_data_path().encode()
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed. Received: return value {rate}")
        self.sample_rate = rate
        self._chunks = []

        def collect(wav, count, events):
            if count > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
            return 0

        self._callback = _CALLBACK(collect)  # keep a reference: C holds the pointer
        self._lib.espeak_SetSynthCallback(self._callback)
        self._lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]

    def say(self, text, voice="en", rate=175, pitch=50):
        """int16 samples at `self.sample_rate` for `text`."""
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"eSpeak NG has no voice {voice!r}. Received: voice={voice!r}")
        self._lib.espeak_SetParameter(_PARAMETER_RATE, int(rate), 0)
        self._lib.espeak_SetParameter(_PARAMETER_PITCH, int(pitch), 0)
        self._chunks = []
        encoded = text.encode() + b"\0"
        self._lib.espeak_Synth(
            encoded, len(encoded), 0, _POSITION_CHARACTER, 0, 0, None, None
        )
        self._lib.espeak_Synchronize()
        if not self._chunks:
            return np.zeros((0,), "int16")
        return np.concatenate(self._chunks)


@functools.lru_cache(maxsize=1)
def _engine():
    return _Espeak()


def synthesize(text, voice="en", rate=175, pitch=50, sampling_rate=16000):
    """`text` spoken by eSpeak NG as float32 audio in [-1, 1] at `sampling_rate`."""
    from scipy.signal import resample_poly

    engine = _engine()
    audio = engine.say(text, voice=voice, rate=rate, pitch=pitch).astype("float32") / 32768.0
    if sampling_rate != engine.sample_rate:
        divisor = np.gcd(sampling_rate, engine.sample_rate)
        audio = resample_poly(audio, sampling_rate // divisor, engine.sample_rate // divisor)
    # The polyphase filter overshoots near full scale (5 of the 2,000
    # embedded utterances peaked at 1.003-1.015): clipped back, as
    # `data.files.read_wav` does, so the set stays in the [-1, 1] every
    # front end takes and refuses outside it.
    return np.clip(audio, -1.0, 1.0).astype("float32")


def generate_spoken_digits(count, seed=0, min_digits=1, max_digits=5, sampling_rate=16000):
    """`count` utterances of random digit strings, random voice, rate, pitch.

    Returns:
        `(waveforms, transcripts)`: a list of float32 arrays and a list of
        digit strings ("407").
    """
    rng = np.random.default_rng(seed)
    waveforms, transcripts = [], []
    for _ in range(count):
        digits = "".join(rng.choice(list(DIGIT_VOCABULARY), size=rng.integers(min_digits, max_digits + 1)))
        audio = synthesize(
            " ".join(digits),
            voice=VOICES[rng.integers(len(VOICES))],
            rate=int(rng.integers(130, 221)),
            pitch=int(rng.integers(25, 76)),
            sampling_rate=sampling_rate,
        )
        waveforms.append(audio)
        transcripts.append(digits)
    return waveforms, transcripts


def _default_cache_dir():
    return os.path.join(os.path.expanduser("~"), ".cache", "keras_attn")


def load_spoken_digits(count=2000, seed=0, cache_dir=None):
    """The spoken-digits set, generated once and cached as an `.npz`.

    The file is written to a temporary name and renamed, so an interrupted
    run never leaves a truncated cache; a cache that cannot be read is
    regenerated.

    Returns:
        `(waveforms, transcripts)` as in `generate_spoken_digits`.
    """
    cache_dir = cache_dir or _default_cache_dir()
    # v2: the audio clipped to [-1, 1] after resampling (a v1 file is not).
    path = os.path.join(cache_dir, f"spoken_digits_v2_{count}_{seed}.npz")
    if os.path.exists(path):
        try:
            with np.load(path) as stored:
                flat, offsets = stored["audio"], stored["offsets"]
                transcripts = [str(t) for t in stored["transcripts"]]
            waveforms = [flat[offsets[i] : offsets[i + 1]] for i in range(count)]
            return waveforms, transcripts
        except (OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile) as error:
            # corrupt, truncated or foreign file: say so and make it again
            warnings.warn(f"Regenerating the unreadable cache {path} ({error!r}).")
    waveforms, transcripts = generate_spoken_digits(count, seed=seed)
    os.makedirs(cache_dir, exist_ok=True)
    offsets = np.concatenate([[0], np.cumsum([len(w) for w in waveforms])])
    handle, staging = tempfile.mkstemp(suffix=".npz", dir=cache_dir)
    os.close(handle)
    try:
        np.savez(staging, audio=np.concatenate(waveforms), offsets=offsets,
                 transcripts=np.array(transcripts))
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return waveforms, transcripts


def encode_transcript(text, vocabulary=DIGIT_VOCABULARY):
    """Characters -> ids 1..V (0 is the CTC blank and the label padding)."""
    index = {token: i + 1 for i, token in enumerate(vocabulary)}
    unknown = sorted({c for c in text if c not in index})
    if unknown:
        raise ValueError(
            f"Characters outside the vocabulary {''.join(vocabulary)!r}. "
            f"Received: {''.join(unknown)!r} in text={text!r}"
        )
    return [index[c] for c in text]


def decode_ids(ids, vocabulary=DIGIT_VOCABULARY):
    """Ids 1..V -> text; 0 and negative ids (CTC padding) are skipped."""
    return "".join(vocabulary[i - 1] for i in ids if 0 < i <= len(vocabulary))


def _edit_distance_rate(references, hypotheses, split):
    import keras_hub
    tf = tensorflow_module()

    if len(references) != len(hypotheses):
        raise ValueError(
            "Need one hypothesis per reference. Received: "
            f"{len(references)} references, {len(hypotheses)} hypotheses"
        )
    def ragged(texts):  # rows of tokens; an empty text is an empty row
        return tf.ragged.stack([tf.constant(split(t), dtype=tf.string) for t in texts])

    metric = keras_hub.metrics.EditDistance()  # total edits / total reference tokens
    metric.update_state(ragged(references), ragged(hypotheses))
    return float(metric.result())


def word_error_rate(references, hypotheses):
    """Corpus WER: word edits (keras-hub EditDistance) / reference words."""
    return _edit_distance_rate(references, hypotheses, lambda text: text.split())


def character_error_rate(references, hypotheses):
    """Corpus CER: character edits / reference characters (spaces excluded)."""
    return _edit_distance_rate(references, hypotheses, lambda text: list(text.replace(" ", "")))


def speech_dataset(waveforms, transcripts, batch_size=16, vocabulary=DIGIT_VOCABULARY,
                   shuffle=False, seed=0, bucket_boundaries=None, epoch=None):
    """A `tf.data.Dataset` of `({"waveform", "waveform_length"}, labels)`.

    Batches are formed by duration: utterances are bucketed by length
    (`bucket_boundaries` in samples; default 0.5 s steps past the longest
    utterance) and padded to their bucket's boundary, so there are only as
    many batch shapes as buckets. Labels are padded with 0.

    With `epoch` (an int) and `shuffle`, the order is a permutation keyed by
    `(seed, epoch)`, the same at every pass (for resumable training); without
    it, a seeded shuffle that changes at every pass.
    """
    tf = tensorflow_module()

    labels = [encode_transcript(t, vocabulary) for t in transcripts]
    if shuffle and epoch is not None:
        order = epoch_permutation(len(waveforms), seed, epoch)
        waveforms, labels = [waveforms[i] for i in order], [labels[i] for i in order]
        shuffle = False

    def generate():
        for audio, label in zip(waveforms, labels):
            yield audio, np.int32(len(audio)), np.asarray(label, "int32")

    dataset = tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((None,), tf.float32),
            tf.TensorSpec((), tf.int32),
            tf.TensorSpec((None,), tf.int32),
        ),
    )
    if shuffle:
        dataset = dataset.shuffle(len(waveforms), seed=seed, reshuffle_each_iteration=True)
    lengths = np.array([len(w) for w in waveforms])
    boundaries = _boundaries(lengths, bucket_boundaries)
    # Padding the audio (not the labels) to its bucket's boundary keeps the
    # number of batch shapes, and so of XLA compilations, to the bucket count.
    edges = tf.constant(boundaries, tf.int32)

    def pad_to_boundary(audio, length, label):
        target = tf.gather(edges, tf.searchsorted(edges, length[None], side="right"))[0]
        return tf.pad(audio, [[0, target - length]]), length, label

    dataset = dataset.map(traced_as_written(pad_to_boundary))
    dataset = dataset.bucket_by_sequence_length(
        traced_as_written(lambda audio, length, label: length),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
    )
    # Bucket sizes do not depend on the order, so the batch count is known.
    batches = bucket_batch_count(lengths, boundaries, batch_size)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    dataset = dataset.map(
        traced_as_written(lambda audio, length, label: (
            {"waveform": audio, "waveform_length": length}, label))
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def _boundaries(lengths, bucket_boundaries):
    """The bucket boundaries (samples) for utterances of these lengths:
    `bucket_boundaries` sorted, or 0.5 s steps past the longest."""
    if bucket_boundaries is None:
        bucket_boundaries = list(range(8000, int(lengths.max()) + 8001, 8000))
    boundaries = sorted(bucket_boundaries)
    if lengths.max() >= boundaries[-1]:
        raise ValueError(
            "The last bucket boundary must exceed the longest utterance. Received: "
            f"bucket_boundaries[-1]={boundaries[-1]}, longest={int(lengths.max())}"
        )
    return boundaries


def speech_rows_dataset(waveforms, transcripts, rows, weightless, batch_size=16,
                        vocabulary=DIGIT_VOCABULARY, seed=0, bucket_boundaries=None, epoch=0):
    """Some rows of every batch of `speech_dataset(waveforms, transcripts,
    batch_size, vocabulary, shuffle=True, seed=seed, bucket_boundaries=...,
    epoch=epoch)`, as one process of a data-parallel job feeds them, the
    other utterances neither read nor padded: the batches are found from the
    lengths alone (`bucket_batches` over the epoch's order), then each
    batch's rows are padded to its bucket's boundary (the audio) and to the
    whole batch's longest transcript (the labels).

    Args:
        rows: `size -> positions` (NumPy ints) of the rows to make in the
            batch filled up to `positions`' extent (position p is row
            p % size, as `even_batches` fills it).
        weightless: `(batch, keep) -> batch` for the filler rows (p >= size).
    """
    from keras_attn.data.translation import bucket_batches

    tf = tensorflow_module()
    lengths = np.array([len(w) for w in waveforms])
    boundaries = _boundaries(lengths, bucket_boundaries)
    labels = [np.asarray(encode_transcript(t, vocabulary), "int32") for t in transcripts]
    order = epoch_permutation(len(waveforms), seed, epoch)
    batches = [order[batch] for batch in bucket_batches(lengths[order], boundaries, batch_size)]

    def generate():
        for batch in batches:
            positions = np.asarray(rows(len(batch)))
            kept = batch[positions % len(batch)]
            width = boundaries[int(np.searchsorted(boundaries, lengths[batch[0]], side="right"))]
            audio = np.zeros((len(kept), width), "float32")
            label = np.zeros((len(kept), max(len(labels[i]) for i in batch)), "int32")
            for row, index in enumerate(kept):
                audio[row, :lengths[index]] = waveforms[index]
                label[row, :len(labels[index])] = labels[index]
            yield audio, lengths[kept].astype("int32"), label, positions < len(batch)

    dataset = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((None, None), tf.float32), tf.TensorSpec((None,), tf.int32),
        tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None,), tf.bool)))
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(batches)))
    dataset = dataset.map(traced_as_written(lambda audio, length, label, keep: weightless(
        ({"waveform": audio, "waveform_length": length}, label), keep)))
    return dataset.prefetch(tf.data.AUTOTUNE)


def load_tfds_speech(name, split="train", data_dir=None, batch_size=16,
                     vocabulary=None, audio_key=None, text_key=None, download=True,
                     shuffle=False, seed=0, epoch=None):
    """A tensorflow-datasets speech set by name, as `speech_dataset` batches.

    Works with `librispeech` (`speech` + `text`) and `speech_commands`
    (`audio` + `label`, the label name as the transcript); other sets name
    their keys with `audio_key` / `text_key`. Audio is scaled from int16.
    `shuffle` shuffles utterances through a seeded buffer of 1,000: at every
    pass anew, or with `epoch` (an int) keyed by `(seed, epoch)`, the same
    at every pass (for resumable training).

    Returns:
        `(dataset, info)`.
    """
    tf = tensorflow_module()
    import tensorflow_datasets as tfds

    dataset, info = tfds.load(name, split=split, data_dir=data_dir, with_info=True,
                              download=download)
    if shuffle:
        dataset = dataset.shuffle(
            1000,
            seed=seed if epoch is None else epoch_seed(seed, epoch),
            reshuffle_each_iteration=epoch is None,
        )
    features = info.features
    audio_key = audio_key or ("speech" if "speech" in features else "audio")
    if text_key is None:
        text_key = "text" if "text" in features else "label"
    if audio_key not in features or text_key not in features:
        raise ValueError(
            f"{name} has features {sorted(features)}; pass audio_key and text_key. "
            f"Received: audio_key={audio_key!r}, text_key={text_key!r}"
        )
    if vocabulary is None:
        vocabulary = tuple("abcdefghijklmnopqrstuvwxyz' ")
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(vocabulary)), tf.range(1, len(vocabulary) + 1, dtype=tf.int32)
        ),
        default_value=0,
    )
    label_names = getattr(features[text_key], "names", None)

    def convert(example):
        audio = tf.cast(example[audio_key], tf.float32) / 32768.0
        text = example[text_key]
        if label_names is not None:
            text = tf.gather(tf.constant(label_names), text)
        chars = tf.strings.unicode_split(tf.strings.lower(text), "UTF-8")
        labels = table.lookup(chars)
        labels = tf.boolean_mask(labels, labels > 0)  # drop characters outside the vocabulary
        return audio, tf.shape(audio)[0], labels

    dataset = dataset.map(traced_as_written(convert), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.padded_batch(batch_size)
    dataset = dataset.map(
        traced_as_written(lambda audio, length, labels: (
            {"waveform": audio, "waveform_length": length}, labels))
    )
    return dataset.prefetch(tf.data.AUTOTUNE), info
