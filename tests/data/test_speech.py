import numpy as np
import pytest

from keras_attn.data import speech

# The data pipelines alone (tf.data and NumPy, no model): the JAX pass would
# run the same thing again.
pytestmark = pytest.mark.backend_independent


def test_synthesised_speech_is_audio_of_plausible_length():
    short = speech.synthesize("4")
    long = speech.synthesize("4 0 7 1 9")
    assert short.dtype == np.float32 and 0.05 < np.abs(short).max() <= 1.0
    # 16 kHz: one digit is a fraction of a second, five digits take longer.
    assert 0.2 * 16000 < len(short) < 1.5 * 16000
    assert len(long) > 2 * len(short)


def test_resampled_speech_stays_within_unit_range(monkeypatch):
    """The polyphase filter overshoots near full scale (embedded utterances
    peaked at 1.015, which every front end refuses): clipped back."""

    class FullScale:
        sample_rate = 22050

        def say(self, text, **kwargs):
            return np.tile(np.array([32767] * 40 + [-32768] * 40, "int16"), 100)

    monkeypatch.setattr(speech, "_engine", FullScale)
    audio = speech.synthesize("1")
    assert audio.dtype == np.float32 and np.abs(audio).max() == 1.0


def test_voices_rates_and_pitches_change_the_audio():
    base = speech.synthesize("3 1", voice="en", rate=175, pitch=50)
    slow = speech.synthesize("3 1", voice="en", rate=120, pitch=50)
    other = speech.synthesize("3 1", voice="en+f3", rate=175, pitch=50)
    assert len(slow) > len(base) * 1.2
    assert len(other) != len(base) or not np.allclose(other, base)


def test_unknown_voice():
    with pytest.raises(ValueError, match=r"Received: voice='xx-nonexistent'"):
        speech.synthesize("1", voice="xx-nonexistent")


def test_cache_is_reused_and_a_corrupt_cache_is_regenerated(tmp_path):
    waveforms, transcripts = speech.load_spoken_digits(6, seed=3, cache_dir=str(tmp_path))
    assert all(t.isdigit() and 1 <= len(t) <= 5 for t in transcripts)
    (cached,) = list(tmp_path.iterdir())
    again, again_text = speech.load_spoken_digits(6, seed=3, cache_dir=str(tmp_path))
    assert again_text == transcripts
    for a, b in zip(again, waveforms):
        np.testing.assert_array_equal(a, b)
    cached.write_bytes(cached.read_bytes()[:100])  # truncate it
    with pytest.warns(UserWarning, match="Regenerating the unreadable cache"):
        third, third_text = speech.load_spoken_digits(6, seed=3, cache_dir=str(tmp_path))
    assert third_text == transcripts
    # eSpeak NG is not bit-reproducible from run to run (sample values
    # drift; measured correlations 0.75-1.0, and lengths once off by more
    # than 2 samples on a loaded machine): regenerated audio has the same
    # transcripts and about the same lengths.
    assert all(abs(len(a) - len(b)) <= 0.1 * len(b) for a, b in zip(third, waveforms))
    assert all(np.all(np.isfinite(a)) and 0 < np.abs(a).max() <= 1.0 for a in third)
    assert [p.name for p in tmp_path.iterdir()] == [cached.name]  # no staging files left


def test_transcript_encoding_round_trip_and_errors():
    assert speech.encode_transcript("407") == [5, 1, 8]
    assert speech.decode_ids([5, 1, 8, 0, -1]) == "407"
    with pytest.raises(ValueError, match=r"Received: 'x' in text='4x'"):
        speech.encode_transcript("4x")


def test_dataset_buckets_by_duration_and_pads_labels_with_zero(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3000, 30000, 40)
    waveforms = [rng.standard_normal(n).astype("float32") for n in lengths]
    transcripts = ["".join(rng.choice(list("0123456789"), rng.integers(1, 6))) for _ in lengths]
    dataset = speech.speech_dataset(waveforms, transcripts, batch_size=8, shuffle=True)
    seen = 0
    batches = 0
    for inputs, labels in dataset:
        batches += 1
        audio = inputs["waveform"].numpy()
        valid = inputs["waveform_length"].numpy()
        assert audio.shape[1] % 8000 == 0  # padded to a bucket boundary
        assert valid.max() <= audio.shape[1] and valid.min() > audio.shape[1] - 8000
        for row, n, label in zip(audio, valid, labels.numpy()):
            assert not row[n:].any()
            text = speech.decode_ids(label)
            index = transcripts.index(text)
            assert lengths[index] == n or text in transcripts
        seen += len(valid)
    assert seen == 40 and batches == int(dataset.cardinality())


def test_tfds_speech_by_name_with_mock_data():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6):
        dataset, info = speech.load_tfds_speech("speech_commands", split="train", batch_size=3)
        inputs, labels = next(iter(dataset))
    assert inputs["waveform"].shape[0] == 3
    assert inputs["waveform_length"].shape == (3,)
    assert labels.shape[0] == 3
    assert info.name == "speech_commands"


def test_word_and_character_error_rates():
    refs = ["the cat sat", "on the mat"]
    # one substitution, one deletion over 6 reference words
    assert speech.word_error_rate(refs, ["the cat sit", "on mat"]) == pytest.approx(2 / 6)
    assert speech.word_error_rate(refs, refs) == 0.0
    assert speech.word_error_rate(["4 0 7"], [""]) == pytest.approx(1.0)  # all deleted
    # "sat" -> "sit": one character of 9 + 8 = 17 (spaces excluded)
    assert speech.character_error_rate(refs, ["the cat sit", "on the mat"]) == pytest.approx(1 / 17)
    with pytest.raises(ValueError, match=r"Received: 2 references, 1 hypotheses"):
        speech.word_error_rate(refs, ["x"])


def test_tfds_librispeech_by_name_with_mock_data():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=4):
        dataset, info = speech.load_tfds_speech("librispeech", split="train_clean100", batch_size=2)
        inputs, labels = next(iter(dataset))
    assert inputs["waveform"].shape[0] == 2 and labels.shape[0] == 2
    assert (labels.numpy() >= 0).all() and labels.numpy().max() <= 28


def test_epoch_order_is_a_function_of_seed_and_epoch():
    rng = np.random.default_rng(0)
    waveforms = [rng.standard_normal(n).astype("float32") for n in rng.integers(3000, 20000, 12)]
    transcripts = [str(i % 10) * (1 + i // 10) for i in range(12)]

    def labels(epoch):
        dataset = speech.speech_dataset(waveforms, transcripts, batch_size=4, shuffle=True,
                                        seed=2, epoch=epoch)
        return [labels.numpy().tolist() for _, labels in dataset]

    assert labels(1) == labels(1)
    assert labels(1) != labels(2)
