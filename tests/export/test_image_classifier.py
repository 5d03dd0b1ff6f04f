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
