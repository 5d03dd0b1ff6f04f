import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from keras import ops

from keras_attn.export.image_classifier import export_image_classifier
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit

pytestmark = [pytest.mark.tf_only, pytest.mark.large]

TINY = ViTConfig(
    image_size=24, patch_size=8, num_channels=2, hidden_dim=16, num_layers=2,
    num_heads=2, intermediate_dim=32, num_classes=5,
)

RELOAD = """
import sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
images = np.load(sys.argv[2])
np.save(sys.argv[3], loaded.serve(tf.constant(images)).numpy())
"""


def test_saved_model_serves_uint8_and_matches_in_memory(tmp_path):
    model = build_vit(TINY)
    images = np.random.default_rng(0).integers(0, 256, (3, 24, 24, 2)).astype("uint8")
    # Not a uniform output (the zero head would give one): perturb the head.
    head = model.get_layer("classifier")
    head.kernel.assign(np.random.default_rng(1).normal(size=head.kernel.shape))
    expected = ops.convert_to_numpy(ops.softmax(model(images), axis=-1))
    assert expected.std() > 1e-3

    export_image_classifier(model, tmp_path / "saved")
    np.save(tmp_path / "images.npy", images)
    # A fresh interpreter: nothing of keras_attn or Keras is needed to serve.
    subprocess.run(
        [sys.executable, "-c", RELOAD, str(tmp_path / "saved"),
         str(tmp_path / "images.npy"), str(tmp_path / "probs.npy")],
        check=True, timeout=120,
    )
    got = np.load(tmp_path / "probs.npy")
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_backbone_without_head_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"Received: num_classes=None"):
        export_image_classifier(build_vit(dataclasses.replace(TINY, num_classes=None)), tmp_path / "x")


def test_model_returning_a_sequence_is_rejected(tmp_path):
    import keras

    inputs = keras.Input((4, 4, 1))
    model = keras.Model(inputs, keras.layers.Reshape((16, 1))(inputs))
    with pytest.raises(ValueError, match=r"Received: model.output_shape=\(None, 16, 1\)"):
        export_image_classifier(model, tmp_path / "x")


def test_the_class_names_travel_inside_every_export(tmp_path):
    # A copy of the export folder names its answers (labels.txt lived only in
    # the run directory): assets/labels.txt of the SavedModel, "labels" of
    # serving.json, line / entry i naming probability i.
    import shutil

    import tensorflow as tf

    from keras_attn.export.portable import Artifact

    model = build_vit(dataclasses.replace(TINY, num_layers=1))
    head = model.get_layer("classifier")  # not the zero head's uniform answer
    head.kernel.assign(np.random.default_rng(1).normal(size=head.kernel.shape))
    names = ["cat", "dog", "fox", "owl", "yak"]
    export_image_classifier(model, tmp_path / "saved", class_names=names)
    assert (tmp_path / "saved" / "assets" / "labels.txt").read_text() == "cat\ndog\nfox\nowl\nyak\n"
    # TensorFlow Serving's signature answers by name ({'output_0': ...} before);
    # `serve` still returns the probabilities alone.
    images = np.random.default_rng(0).integers(0, 256, (3, 24, 24, 2)).astype("uint8")
    logits = ops.convert_to_numpy(model(images))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    answer = loaded.signatures["serving_default"](images=tf.constant(images))
    assert sorted(answer) == ["label", "logits", "probabilities"]
    np.testing.assert_allclose(answer["logits"].numpy(), logits, atol=1e-5)
    np.testing.assert_allclose(answer["probabilities"].numpy(), loaded.serve(images).numpy(),
                               atol=1e-6)
    assert [x.decode() for x in answer["label"].numpy()] == [names[i] for i in
                                                               logits.argmax(-1)]
    export_image_classifier(model, tmp_path / "onnx", format="onnx", class_names=tuple(names))
    shutil.copytree(tmp_path / "onnx", tmp_path / "copy")
    assert Artifact(tmp_path / "copy").labels == names
    export_image_classifier(model, tmp_path / "plain", format="onnx")  # none given: none kept
    assert Artifact(tmp_path / "plain").labels is None

    for bad in (names[:4], names[:4] + ["cat"], names[:4] + [""], names[:4] + ["a\nb"], "cat"):
        with pytest.raises(ValueError, match=r"`class_names`: it must be a list of the model's 5 "
                                             r"classes.*Received: class_names="):
            export_image_classifier(model, tmp_path / "bad", class_names=bad)
    assert not (tmp_path / "bad").exists()


def test_a_row_answered_nan_is_labelled_empty_never_a_class():
    # Bad input where nothing raises (a BERT row of padding only) makes the
    # logits NaN; argmax named a class for it.
    import tensorflow as tf

    from keras_attn.export.saved_model import named_outputs

    nan = float("nan")
    answer = named_outputs(tf.constant([[0.0, 1.0, 2.0], [nan, nan, nan]]), ["a", "b", "c"])
    assert [x.decode() for x in answer["label"].numpy()] == ["c", ""]
