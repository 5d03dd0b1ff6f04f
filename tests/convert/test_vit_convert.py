import numpy as np
import pytest

from keras_attn.convert.vit import load_hf_vit
from keras_attn.convert.vit import vit_config_from_hf
from test_case import to_numpy

# torch and transformers are imported where used: collecting this module
# (in every pytest worker of every pass) does not import them.
pytestmark = pytest.mark.large


def hf_config(**overrides):
    import transformers
    # Non-default image and patch sizes, and a grey image: every shape differs.
    fields = dict(
        image_size=30, patch_size=6, num_channels=2, hidden_size=16,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    fields.update(overrides)
    return transformers.ViTConfig(**fields)


def random_hf(cls, config):
    import torch
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # non-trivial values everywhere, cls token included
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    return model


def pixels(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (3, 30, 30, 2)).astype("uint8")


def hf_inputs(images):
    import torch
    normalized = images.astype("float32") / 127.5 - 1.0
    return torch.from_numpy(normalized.transpose(0, 3, 1, 2).copy())


def test_classifier_logits_match(tmp_path):
    import torch
    import transformers
    config = hf_config(num_labels=5)
    hf = random_hf(transformers.ViTForImageClassification, config)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_vit(str(tmp_path))
    assert model.vit_config.layer_norm_epsilon == 1e-12
    images = pixels()
    with torch.no_grad():
        expected = hf(pixel_values=hf_inputs(images)).logits.numpy()
    got = to_numpy(model(images))
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_backbone_cls_output_matches(tmp_path):
    import torch
    import transformers
    hf = random_hf(transformers.ViTModel, hf_config())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_vit(str(tmp_path))
    assert model.vit_config.num_classes is None
    images = pixels(1)
    with torch.no_grad():
        expected = hf(pixel_values=hf_inputs(images)).last_hidden_state[:, 0].numpy()
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4)


@pytest.mark.backend_independent
def test_unsupported_activation_is_rejected():
    with pytest.raises(ValueError, match=r"Received: hidden_act='relu'"):
        vit_config_from_hf(hf_config(hidden_act="relu").to_dict())


@pytest.mark.backend_independent
def test_checkpoint_that_does_not_match_its_config(tmp_path):
    """A config.json that disagrees with the tensors fails naming a tensor."""
    import json

    import transformers

    hf = random_hf(transformers.ViTModel, hf_config())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    config["intermediate_size"] = 32  # the checkpoint's MLP is 24 wide
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'encoder.layer.0.intermediate.dense.weight' has shape \(24, 16\) but config.json implies \(32, 16\)"):
        load_hf_vit(str(tmp_path))


@pytest.mark.backend_independent
def test_checkpoint_missing_a_tensor(tmp_path):
    import transformers
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    hf = random_hf(transformers.ViTModel, hf_config())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    missing = [k for k in tensors if "layernorm_before" in k][0]
    del tensors[missing]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"has no tensor '{missing}'"):
        load_hf_vit(str(tmp_path))


IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
# Each a processor whose pixels differ from the default [-1, 1].
PROCESSORS = {
    "imagenet": dict(image_mean=IMAGENET[0], image_std=IMAGENET[1]),
    "no_normalize": dict(do_normalize=False),
    "no_rescale": dict(do_rescale=False, rescale_factor=0.5,
                       image_mean=[100.0, 120.0, 140.0], image_std=[60.0, 50.0, 70.0]),
}


@pytest.mark.parametrize("processor", list(PROCESSORS.values()), ids=list(PROCESSORS))
def test_logits_follow_the_image_processor(tmp_path, processor):
    """keras_attn on raw uint8 images = transformers' processor + model, and
    save_hf_vit writes a processor that gives transformers the same pixels."""
    import torch
    import transformers
    from keras_attn.convert import save_hf_vit
    hf = random_hf(transformers.ViTForImageClassification,
                   hf_config(num_labels=5, num_channels=3))
    hf.save_pretrained(tmp_path / "hf")
    transformers.ViTImageProcessor(size={"height": 30, "width": 30},
                                   **processor).save_pretrained(tmp_path / "hf")
    images = np.random.default_rng(2).integers(0, 256, (3, 30, 30, 3)).astype("uint8")
    hf_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    inputs = hf_processor(list(images), return_tensors="pt")
    with torch.no_grad():
        expected = hf(**inputs).logits.numpy()
    model = load_hf_vit(str(tmp_path / "hf"))
    got = to_numpy(model(images))
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    save_hf_vit(model, tmp_path / "out")
    again = transformers.ViTForImageClassification.from_pretrained(tmp_path / "out").eval()
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        written = again(**processor(list(images), return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(written, got, atol=1e-4)


REFUSED = [  # (fields, the message's "Received: ..."), by key
    ({"image_processor_type": "CLIPImageProcessor"},
     r"image_processor_type='CLIPImageProcessor'"),
    ({"image_std": [0.5, 0.0, 0.5]}, r"image_std=\[0.5, 0.0, 0.5\]"),
    ({"image_mean": [0.5, 0.5]}, r"image_mean=\[0.5, 0.5\]"),
    ({"rescale_factor": 0}, r"rescale_factor=0"),
    ({"do_normalize": "yes"}, r"do_normalize='yes'"),
    ({"size": {"height": 60, "width": 60}}, r"size=\{'height': 60, 'width': 60\}"),
    ({"size": {"height": 30, "width": 24}}, r"size=\{'height': 30, 'width': 24\}"),
]


@pytest.mark.backend_independent  # refused before any weight is read
@pytest.mark.parametrize("fields,received", REFUSED, ids=[
    "type", "std_zero", "mean_per_channel", "rescale_factor", "do_normalize", "size",
    "not_square"])
def test_an_image_processor_the_model_cannot_follow_is_refused(tmp_path, fields, received):
    import json
    (tmp_path / "config.json").write_text(json.dumps(hf_config(num_channels=3).to_dict()))
    processor = dict({"image_processor_type": "ViTImageProcessor",
                      "size": {"height": 30, "width": 30}}, **fields)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(ValueError, match=r"preprocessor_config.json: .*Received: " + received):
        load_hf_vit(str(tmp_path))


@pytest.mark.parametrize("head", [False, True], ids=["ViTModel", "ViTForImageClassification"])
def test_any_size_matches_interpolate_pos_encoding(tmp_path, head):
    """`interpolate_pos_encoding=True`: one model for every size the patch
    divides, as transformers' with `interpolate_pos_encoding=True`."""
    import keras
    import torch
    import transformers
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    hf = random_hf(cls, hf_config(num_labels=5) if head else hf_config())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_vit(str(tmp_path), interpolate_pos_encoding=True)
    assert model.vit_config.position_interpolation == "bicubic"
    out = model if head else keras.Model(model.input, model.get_layer("final_layer_norm").output)
    rng = np.random.default_rng(2)
    # The native 5 x 5 grid of 6 x 6 patches, then 7 x 9 and 3 x 5.
    for height, width in ((30, 30), (42, 54), (18, 30)):
        images = rng.integers(0, 256, (2, height, width, 2)).astype("uint8")
        with torch.no_grad():
            hf_out = hf(pixel_values=hf_inputs(images), interpolate_pos_encoding=True)
        expected = (hf_out.logits if head else hf_out.last_hidden_state).numpy()
        np.testing.assert_allclose(to_numpy(out(images)), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"patch size 6 must divide .*"
                                         r"Received: images.shape=\(2, 30, 32, 2\)"):
        model(rng.integers(0, 256, (2, 30, 32, 2)).astype("uint8"))


@pytest.mark.backend_independent
def test_interpolate_pos_encoding_must_be_a_flag(tmp_path):
    with pytest.raises(ValueError, match=r"Received: interpolate_pos_encoding='yes'"):
        load_hf_vit(str(tmp_path), interpolate_pos_encoding="yes")
