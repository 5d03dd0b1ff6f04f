"""`keras-attn transcribe RUN_DIR AUDIO [--stream --chunk-ms N]` (issue 41
item 6) and `keras_attn.zoo.transcribe` behind it: the printed transcript is
the model's greedy CTC decoding of the WAV file's samples, whole or
streamed; bad files and flags are refused by name."""

import sys
import wave

import numpy as np
import pytest

from _tiny import tiny_overrides
import keras_attn.cli as cli
from keras_attn.zoo.transcribe import Transcriber
from keras_attn.zoo.transcribe import read_wav
from keras_attn.zoo.transcribe import transcribe

pytestmark = pytest.mark.tf_only

RATE = 16000
# A learning rate of ~0 keeps the weights at their (seeded) initialisation,
# whose greedy output is a long string of digits: a stronger check that two
# decodings agree than the all-blank output that a few real steps give.
_UNTRAINED = ["training.steps_per_epoch=1", "training.optimizer.learning_rate=1e-9",
              "evaluation.streaming_chunk_sizes=[]"]


def _write_wav(path, samples, rate=RATE, channels=1, width=2):
    """`samples` (float, (n,) or (n, channels)) as integer PCM; returns the
    integers written."""
    scale = 2 ** (8 * width - 1)
    ints = np.clip(np.round(np.asarray(samples) * scale), -scale, scale - 1).astype("<i4")
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        if width == 1:  # 8-bit WAV is unsigned
            data = (ints + 128).astype("u1").tobytes()
        elif width == 3:
            data = ints.astype("<i4").view("u1").reshape(-1, 4)[:, :3].tobytes()
        else:
            data = ints.astype(f"<i{width}").tobytes()
        writer.writeframes(data)
    return ints


def _greedy_text(model, samples):
    """`ConformerCTC.decode` (greedy) of `samples`, as digits."""
    from keras_attn.data.speech import decode_ids

    ids = model.decode({"waveform": np.asarray(samples, "float32")[None],
                        "waveform_length": np.array([len(samples)], "int32")})
    return decode_ids([int(i) for i in np.asarray(ids)[0]])


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """Two tiny runs (streaming and offline), a 16-bit WAV of two embedded
    utterances and the float samples the file holds."""
    from keras_attn.data.speech import load_spoken_digits
    from keras_attn.zoo import runs

    root = tmp_path_factory.mktemp("transcribe")
    sets = tiny_overrides("conformer_tiny_digits") + _UNTRAINED
    streaming, offline = str(root / "streaming"), str(root / "offline")
    runs.train("conformer_tiny_digits_streaming", sets, output=streaming, export=False,
               verbose=0)
    runs.train("conformer_tiny_digits", sets, output=offline, export=False, verbose=0)
    waveforms, _ = load_spoken_digits(24, seed=0)
    audio = np.concatenate(waveforms[:2])
    path = root / "digits.wav"
    samples = _write_wav(path, audio) / 32768.0
    return {"streaming": streaming, "offline": offline, "wav": str(path), "root": root,
            "audio": audio, "samples": samples.astype("float32")}


@pytest.mark.slow
@pytest.mark.xdist_group("transcribe")  # one worker trains the module's two runs once
def test_offline_and_streamed_transcripts_are_the_models_greedy_decoding(speech, capsys):
    model = Transcriber(speech["streaming"]).model
    expected = _greedy_text(model, speech["samples"])
    assert len(expected) >= 3  # a real comparison, not two empty strings

    # The whole file, then streamed with its output piped (captured: not a
    # terminal, as `keras-attn ... | cat` sees it), in this process: a
    # TensorFlow start-up less (`keras-attn` itself is `sys.exit(cli.main())`).
    assert cli.main(["transcribe", speech["streaming"], speech["wav"]]) == 0
    assert capsys.readouterr().out.splitlines() == [expected]

    assert not sys.stdout.isatty()
    assert cli.main(["transcribe", speech["streaming"], speech["wav"], "--stream",
                     "--chunk-ms", "80"]) == 0
    *partials, final = capsys.readouterr().out.splitlines()
    assert final == expected
    # Piped: a line per piece that changed the text, "[  t s] text", the text
    # growing (greedy CTC emits each token once) and the times too.
    assert len(partials) >= 2
    times, texts = [], []
    for line in partials:
        assert line.startswith("[") and "\r" not in line and "\033" not in line, line
        stamp, _, text = line[1:].partition(" s] ")
        times.append(float(stamp))
        texts.append(text)
    assert times == sorted(times) and times[-1] <= len(speech["samples"]) / RATE + 1e-6
    assert all(a != b and b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert expected.startswith(texts[-1])


@pytest.mark.slow
@pytest.mark.xdist_group("transcribe")  # one worker trains the module's two runs once
def test_an_offline_run_transcribes_whole_and_refuses_stream_by_name(speech, capsys):
    model = Transcriber(speech["offline"]).model
    assert model.conformer_config.chunk_size is None
    assert cli.main(["transcribe", speech["offline"], speech["wav"]]) == 0
    assert capsys.readouterr().out.splitlines() == [_greedy_text(model, speech["samples"])]

    assert cli.main(["transcribe", speech["offline"], speech["wav"], "--stream"]) == 2
    error = capsys.readouterr().err
    assert "`stream` (--streaming)" in error and "not trained for streaming" in error


@pytest.mark.slow
@pytest.mark.xdist_group("transcribe")  # one worker trains the module's two runs once
def test_the_terminal_sees_one_line_rewritten(speech, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(["transcribe", speech["streaming"], speech["wav"], "--stream"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.count("\r\033[K") >= 2
    assert out.rpartition("\r\033[K")[2].strip() == _greedy_text(
        Transcriber(speech["streaming"]).model, speech["samples"])


@pytest.mark.slow
@pytest.mark.xdist_group("transcribe")  # one worker trains the module's two runs once
def test_a_file_at_another_rate_reaches_the_model_at_its_rate(speech):
    from scipy.signal import resample_poly

    path = speech["root"] / "digits_22050.wav"
    ints = _write_wav(path, resample_poly(speech["audio"], 441, 320), rate=22050)
    recognizer = Transcriber(speech["streaming"])
    loaded = recognizer.load(path)
    # 22,050 Hz -> 16,000 Hz: up 320, down 441 (gcd 50), the polyphase filter.
    read = (ints / 32768.0).astype("float32")  # the file's samples, as read_wav gives them
    np.testing.assert_array_equal(loaded, resample_poly(read, 320, 441).astype("float32"))
    assert len(loaded) == -(-len(ints) * 320 // 441)
    assert transcribe(speech["streaming"], path) == _greedy_text(recognizer.model, loaded)
    assert transcribe(speech["streaming"], path, stream=True) == _greedy_text(
        recognizer.model, loaded)


@pytest.mark.slow
@pytest.mark.xdist_group("transcribe")  # one worker trains the module's two runs once
def test_bad_files_and_chunk_sizes_are_refused_by_name(speech, capsys):
    root, audio, run = speech["root"], speech["audio"], speech["streaming"]
    stereo, low, garbage = root / "stereo.wav", root / "8bit.wav", root / "garbage.wav"
    _write_wav(stereo, np.stack([audio, audio], axis=1).reshape(-1), channels=2)
    _write_wav(low, audio, width=1)
    garbage.write_bytes(b"ID3\x04 this is an mp3, not a wave file" * 8)
    cases = [
        ([stereo], ["has 2 channels", f"AUDIO='{stereo}'"]),
        ([low], ["8-bit", f"AUDIO='{low}'"]),
        ([garbage], ["not a readable PCM WAV file", f"AUDIO='{garbage}'"]),
        ([speech["wav"], "--stream", "--chunk-ms", "50"],
         ["`chunk_ms` (--chunk-ms)", "40 ms", "40, 80, 120, 160", "chunk_ms=50"]),
        ([speech["wav"], "--chunk-ms", "80"], ["`chunk_ms` (--chunk-ms)", "stream=True"]),
    ]
    for args, needles in cases:
        assert cli.main(["transcribe", run, *map(str, args)]) == 2, args
        error = capsys.readouterr().err
        for needle in needles:
            assert needle in error, (needle, error)


@pytest.mark.slow
def test_a_fast_conformer_run_streams_its_greedy_transcript(speech, tmp_path, capsys):
    """A streaming FastConformer run (issue 59: subsampling="fast", 80 ms
    steps) streams the transcript of its offline greedy decoding."""
    from keras_attn.zoo import runs

    run = str(tmp_path / "fast")
    fast = ["model.overrides.subsampling=fast", "model.overrides.subsampling_filters=4",
            "model.overrides.scale_input=true"]
    runs.train("conformer_tiny_digits_streaming",
               tiny_overrides("conformer_tiny_digits") + _UNTRAINED + fast, output=run,
               export=False, verbose=0)
    recognizer = Transcriber(run)
    assert recognizer.step_ms == 80.0
    expected = _greedy_text(recognizer.model, speech["samples"])
    assert len(expected) >= 3
    assert cli.main(["transcribe", run, speech["wav"], "--stream", "--chunk-ms", "160"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == expected
    assert cli.main(["transcribe", run, speech["wav"], "--stream", "--chunk-ms", "120"]) == 2
    assert "80 ms" in capsys.readouterr().err


def test_read_wav_reads_16_24_and_32_bit_pcm_exactly(tmp_path):
    values = np.array([0.0, 0.5, -0.5, -1.0, 0.25, 1 / 1024])
    for width in (2, 3, 4):
        ints = _write_wav(tmp_path / f"{width}.wav", values, rate=8000, width=width)
        samples, rate = read_wav(tmp_path / f"{width}.wav")
        assert rate == 8000 and samples.dtype == np.float32
        np.testing.assert_array_equal(samples, (ints / 2.0 ** (8 * width - 1)).astype("float32"))
        np.testing.assert_allclose(samples, values, atol=2.0 ** (1 - 8 * width))


def test_read_wav_refuses_what_it_cannot_read(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.wav is not a readable PCM WAV file"):
        read_wav(tmp_path / "empty.wav")
    _write_wav(tmp_path / "stereo.wav", np.zeros(8), channels=2)
    with pytest.raises(ValueError, match="stereo.wav has 2 channels.*with 2 channels"):
        read_wav(tmp_path / "stereo.wav")
    with pytest.raises(FileNotFoundError):
        read_wav(tmp_path / "missing.wav")


def test_read_wav_refuses_a_file_cut_short_and_a_rate_out_of_range(tmp_path):
    _write_wav(tmp_path / "whole.wav", np.full(1000, 0.25))
    whole = (tmp_path / "whole.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(whole[:-500])
    with pytest.raises(ValueError, match=r"cut\.wav is cut short: its header says 1000 "
                                         r"samples, it holds 750"):
        read_wav(tmp_path / "cut.wav")
    # 1 Hz would be resampled 16,000-fold (minutes, then out of memory): refused first.
    _write_wav(tmp_path / "1hz.wav", np.zeros(100), rate=1)
    with pytest.raises(ValueError, match=r"1hz\.wav has a sample rate of 1 Hz.*8000 to "
                                         r"192000 Hz.*Received: audio="):
        read_wav(tmp_path / "1hz.wav")


def test_a_file_too_short_for_the_model_is_refused_with_the_minimum(tmp_path):
    from types import SimpleNamespace

    # The model's settings alone (no weights): 160-sample steps at 16 kHz.
    recognizer = Transcriber.__new__(Transcriber)
    recognizer.config, recognizer.sampling_rate = SimpleNamespace(frame_step=160), RATE
    _write_wav(tmp_path / "short.wav", np.full(100, 0.1))
    with pytest.raises(ValueError, match=r"short\.wav holds 100 samples \(0\.00625 s\); the "
                                         r"model needs at least 960 samples \(0\.06 s\)"):
        recognizer.load(tmp_path / "short.wav")
    _write_wav(tmp_path / "long_enough.wav", np.full(960, 0.1))
    assert len(recognizer.load(tmp_path / "long_enough.wav")) == 960
