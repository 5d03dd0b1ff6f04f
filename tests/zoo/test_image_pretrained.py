"""image_classification's `training.pretrained`: a Hugging Face ViT
directory (a tiny one transformers saves, with its image processor)
fine-tuned by `keras-attn train` on a `files:` image folder: the model
starts from the checkpoint's encoder at its image size with its processor's
normalisation, the export carries the folder's class names and serves
transformers' answers on the same pixels; a model section that contradicts
the checkpoint and a directory of another family are refused by name."""

import json

import numpy as np
import pytest

import keras_attn.cli as cli
from _tiny import recipe_path
from _tiny import tiny_overrides
from _tiny import train_from_checkpoint
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

SIZE = 16
CLASSES = ["cats", "dogs"]  # folder names: sorted, the class ids
# The tiny recipe's run keys, without its model overrides (the checkpoint's).
RUN = [o for o in tiny_overrides("vit_tiny_digits") if not o.startswith(("data.", "model."))] + [
    "training.batch_size=4"]


def vit_directory(tmp_path):
    """A `ViTModel` directory (no head) with a processor whose statistics are
    not the defaults."""
    import transformers

    config = transformers.ViTConfig(image_size=SIZE, patch_size=4, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32)
    directory = tmp_path / "vit"
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(str(directory))
    transformers.ViTImageProcessor(size={"height": SIZE, "width": SIZE},
                                   image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3]
                                   ).save_pretrained(str(directory))
    return directory


def image_folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = tmp_path / "pets"
    for split, count in (("train", 6), ("test", 2)):
        for index, name in enumerate(CLASSES):
            (folder / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 128, (20, 24, 3)) + 120 * index  # dogs brighter
                Image.fromarray(pixels.astype("uint8")).save(folder / split / name / f"{i}.png")
    return folder


def recipe(tmp_path, folder):
    with open(recipe_path("vit_tiny_digits"), encoding="utf-8") as handle:
        data = json.load(handle)
    data["data"] = {"dataset": f"files:{folder}", "validation_fraction": 0.0}
    data["model"]["overrides"] = {}
    for key in ("expected", "$schema"):
        data.pop(key, None)
    path = tmp_path / "vit_tiny_digits.json"  # a recipe file is named as the recipe
    path.write_text(json.dumps(data))
    return str(path)


def test_keras_attn_train_fine_tunes_a_hugging_face_vit_on_an_image_folder(tmp_path,
                                                                          monkeypatch):
    import keras
    import torch
    import transformers
    from safetensors.numpy import load_file

    from keras_attn.export import Artifact

    directory, folder = vit_directory(tmp_path), image_folder(tmp_path)
    path = recipe(tmp_path, folder)
    run = tmp_path / "run"
    task, kernel = train_from_checkpoint(
        monkeypatch, path, run, RUN + [f"training.pretrained={directory}"],
        lambda model: keras.ops.convert_to_numpy(model.get_layer("patch_embedding").weights[0]))
    assert (run / "labels.txt").read_text().split() == CLASSES
    # The checkpoint's patch projection (torch's (D, C, p, p) as Keras's
    # (p, p, C, D)), at its image size, with its processor's statistics.
    hf = load_file(str(directory / "model.safetensors"))
    np.testing.assert_array_equal(
        kernel, hf["embeddings.patch_embeddings.projection.weight"].transpose(2, 3, 1, 0))
    config = task.model_config
    assert config.image_size == SIZE and config.num_classes == 2
    np.testing.assert_allclose(config.pixel_mean, [102.0, 127.5, 153.0], rtol=1e-6)

    # The run's model in its exports: ONNX with the class names, and a
    # Hugging Face directory whose ViTForImageClassification, fed its own
    # processor's pixels, gives the same logits (the normalisation travels).
    model = keras.saving.load_model(str(run / "model.keras"))
    assert model.class_names == CLASSES
    images = np.random.default_rng(1).integers(0, 256, (3, SIZE, SIZE, 3)).astype("uint8")
    logits = keras.ops.convert_to_numpy(model(images, training=False))
    assert cli.main(["export", str(run), "--format", "onnx", "--output",
                     str(tmp_path / "onnx")]) == 0
    served = Artifact(str(tmp_path / "onnx"))
    assert served.labels == CLASSES
    np.testing.assert_allclose(served(images=images)["probabilities"],
                               keras.ops.convert_to_numpy(keras.ops.softmax(logits)),
                               atol=1e-5)
    assert cli.main(["export", str(run), "--format", "hf", "--output",
                     str(tmp_path / "hf")]) == 0
    theirs = transformers.ViTForImageClassification.from_pretrained(str(tmp_path / "hf"))
    assert [theirs.config.id2label[i] for i in range(2)] == CLASSES
    pixels = transformers.ViTImageProcessor.from_pretrained(str(directory))(
        list(images), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        np.testing.assert_allclose(theirs(pixels).logits.numpy(), logits, atol=1e-4)

    # Refused by name: the sizes are the checkpoint's; another family's directory.
    with pytest.raises(ValueError, match=r"^Recipe key `model.overrides` must be empty with "
                                         r"training.pretrained"):
        make_task(load_recipe(path, [f"training.pretrained={directory}",
                                     "model.overrides.num_layers=2"])).prepare()
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bert / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"model_type 'bert'.*fine-tunes vit or "
                                         r"dinov2_with_registers"):
        make_task(load_recipe(path, [f"training.pretrained={bert}"])).prepare()
