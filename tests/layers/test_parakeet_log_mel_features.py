"""ParakeetLogMelFeatures: the generic layer checks, the features of
transformers' ParakeetFeatureExtractor on a padded batch, padding safety and
the errors."""

import numpy as np
import pytest

from keras_attn.layers import ParakeetLogMelFeatures
from keras_attn.layers.parakeet_log_mel_features import slaney_mel_filters
from test_case import run_layer_test
from test_case import to_numpy

RNG = np.random.default_rng(59)
LENGTHS = [6400, 4321, 350]  # 40, 27 and 2 valid frames


def waves(lengths=LENGTHS):
    """Speech-like noise of each length, and the batch padded with zeros."""
    rows = [np.clip(0.3 * RNG.standard_normal(n), -1, 1).astype("float32") for n in lengths]
    batch = np.zeros((len(rows), max(lengths)), "float32")
    for i, row in enumerate(rows):
        batch[i, :len(row)] = row
    return rows, batch


def test_parakeet_log_mel_layer(tmp_path):
    _, batch = waves([1600, 900])
    run_layer_test(
        ParakeetLogMelFeatures,
        init_kwargs={"sampling_rate": 8000, "num_mel_bins": 12, "frame_length": 200,
                     "frame_step": 80, "fft_length": 256, "preemphasis": 0.9,
                     "epsilon": 1e-3, "stft": "convolution"},
        input_data={"waveform": batch, "waveform_length": np.array([1600, 900], "int32")},
        expected_output_shape=(2, 21, 12),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
    )


def test_features_equal_transformers_feature_extractor():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.audio_utils import mel_filter_bank

    rows, batch = waves()
    extractor = transformers.ParakeetFeatureExtractor(feature_size=20)
    expected = extractor(rows, sampling_rate=16000, return_tensors="pt")
    features = expected["input_features"].numpy()
    frames = expected["attention_mask"].sum(-1).numpy()
    layer = ParakeetLogMelFeatures(num_mel_bins=20, preemphasis=0.97)
    ours = to_numpy(layer(batch, np.array(LENGTHS, "int32")))
    assert to_numpy(layer.num_frames(np.array(LENGTHS))).tolist() == frames.tolist() == [
        40, 27, 2]
    assert ours.shape == features.shape == (3, 41, 20)
    # Float32 arithmetic in another order (measured: 4e-5 on values up to ~5).
    np.testing.assert_allclose(ours, features, atol=1e-4)
    assert np.abs(features[0]).max() > 2.0  # normalised, not zeros
    # The STFT as a convolution (what ONNX and LiteRT run): the same features.
    layer.stft = "convolution"
    np.testing.assert_allclose(to_numpy(layer(batch, np.array(LENGTHS, "int32"))), features,
                               atol=1e-4)
    reference = mel_filter_bank(num_frequency_bins=257, num_mel_filters=20, min_frequency=0.0,
                                max_frequency=8000.0, sampling_rate=16000, norm="slaney",
                                mel_scale="slaney", dtype=np.float32)
    np.testing.assert_allclose(slaney_mel_filters(20, 512, 16000), reference, atol=1e-8)
    del torch


def test_padding_and_batch_mates_change_nothing_and_bad_lengths_are_nan():
    layer = ParakeetLogMelFeatures(num_mel_bins=16, preemphasis=0.97)
    _, batch = waves([4000, 2500])
    lengths = np.array([4000, 2500], "int32")
    padded = batch.copy()
    padded[1, 2500:] = 0.9  # padding that must not reach row 1's features
    together = to_numpy(layer(padded, lengths))
    alone = to_numpy(layer(batch[1:, :2500], lengths[1:]))
    frames = 2500 // 160
    np.testing.assert_allclose(together[1, :frames], alone[0, :frames], atol=1e-5)
    np.testing.assert_array_equal(together[1, frames:], 0.0)
    np.testing.assert_allclose(together[1, :frames].mean(0), 0.0, atol=1e-4)
    # The unbiased deviation (n - 1), as NeMo divides.
    np.testing.assert_allclose(together[1, :frames].std(0, ddof=1), 1.0, atol=1e-3)
    broken = to_numpy(layer(batch, np.array([4000, 4001], "int32")))
    assert np.isnan(broken[1]).all() and np.isfinite(broken[0]).all()
    padded[1, 7] *= 32768.0  # a valid sample outside [-1, 1] (16-bit PCM as floats)
    loud = to_numpy(layer(padded, lengths))
    assert np.isnan(loud[1]).all()
    np.testing.assert_array_equal(loud[0], together[0])


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match=r"Received: fft_length=256, frame_length=400"):
        ParakeetLogMelFeatures(fft_length=256)
    with pytest.raises(ValueError, match=r"preemphasis=1.0"):
        ParakeetLogMelFeatures(preemphasis=1.0)
    with pytest.raises(ValueError, match=r"Received: stft='rfft'"):
        ParakeetLogMelFeatures(stft="rfft")
