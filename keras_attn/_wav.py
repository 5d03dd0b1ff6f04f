"""The one WAV reader of the package: mono integer-PCM WAV files as float32
samples, resampled to a model's rate. Used by the training files
(`keras_attn.data.files`, which re-exports these names), `keras-attn
transcribe`, and `SpeechRecognizerArtifact`, which serves without
TensorFlow or Keras: so it imports NumPy (and SciPy to resample) only, on
the floor below `data` and `export`."""

import math
import os

import numpy as np

from keras_attn._base.errors import DataFileError


# The sample rates read: 8 kHz (telephone speech) to 192 kHz (the most a
# recorder writes). A header outside them is a damaged file or not audio,
# refused before resampling: 1 Hz to 16 kHz is a 16,000-fold polyphase
# filter that runs for minutes and then out of memory.
SAMPLE_RATES = (8000, 192000)
_SAMPLE_WIDTHS = {2: "<i2", 4: "<i4"}  # 3 bytes (24-bit) is unpacked by hand
# A data chunk of this size is one whose writer did not know its length (a
# stream): its samples are what the file holds.
_UNKNOWN_SIZE = 0xFFFFFFFF


def _wav_error(audio, problem, argument, received=""):
    return DataFileError(f"Invalid value for argument `{argument}`: {audio} {problem}. "
                         f"Received: {argument}={os.fspath(audio)!r}{received}")


# WAVE format tags: integer PCM is read; the others are named when refused.
_PCM, _EXTENSIBLE = 0x0001, 0xFFFE
_FORMAT_NAMES = {0x0002: "Microsoft ADPCM", 0x0003: "IEEE float", 0x0006: "A-law",
                 0x0007: "mu-law", 0x0011: "IMA ADPCM", 0x0031: "GSM 6.10",
                 0x0050: "MPEG", 0x0055: "MPEG Layer 3"}
# A WAVE_FORMAT_EXTENSIBLE sub-format is a GUID whose first two bytes are a
# format tag and whose other fourteen are these (the Microsoft KSDATAFORMAT
# base GUID, as little-endian bytes).
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")


def _format_name(tag):
    return f"{_FORMAT_NAMES.get(tag, 'an unknown format')} (format tag {tag:#06x})"


def _riff_chunks(blob):
    """`(id, start, size)` of each chunk of the RIFF/WAVE bytes `blob` after
    its 12-byte header; a chunk's size is the header's, which may run past
    the end of a file cut short."""
    position = 12
    while position + 8 <= len(blob):
        name = blob[position:position + 4]
        size = int.from_bytes(blob[position + 4:position + 8], "little")
        yield name, position + 8, size
        position += 8 + size + (size & 1)  # chunks are padded to an even size


def _wav_format(audio, chunk, argument):
    """`(channels, rate, width)` of a `fmt ` chunk's bytes: integer PCM,
    plain or WAVE_FORMAT_EXTENSIBLE with the PCM sub-format; another format
    is refused by name."""
    if len(chunk) < 16:
        raise _wav_error(audio, "is not a readable PCM WAV file (its `fmt ` chunk holds "
                         f"{len(chunk)} bytes, fewer than 16)", argument)
    tag, channels, rate = (int.from_bytes(chunk[a:b], "little")
                           for a, b in ((0, 2), (2, 4), (4, 8)))
    bits = int.from_bytes(chunk[14:16], "little")
    where = ""
    if tag == _EXTENSIBLE:
        if len(chunk) < 40:
            raise _wav_error(audio, "is not a readable PCM WAV file (a WAVE_FORMAT_EXTENSIBLE "
                             f"`fmt ` chunk of {len(chunk)} bytes, fewer than 40)", argument)
        guid = chunk[24:40]
        if guid[2:] != _GUID_TAIL:
            raise _wav_error(audio, "is not a readable PCM WAV file (a WAVE_FORMAT_EXTENSIBLE "
                             f"sub-format GUID that is not a format tag: {guid.hex()})",
                             argument)
        tag, where = int.from_bytes(guid[:2], "little"), "WAVE_FORMAT_EXTENSIBLE sub-format "
    if tag != _PCM:
        raise _wav_error(audio, f"is not a readable PCM WAV file (its samples are "
                         f"{where}{_format_name(tag)}; integer PCM is read: convert with "
                         "`sox in.wav -b 16 -e signed-integer out.wav`)", argument)
    # Samples of fewer valid bits sit in the top of a whole-byte container.
    return channels, rate, (bits + 7) // 8


def _wav_contents(audio, argument):
    """`(channels, rate, width, data, count)` of the WAV file `audio`: the
    `data` chunk's bytes as the file holds them and the samples per channel
    its header announces (None when unknown: a stream's writer)."""
    with open(os.fspath(audio), "rb") as handle:
        blob = handle.read()
    if len(blob) < 12 or blob[:4] != b"RIFF" or blob[8:12] != b"WAVE":
        found = "an empty file" if not blob else f"it starts with {blob[:12]!r}"
        raise _wav_error(audio, f"is not a readable PCM WAV file (no RIFF/WAVE header: {found})",
                         argument)
    layout = None
    for name, start, size in _riff_chunks(blob):
        if name == b"fmt ":
            if start + size > len(blob):
                break
            layout = _wav_format(audio, blob[start:start + size], argument)
        elif name == b"data":
            if layout is None:
                raise _wav_error(audio, "is not a readable PCM WAV file (its `data` chunk "
                                 "comes before its `fmt ` chunk)", argument)
            channels, rate, width = layout
            frame = max(channels * width, 1)
            count = None if size == _UNKNOWN_SIZE else size // frame
            return channels, rate, width, blob[start:start + size], count
    raise _wav_error(audio, "is not a readable PCM WAV file (the file ends inside its header: "
                     f"no {'`data`' if layout else '`fmt `'} chunk)", argument)


def wav_samples(audio, argument="audio"):
    """`(samples, sampling_rate)` of the WAV file `audio`: float32 samples
    in [-1, 1), as written (no resampling).

    The one WAV reader of the package (training files and `keras-attn
    transcribe`), its own RIFF parser (the standard library's `wave` reads
    WAVE_FORMAT_EXTENSIBLE in some Python versions only): integer PCM of 16,
    24 or 32 bits, one channel, with the plain PCM format tag or as
    WAVE_FORMAT_EXTENSIBLE with the PCM sub-format (what many recorders and
    SoX write past 16 bits). A `DataFileError` naming the file and
    `argument` for a file that is not PCM WAV (another format, float
    samples included, is named), has several channels (a mix of channels
    out of phase is silence: not done silently), holds 8-bit samples (their
    quantisation noise, -48 dB, sits far above the silence of the 16-bit
    audio the models learn from), has a sample rate outside
    `SAMPLE_RATES`, holds fewer samples than its header says (cut short),
    or none (an empty `data` chunk: "holds no samples"); a missing file is
    a `FileNotFoundError`.
    """
    channels, rate, width, data, count = _wav_contents(audio, argument)
    if channels != 1:
        raise _wav_error(
            audio, f"has {channels} channels; the model hears one (mix it down to mono first, "
            "e.g. `sox in.wav -c 1 out.wav`: a mix of channels out of phase cancels, so it is "
            "not done silently)", argument, f" with {channels} channels")
    if width not in (2, 3, 4):
        raise _wav_error(
            audio, f"holds {8 * width}-bit samples; 16-, 24- or 32-bit PCM is read (8-bit "
            "quantisation noise, -48 dB, is far above the silence the models were trained on: "
            "convert with `sox in.wav -b 16 out.wav`)", argument,
            f" with sample width {width} bytes")
    if not SAMPLE_RATES[0] <= rate <= SAMPLE_RATES[1]:
        raise _wav_error(audio, f"has a sample rate of {rate} Hz; WAV files of "
                         f"{SAMPLE_RATES[0]} to {SAMPLE_RATES[1]} Hz are read (a header "
                         "outside says the file is damaged, or not audio)", argument)
    held = len(data) // width
    if count is not None and held < count:
        raise _wav_error(audio, f"is cut short: its header says {count} samples, it holds "
                         f"{held} (a copy or a download that stopped: fetch it again)",
                         argument)
    if not held:
        raise _wav_error(audio, "holds no samples (an empty clip: its `data` chunk is empty)",
                         argument)
    data = data[:held * width]
    if width == 3:  # 24-bit little-endian: put each sample in the top of an int32
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3)
        padded = np.zeros((len(raw), 4), np.uint8)
        padded[:, 1:] = raw
        samples = padded.view("<i4")[:, 0]
        width = 4
    else:
        samples = np.frombuffer(data, _SAMPLE_WIDTHS[width])
    scale = float(2 ** (8 * width - 1))
    return (samples.astype("float64") / scale).astype("float32"), rate


def resample(samples, rate, target_rate):
    """`samples` at `rate` Hz resampled to `target_rate` Hz (SciPy's
    polyphase filter, `scipy.signal.resample_poly`), clipped to [-1, 1]; the
    same array when they agree.

    The filter rings past a full-scale edge (a 0.9999 square wave from
    22,050 to 16,000 Hz reaches 1.22): clipped, as audio tools clip, so that
    what is read stays in the [-1, 1] the models take (the streaming front
    ends refuse samples outside it: `keras-attn transcribe --stream`)."""
    if rate == target_rate:
        return samples
    from scipy.signal import resample_poly

    divisor = math.gcd(int(rate), int(target_rate))
    resampled = resample_poly(samples, target_rate // divisor, rate // divisor)
    return np.clip(resampled, -1.0, 1.0).astype("float32")


def read_wav(path, sampling_rate=16000, argument="path"):
    """A mono WAV file as float32 samples in [-1, 1] at `sampling_rate`
    (`wav_samples`, then `resample`)."""
    samples, rate = wav_samples(path, argument)
    return resample(samples, rate, sampling_rate)
