"""`ConformerCTC.with_vocabulary`: a trained encoder under a fresh CTC head
of another vocabulary (a Parakeet checkpoint's 1,024 tokens -> your
transcripts' characters), every other weight copied by path, and what it
refuses."""

import keras
import numpy as np
import pytest

from keras_attn.models.conformer import build_conformer
from test_case import to_numpy

# A Parakeet (waveforms, its front end, 8x) and the paper's Conformer
# (features, 4x), each one small block.
MODELS = {
    "parakeet": ("parakeet_ctc_tiny", dict(num_layers=1, hidden_dim=16, num_heads=2,
                                           subsampling_filters=4, num_mel_bins=16,
                                           freq_mask_width=4)),
    "conformer_features": ("conformer_tiny", dict(num_layers=1, hidden_dim=16, num_heads=2,
                                                  kernel_size=5, num_mel_bins=16,
                                                  freq_mask_width=4, input_type="features")),
}


def _trained(preset, overrides):
    """A model of 30 labels whose every weight (BatchNorm statistics too)
    is moved away from what a fresh build draws."""
    model = build_conformer(preset, vocabulary_size=30, **overrides)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        values = rng.normal(0.0, 0.2, tuple(variable.shape))
        if variable.path.endswith("moving_variance"):
            values = np.abs(values) + 0.5
        variable.assign(values.astype("float32"))
    return model


def _inputs(model):
    rng = np.random.default_rng(1)
    if model.conformer_config.input_type == "waveform":
        return {"waveform": rng.uniform(-0.5, 0.5, (2, 4000)).astype("float32"),
                "waveform_length": np.array([4000, 2800], "int32")}
    return {"features": rng.standard_normal((2, 40, 16)).astype("float32"),
            "feature_length": np.array([40, 29], "int32")}


def _encoder(model):
    """The activations the CTC head reads `(B, T', D)`."""
    return keras.Model(model.inputs, model.get_layer("ctc_logits").input)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_new_model_keeps_every_encoder_weight_under_a_new_head(name):
    model = _trained(*MODELS[name])
    mine = model.with_vocabulary(5)
    assert mine.vocabulary_size == 5 and mine.conformer_config.vocabulary_size == 5
    hidden = model.conformer_config.hidden_dim
    assert tuple(mine.get_layer("ctc_logits").kernel.shape) == (hidden, 6)
    assert tuple(mine.get_layer("ctc_logits").bias.shape) == (6,)
    assert tuple(model.get_layer("ctc_logits").kernel.shape) == (hidden, 31)  # left as it was
    old = {v.path: to_numpy(v) for v in model.weights}
    new = {v.path: to_numpy(v) for v in mine.weights}
    assert set(old) == set(new)
    for path, value in new.items():
        if not path.startswith("ctc_logits/"):
            np.testing.assert_array_equal(value, old[path], err_msg=path)
    # The logits differ through the head alone: the encoder's output is the same.
    x = _inputs(model)
    np.testing.assert_allclose(to_numpy(_encoder(mine)(x, training=False)),
                               to_numpy(_encoder(model)(x, training=False)), atol=1e-6)
    outputs = mine(x, training=False)
    assert tuple(outputs["logits"].shape)[-1] == 6
    np.testing.assert_array_equal(to_numpy(outputs["logit_lengths"]),
                                  to_numpy(model(x, training=False)["logit_lengths"]))


def test_fine_tuning_fields_and_the_dtype_may_change_and_a_features_model_takes_waveforms():
    preset, overrides = MODELS["conformer_features"]
    model = _trained(preset, overrides)
    mine = model.with_vocabulary(3, input_type="waveform", dropout=0.0, time_mask_count=0,
                                 dtype="mixed_bfloat16")
    config = mine.conformer_config
    assert (config.input_type, config.dropout, config.time_mask_count) == ("waveform", 0.0, 0)
    assert mine.get_layer("ctc_logits").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("ctc_logits").dtype_policy.name == "float32"
    assert sorted(mine.input) == ["waveform", "waveform_length"]
    np.testing.assert_array_equal(
        to_numpy(mine.get_layer("conformer_block_0").weights[0]),
        to_numpy(model.get_layer("conformer_block_0").weights[0]))


@pytest.mark.parametrize("value", [0, -3, 2.0, True, None, "28"])
def test_a_vocabulary_size_that_is_not_a_positive_int_is_refused_by_name(value):
    model = build_conformer("conformer_tiny", vocabulary_size=4, num_layers=1)
    with pytest.raises(ValueError, match=rf"`vocabulary_size` must be a positive integer.*"
                                         rf"Received: vocabulary_size={value!r}$"):
        model.with_vocabulary(value)


def test_an_override_that_would_change_the_encoder_is_refused_by_name():
    model = build_conformer("conformer_tiny", vocabulary_size=4, num_layers=1)
    with pytest.raises(ValueError, match=r"keeps the encoder as trained: only dropout, .*"
                                         r"Received: hidden_dim=32$"):
        model.with_vocabulary(8, hidden_dim=32)
    with pytest.raises(ValueError, match=r"Received: kernel_size=3$"):
        model.with_vocabulary(8, kernel_size=3)


def test_a_vocabulary_above_the_ceiling_is_refused_before_building():
    from keras_attn.models.conformer.conformer_model import MAX_NEW_VOCABULARY

    model = build_conformer("conformer_tiny", vocabulary_size=4, num_layers=1)
    # 10**9 labels would be a (hidden_dim, 10**9 + 1) kernel: refused, not allocated.
    with pytest.raises(ValueError, match=r"`vocabulary_size` must be at most 1,048,576 .*"
                                         r"Received: vocabulary_size=1000000000$"):
        model.with_vocabulary(10**9)
    with pytest.raises(ValueError, match=rf"Received: vocabulary_size={MAX_NEW_VOCABULARY + 1}"):
        model.with_vocabulary(MAX_NEW_VOCABULARY + 1)
