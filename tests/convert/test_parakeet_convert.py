"""NVIDIA's Parakeet CTC (FastConformer) from a Hugging Face directory,
held against transformers' own `ParakeetForCTC` (random weights of an
untested size, norms, biases and BatchNorm statistics moved, padded rows of
two lengths)."""

import json
import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_attn.convert import load_hf  # noqa: E402
from keras_attn.convert.parakeet import load_hf_parakeet  # noqa: E402
from keras_attn.layers.fast_conv_subsampling import fast_subsampled_length  # noqa: E402
from _parakeet import perturb  # noqa: E402
from test_case import to_numpy  # noqa: E402

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             subsampling_conv_channels=8, num_mel_bins=16, conv_kernel_size=9)
VOCAB = 10  # 9 tokens and the blank (last)
LENGTHS = [45, 27]  # feature frames -> 6 and 4 encoder frames


@pytest.fixture(scope="module")
def parakeet(tmp_path_factory):
    """(directory, transformers model) of a random ParakeetForCTC."""
    config = transformers.ParakeetCTCConfig(
        vocab_size=VOCAB, pad_token_id=VOCAB - 1, encoder_config=SMALL)
    torch.manual_seed(59)
    model = transformers.ParakeetForCTC(config).eval()
    perturb(model, 5)
    directory = tmp_path_factory.mktemp("parakeet")
    model.save_pretrained(directory)
    return str(directory), model


def _call(model, inputs):
    # JAX compiles each op of an eager call: its compiled predict step is faster.
    if keras.backend.backend() == "jax":
        return model.predict_on_batch(inputs)
    return model(inputs)


def _features():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((2, max(LENGTHS), 16)).astype("float32")
    mask = np.arange(max(LENGTHS))[None] < np.array(LENGTHS)[:, None]
    # Padded frames hold zeros, as ParakeetFeatureExtractor pads them.
    return np.where(mask[..., None], features, 0.0).astype("float32"), mask


def test_logits_equal_transformers_from_features(parakeet):
    directory, reference = parakeet
    features, mask = _features()
    with torch.no_grad():
        expected = reference(input_features=torch.from_numpy(features),
                             attention_mask=torch.from_numpy(mask.astype("int64"))).logits.numpy()
    model = load_hf(directory)  # dispatches to load_hf_parakeet
    assert model.conformer_config.subsampling == "fast"
    outputs = _call(model, {"features": features, "feature_length": np.array(LENGTHS, "int32")})
    logits = to_numpy(outputs["logits"])
    lengths = to_numpy(outputs["logit_lengths"]).tolist()
    assert lengths == [fast_subsampled_length(n) for n in LENGTHS] == [6, 4]
    assert logits.shape == expected.shape
    # keras_attn's blank is index 0, Parakeet's the last.
    expected = np.roll(expected, 1, axis=-1)
    for row, steps in enumerate(lengths):
        np.testing.assert_allclose(logits[row, :steps], expected[row, :steps], atol=1e-3)
    # A row alone gives its batched logits: the padding reached no valid frame.
    alone = to_numpy(_call(model, {"features": features[1:, :LENGTHS[1]],
                                   "feature_length": np.array(LENGTHS[1:], "int32")})["logits"])
    np.testing.assert_allclose(alone[0], logits[1, :4], atol=1e-4)


def test_every_tensor_mapped_or_refused_by_name(parakeet, tmp_path):
    directory, _ = parakeet
    from safetensors.numpy import load_file, save_file

    tensors = load_file(os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json")) as stream:
        config = json.load(stream)
    extra = dict(tensors, **{"encoder.layers.2.norm_out.weight": np.ones(32, "float32")})
    save_file(extra, str(tmp_path / "model.safetensors"))
    with open(tmp_path / "config.json", "w") as stream:
        json.dump(config, stream)
    with pytest.raises(ValueError, match="encoder.layers.2.norm_out.weight"):
        load_hf_parakeet(tmp_path)
    missing = {k: v for k, v in tensors.items() if k != "encoder.layers.1.conv.norm.running_var"}
    save_file(missing, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="encoder.layers.1.conv.norm.running_var"):
        load_hf_parakeet(tmp_path)


def test_a_config_option_it_does_not_compute_is_refused(parakeet, tmp_path):
    directory, _ = parakeet
    with open(os.path.join(directory, "config.json")) as stream:
        config = json.load(stream)
    config["encoder_config"]["subsampling_factor"] = 4
    with open(tmp_path / "config.json", "w") as stream:
        json.dump(config, stream)
    with pytest.raises(ValueError, match="subsampling_factor=4"):
        load_hf_parakeet(tmp_path)


# === The feature extractor as the model's front end, and writing back ===

WAVE_LENGTHS = [6400, 4321]  # 40 and 27 feature frames -> 5 and 4 encoder frames


@pytest.fixture(scope="module")
def with_extractor(parakeet, tmp_path_factory):
    """(directory with preprocessor_config.json, transformers model, extractor)."""
    import shutil

    directory, model = parakeet
    copy = str(tmp_path_factory.mktemp("parakeet_fe") / "model")
    shutil.copytree(directory, copy)
    extractor = transformers.ParakeetFeatureExtractor(feature_size=16, preemphasis=0.95)
    extractor.save_pretrained(copy)
    return copy, model, extractor


def _waves():
    rng = np.random.default_rng(3)
    rows = [np.clip(0.3 * rng.standard_normal(n), -1, 1).astype("float32") for n in WAVE_LENGTHS]
    batch = np.zeros((2, max(WAVE_LENGTHS)), "float32")
    for i, row in enumerate(rows):
        batch[i, :len(row)] = row
    return rows, batch


def _hf_logits(model, extractor, rows):
    inputs = extractor(rows, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits.numpy()
    return np.roll(logits, 1, axis=-1), inputs  # the blank at index 0, as keras_attn's


def test_waveform_model_equals_feature_extractor_and_transformers(with_extractor, tmp_path):
    directory, reference, extractor = with_extractor
    rows, batch = _waves()
    expected, inputs = _hf_logits(reference, extractor, rows)
    model = load_hf(directory)  # preprocessor_config.json: a waveform model
    config = model.conformer_config
    assert (config.input_type, config.front_end, config.preemphasis) == (
        "waveform", "parakeet", 0.95)
    outputs = _call(model, {"waveform": batch, "waveform_length": np.array(WAVE_LENGTHS)})
    logits, lengths = to_numpy(outputs["logits"]), to_numpy(outputs["logit_lengths"]).tolist()
    frames = inputs["attention_mask"].sum(-1).numpy()
    assert lengths == [fast_subsampled_length(n) for n in frames] == [5, 4]
    for row, steps in enumerate(lengths):  # the bound is 5e-3; measured 3e-7
        np.testing.assert_allclose(logits[row, :steps], expected[row, :steps], atol=1e-4)
    # The features model of the same directory takes the extractor's features.
    features = load_hf_parakeet(directory, input_type="features")
    out = _call(features, {"features": inputs["input_features"].numpy(),
                           "feature_length": frames.astype("int32")})
    np.testing.assert_allclose(to_numpy(out["logits"])[0, :5], expected[0, :5], atol=1e-4)
    with pytest.raises(ValueError, match="input_type='waveform'"):
        load_hf_parakeet(_without_extractor(directory, tmp_path), input_type="waveform")


def _without_extractor(directory, tmp_path):
    """A copy of `directory` without its preprocessor_config.json."""
    import shutil

    copy = str(tmp_path / "bare")
    shutil.copytree(directory, copy)
    os.remove(os.path.join(copy, "preprocessor_config.json"))
    return copy


def test_save_hf_round_trip_through_from_pretrained(with_extractor, tmp_path):
    from keras_attn.convert import save_hf

    directory, _, _ = with_extractor
    model = load_hf(directory)
    out = save_hf(model, tmp_path / "out")  # dispatches to save_hf_parakeet
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors",
                                       "preprocessor_config.json"]
    reloaded, info = transformers.ParakeetForCTC.from_pretrained(out, output_loading_info=True)
    assert not any(info.get(key) for key in ("missing_keys", "unexpected_keys",
                                             "mismatched_keys"))
    extractor = transformers.ParakeetFeatureExtractor.from_pretrained(out)
    assert (extractor.feature_size, extractor.preemphasis) == (16, 0.95)
    rows, batch = _waves()
    expected, _ = _hf_logits(reloaded.eval(), extractor, rows)
    logits = to_numpy(_call(model, {"waveform": batch,
                                    "waveform_length": np.array(WAVE_LENGTHS)})["logits"])
    for row, steps in enumerate([5, 4]):
        np.testing.assert_allclose(logits[row, :steps], expected[row, :steps], atol=1e-4)
    # keras_attn reads its own directory back to the same weights.
    again = load_hf_parakeet(out)
    for a, b in zip(model.weights, again.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_save_hf_refuses_what_parakeet_does_not_compute_by_name(tmp_path):
    from keras_attn.convert.parakeet import save_hf_parakeet
    from keras_attn.models.conformer import build_conformer

    base = dict(vocabulary_size=5, num_layers=1, hidden_dim=16, num_heads=2,
                subsampling_filters=4, num_mel_bins=16, freq_mask_width=4)
    conv = build_conformer("parakeet_ctc_tiny", subsampling="conv", **base)
    with pytest.raises(ValueError, match="subsampling='conv'"):
        save_hf_parakeet(conv, tmp_path / "a")
    own = build_conformer("parakeet_ctc_tiny", front_end="log_mel", preemphasis=None, **base)
    with pytest.raises(ValueError, match="front_end='log_mel'"):
        save_hf_parakeet(own, tmp_path / "b")
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
