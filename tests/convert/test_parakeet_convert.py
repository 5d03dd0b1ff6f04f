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
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if name.endswith("running_var"):
                tensor.copy_(0.01 + noise.abs())  # positive, some near 0: the epsilon counts
            elif "norm" in name and name.endswith("weight"):
                tensor.copy_(1.0 + 0.2 * noise)
            else:  # kernels, biases, bias_u/v, running means, norm biases
                tensor.add_(0.1 * noise)
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
