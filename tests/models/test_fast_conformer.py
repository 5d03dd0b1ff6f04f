"""The FastConformer option of ConformerCTC (`subsampling="fast"`): 8x
encoder frames, padding-safe rows, a training step, and what it refuses."""

import keras
import numpy as np
import pytest

from keras_attn.models.conformer import build_conformer
from keras_attn.models.conformer import get_conformer_config
from test_case import to_numpy

TINY = dict(vocabulary_size=5, subsampling="fast", subsampling_filters=4, hidden_dim=16,
            num_layers=1, num_heads=2, kernel_size=5, num_mel_bins=16, freq_mask_width=4,
            scale_input=True, batch_norm_epsilon=1e-5)


def test_waveform_model_emits_an_eighth_of_the_frames_and_pads_safely():
    model = build_conformer("conformer_tiny", **TINY)
    rng = np.random.default_rng(1)
    lengths = np.array([4000, 2400], "int32")  # 26 and 16 frames -> 4 and 2 logits
    waveform = rng.uniform(-0.5, 0.5, (2, 4000)).astype("float32")
    waveform[1, 2400:] = 9.0  # padding that must not reach row 1's logits
    outputs = model.predict_on_batch({"waveform": waveform, "waveform_length": lengths})
    assert to_numpy(outputs["logit_lengths"]).tolist() == [4, 2]
    assert tuple(outputs["logits"].shape) == (2, 4, 6)
    alone = model.predict_on_batch({"waveform": waveform[1:, :2400],
                                    "waveform_length": lengths[1:]})
    np.testing.assert_allclose(to_numpy(alone["logits"])[0],
                               to_numpy(outputs["logits"])[1, :2], atol=1e-4)


def test_a_training_step_on_features_is_finite():
    model = build_conformer("conformer_tiny", input_type="features", **TINY)
    # One step: eager where eager is fast (JAX compiles each op eagerly).
    model.compile(optimizer="adam", run_eagerly=keras.backend.backend() != "jax")
    rng = np.random.default_rng(2)
    x = {"features": rng.standard_normal((2, 40, 16)).astype("float32"),
         "feature_length": np.array([40, 33], "int32")}
    loss = model.train_on_batch(x, np.array([[1, 2, 3], [4, 0, 0]], "int32"))
    assert np.isfinite(loss)


def test_streaming_and_packing_are_refused_for_the_fast_subsampling():
    with pytest.raises(ValueError, match="subsampling='fast'"):
        get_conformer_config("conformer_tiny", subsampling="fast", chunk_size=4,
                             left_context=4, causal_conv=True, feature_normalization="none")
    model = build_conformer("conformer_tiny", input_type="features", **TINY)
    features = np.zeros((1, 16, 16), "float32")
    with pytest.raises(ValueError, match="subsampling='fast'"):
        model({"features": features, "feature_length": np.array([16], "int32"),
               "segment_ids": np.ones((1, 16), "int32"),
               "positions": np.arange(16, dtype="int32")[None]})

