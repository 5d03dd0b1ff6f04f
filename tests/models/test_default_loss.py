"""The loss a family model is compiled with: the ViT classifier's default,
and a loss that reads probabilities refused on every model whose outputs are
logits (such a pair trains nothing, yet `fit` exits as usual)."""

import re

import keras
import numpy as np
import pytest

from _families import FAMILIES
from _families import NAMES
from keras_attn.models import BertPretrainer
from keras_attn.training import LabelSmoothedCrossEntropy

PROBABILITY_LOSSES = {
    "string sparse": ("sparse_categorical_crossentropy", "'sparse_categorical_crossentropy'"),
    "string categorical": ("categorical_crossentropy", "'categorical_crossentropy'"),
    "string binary": ("binary_crossentropy", "'binary_crossentropy'"),
    "object sparse": (lambda: keras.losses.SparseCategoricalCrossentropy(),
                      "SparseCategoricalCrossentropy(from_logits=False)"),
    "object categorical": (lambda: keras.losses.CategoricalCrossentropy(from_logits=False),
                           "CategoricalCrossentropy(from_logits=False)"),
    "object binary": (lambda: keras.losses.BinaryCrossentropy(),
                      "BinaryCrossentropy(from_logits=False)"),
    "function sparse": (lambda: keras.losses.sparse_categorical_crossentropy,
                        "sparse_categorical_crossentropy"),
}


def _loss(entry):
    loss = entry[0]
    return loss() if callable(loss) and not isinstance(loss, str) else loss


@pytest.fixture(scope="module")
def models():
    return {name: family.build() for name, family in FAMILIES.items()}


def _vit_classifier(num_classes=3):
    return FAMILIES["vit"].build(num_layers=1, num_classes=num_classes)


def test_vit_default_loss_trains():
    model = _vit_classifier()
    model.compile(optimizer="adam")
    assert isinstance(model.loss, keras.losses.SparseCategoricalCrossentropy)
    assert model.loss.get_config()["from_logits"] is True
    images = np.random.default_rng(0).integers(0, 256, (8, 16, 16, 3)).astype("uint8")
    labels = np.arange(8) % 3
    before = model.evaluate(images, labels, verbose=0, return_dict=True)
    history = model.fit(images, labels, batch_size=8, epochs=5, verbose=0).history
    after = model.evaluate(images, labels, verbose=0, return_dict=True)
    # The zero head starts at uniform predictions: log(3).
    np.testing.assert_allclose(before["loss"], np.log(3), rtol=1e-5)
    assert after["loss"] < before["loss"] - 0.02, (before, after)
    assert history["loss"][-1] < history["loss"][0]
    assert "accuracy" in history and "accuracy" in after


def test_vit_backbone_has_no_default_loss():
    backbone = _vit_classifier(num_classes=None)
    assert not backbone.outputs_are_logits()
    backbone.compile(optimizer="adam")
    assert backbone.loss is None
    # Its outputs are features, not logits: any loss is the caller's choice.
    backbone.compile(optimizer="adam", loss="mse")


@pytest.mark.parametrize("loss", sorted(PROBABILITY_LOSSES))
@pytest.mark.parametrize("family", NAMES)
def test_probability_loss_on_logits_is_refused(models, family, loss):
    model = models[family]
    assert model.outputs_are_logits()
    entry = PROBABILITY_LOSSES[loss]
    with pytest.raises(ValueError, match=re.escape(f"`loss={entry[1]}` expects probabilities")
                       ) as error:
        model.compile(optimizer="adam", loss=_loss(entry))
    assert "from_logits=True" in str(error.value)
    assert getattr(model, "optimizer", None) is None  # nothing was compiled


@pytest.mark.parametrize("family", NAMES)
def test_positional_loss_is_refused_too(models, family):
    with pytest.raises(ValueError, match="`loss='sparse_categorical_crossentropy'`"):
        models[family].compile("adam", "sparse_categorical_crossentropy")


@pytest.mark.parametrize("family", NAMES)
def test_logits_losses_are_accepted(family):
    model = FAMILIES[family].build()
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert model.optimizer is not None


def test_per_output_losses_are_each_checked():
    backbone = FAMILIES["bert"].backbone()
    pretrainer = BertPretrainer(backbone)
    logits_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(ValueError, match="`loss='sparse_categorical_crossentropy'`"):
        pretrainer.compile(optimizer="adam", loss={"mlm": logits_loss,
                                                   "nsp": "sparse_categorical_crossentropy"})
    with pytest.raises(ValueError, match=re.escape("`loss='binary_crossentropy'`")):
        pretrainer.compile(optimizer="adam", loss=[logits_loss, "binary_crossentropy"])
    pretrainer.compile(optimizer="adam")  # the default: both from logits
    assert pretrainer.optimizer is not None
    # The backbone's outputs are features: not refused.
    assert not backbone.outputs_are_logits()


def test_label_smoothed_loss_on_probabilities_is_refused(models):
    loss = LabelSmoothedCrossEntropy(0.1, from_logits=False)
    with pytest.raises(ValueError, match=re.escape(
            "`loss=LabelSmoothedCrossEntropy(from_logits=False)` expects probabilities")):
        models["transformer"].compile(optimizer="adam", loss=loss)


def test_reloaded_vit_keeps_its_default_loss(tmp_path):
    model = _vit_classifier()
    model.compile(optimizer="adam")
    path = str(tmp_path / "vit.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    assert again.loss.get_config()["from_logits"] is True
