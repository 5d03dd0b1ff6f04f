"""DINOv2 with registers held against transformers' own model: random
weights of an untested size (norms, biases, LayerScale, registers moved away
from their initial values), `save_pretrained`, then `load_hf`."""

import keras
import numpy as np
import pytest

from keras_attn.convert import load_hf
from keras_attn.convert import save_hf
from keras_attn.convert.dinov2 import load_hf_dinov2
from keras_attn.models.vit import resize_vit
from keras_attn.models.vit.vit_config import PIXEL_STATISTICS
from test_case import to_numpy

# torch and transformers are imported where used: collecting this module
# does not import them.
pytestmark = pytest.mark.large

SIZE = 16  # 4 x 4 patches of 4


def hf_model(cls, swiglu=False, **overrides):
    import torch
    import transformers
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=4,
        patch_size=4, image_size=SIZE, num_register_tokens=2, layerscale_value=0.1,
        layer_norm_eps=1e-5, use_swiglu_ffn=swiglu, **overrides)
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # every weight drawn, norms and LayerScale away from 1 and 0
        for name, param in model.named_parameters():
            param.normal_(1.0 if name.endswith(("norm1.weight", "norm2.weight", "lambda1",
                                                "layernorm.weight")) else 0.0, 0.2)
    return model


def pixels(size=SIZE, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (2, size, size, 3)).astype("uint8")


def hf_pixels(images):
    import torch
    mean, std = (np.array(v, "float32") for v in PIXEL_STATISTICS["imagenet"])
    normalized = (images.astype("float32") / 255.0 - mean) / std
    return torch.from_numpy(normalized.transpose(0, 3, 1, 2).copy())


def hidden_states(model, images):
    """The last hidden state (after the final norm) of a keras_attn ViT."""
    trunk = keras.Model(model.input, model.get_layer("final_layer_norm").output)
    return to_numpy(trunk(images))


@pytest.mark.parametrize("swiglu", [False, True], ids=["gelu", "swiglu"])
def test_backbone_hidden_states_match_at_two_sizes(tmp_path, swiglu):
    import torch
    import transformers
    hf = hf_model(transformers.Dinov2WithRegistersModel, swiglu=swiglu)
    hf.save_pretrained(tmp_path)
    model = load_hf(str(tmp_path))
    config = model.vit_config
    assert (config.num_register_tokens, config.feed_forward, config.pooling) == (
        2, "swiglu" if swiglu else "gelu", "cls")
    assert config.intermediate_dim == (88 if swiglu else 128)
    for size in (SIZE, 24):  # 24: the 4 x 4 position grid interpolated to 6 x 6
        sized = model if size == SIZE else resize_vit(model, size, "bicubic_antialias")
        images = pixels(size)
        with torch.no_grad():
            out = hf(pixel_values=hf_pixels(images))
        expected = out.last_hidden_state.numpy()
        assert expected.shape == (2, 1 + 2 + (size // 4) ** 2, 32)
        np.testing.assert_allclose(hidden_states(sized, images), expected, atol=1e-4)
        np.testing.assert_allclose(to_numpy(sized(images)), out.pooler_output.numpy(), atol=1e-4)


def test_classifier_logits_match_and_save_round_trips(tmp_path):
    import torch
    import transformers
    hf = hf_model(transformers.Dinov2WithRegistersForImageClassification, num_labels=3)
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf(str(tmp_path / "hf"))
    assert model.vit_config.pooling == "cls_gap"
    images = pixels()
    with torch.no_grad():
        expected = hf(pixel_values=hf_pixels(images)).logits.numpy()
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4)
    # The backbone of the classifier's directory: the [CLS] vector.
    backbone = load_hf_dinov2(str(tmp_path / "hf"), include_classifier=False)
    with torch.no_grad():
        expected = hf.dinov2_with_registers(pixel_values=hf_pixels(images)).pooler_output.numpy()
    np.testing.assert_allclose(to_numpy(backbone(images)), expected, atol=1e-4)
    # At another size, loaded resized: transformers interpolates its grid.
    bigger = pixels(24, seed=1)
    with torch.no_grad():
        expected = hf(pixel_values=hf_pixels(bigger)).logits.numpy()
    resized = load_hf_dinov2(str(tmp_path / "hf"), image_size=24)
    np.testing.assert_allclose(to_numpy(resized(bigger)), expected, atol=1e-4)
    # save_hf writes the directory transformers loads, every key in place.
    save_hf(model, tmp_path / "out")
    again, info = transformers.Dinov2WithRegistersForImageClassification.from_pretrained(
        tmp_path / "out", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    with torch.no_grad():
        got = again.eval()(pixel_values=hf_pixels(images)).logits.numpy()
    np.testing.assert_allclose(got, to_numpy(model(images)), atol=1e-4)


@pytest.mark.backend_independent  # NumPy and safetensors only
def test_a_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path):
    import transformers
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file
    hf = hf_model(transformers.Dinov2WithRegistersModel)
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    del tensors["encoder.layer.1.layer_scale2.lambda1"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"no tensor 'encoder.layer.1.layer_scale2.lambda1'"):
        load_hf(str(tmp_path))


@pytest.mark.backend_independent  # refused before any weight is read
def test_writers_without_dinov2s_options_refuse_a_dinov2_model(tmp_path):
    from keras_attn.convert import save_hf_vit
    from keras_attn.convert import to_keras_hub
    from keras_attn.models.vit import build_vit
    model = build_vit("dinov2_registers_small_14", image_size=8, patch_size=4, hidden_dim=8,
                      num_heads=2, intermediate_dim=16, num_layers=1)
    with pytest.raises(ValueError, match=r"Received: num_register_tokens=4"):
        save_hf_vit(model, tmp_path / "vit")
    with pytest.raises(ValueError, match=r"Received: num_register_tokens=4, pooling='cls_gap'"):
        to_keras_hub(model)
    assert not (tmp_path / "vit").exists()


# BitImageProcessors whose pixels differ from ImageNet's normalisation.
PROCESSORS = {
    "clip_default": {},  # BitImageProcessor's own default statistics (CLIP's)
    "no_normalize": dict(do_normalize=False, image_mean=[0.485, 0.456, 0.406],
                         image_std=[0.229, 0.224, 0.225]),
    "no_rescale": dict(do_rescale=False, rescale_factor=0.5,
                       image_mean=[100.0, 120.0, 140.0], image_std=[60.0, 50.0, 70.0]),
}


@pytest.mark.parametrize("processor", list(PROCESSORS.values()), ids=list(PROCESSORS))
def test_logits_follow_the_image_processor(tmp_path, processor):
    """keras_attn on raw uint8 images = BitImageProcessor + model, at the
    processor's crop size (24, the checkpoint's 16 interpolated), and
    save_hf_dinov2 writes a processor that gives transformers the same pixels."""
    import torch
    import transformers
    hf = hf_model(transformers.Dinov2WithRegistersForImageClassification, num_labels=3)
    hf.save_pretrained(tmp_path / "hf")
    transformers.BitImageProcessor(size={"shortest_edge": 24},
                                   crop_size={"height": 24, "width": 24},
                                   **processor).save_pretrained(tmp_path / "hf")
    images = pixels(24, seed=3)
    hf_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = hf(**hf_processor(list(images), return_tensors="pt")).logits.numpy()
    model = load_hf_dinov2(str(tmp_path / "hf"))
    assert model.vit_config.image_size == 24
    got = to_numpy(model(images))
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    save_hf(model, tmp_path / "out")
    again = transformers.Dinov2WithRegistersForImageClassification.from_pretrained(
        tmp_path / "out").eval()
    written = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        logits = again(**written(list(images), return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(logits, got, atol=1e-4)


@pytest.mark.backend_independent  # refused before any weight is read
def test_an_image_processor_the_model_cannot_follow_is_refused(tmp_path):
    import json
    import transformers
    config = hf_model(transformers.Dinov2WithRegistersModel).config
    (tmp_path / "config.json").write_text(config.to_json_string())
    for fields, received in (
            ({"crop_size": {"height": 24, "width": 20}},
             r"crop_size=\{'height': 24, 'width': 20\}"),
            ({"do_rescale": 1}, r"do_rescale=1"),
            ({"image_processor_type": "ConvNextImageProcessor"},
             r"image_processor_type='ConvNextImageProcessor'")):
        processor = dict({"image_processor_type": "BitImageProcessor"}, **fields)
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
        with pytest.raises(ValueError, match=r"preprocessor_config.json: .*Received: " + received):
            load_hf_dinov2(str(tmp_path))


@pytest.mark.parametrize("head", [False, True], ids=["model", "classifier"])
def test_any_size_matches_transformers(tmp_path, head):
    """`interpolate_pos_encoding=True`: every size the patch divides, the
    position grid resampled as transformers' DINOv2 does (it always does)."""
    import torch
    import transformers
    cls = (transformers.Dinov2WithRegistersForImageClassification if head
           else transformers.Dinov2WithRegistersModel)
    hf = hf_model(cls, **({"num_labels": 3} if head else {}))
    hf.save_pretrained(tmp_path)
    model = load_hf_dinov2(str(tmp_path), interpolate_pos_encoding=True)
    assert model.vit_config.position_interpolation == "bicubic_antialias"
    rng = np.random.default_rng(3)
    # The native 4 x 4 grid of 4 x 4 patches, then 6 x 8 and 3 x 5 (antialiased).
    for height, width in ((SIZE, SIZE), (24, 32), (12, 20)):
        images = rng.integers(0, 256, (2, height, width, 3)).astype("uint8")
        with torch.no_grad():
            out = hf(pixel_values=hf_pixels(images))
        if head:
            np.testing.assert_allclose(to_numpy(model(images)), out.logits.numpy(), atol=1e-5)
        else:
            np.testing.assert_allclose(hidden_states(model, images),
                                       out.last_hidden_state.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match=r"Received: images.shape=\(2, 18, 16, 3\)"):
        model(rng.integers(0, 256, (2, 18, 16, 3)).astype("uint8"))


@pytest.mark.backend_independent  # refused before any file is read
def test_a_fixed_and_an_any_size_model_at_once_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"Received: image_size=24, interpolate_pos_encoding=True"):
        load_hf_dinov2(str(tmp_path), image_size=24, interpolate_pos_encoding=True)
