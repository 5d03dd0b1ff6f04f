"""`remat=True` (gradient checkpointing of the blocks) in the four families:
a training-memory option, not architecture. The same weights give the same
outputs, gradients and state updates; the flag survives `get_config` and
`.keras` files; builders and recipes take it as a config field."""

import os

import keras
import numpy as np
import pytest
from keras import ops

from _families import FAMILIES
from _families import NAMES
from keras_attn.models.bert import BertBackbone
from keras_attn.models.vit import ViT
from keras_attn.zoo import recipe as recipes
from test_case import assert_all_close
from test_case import to_numpy
from test_case import training_step_results

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

# The table's tiny models with dropout on (the seeds must replay in the
# recomputation), two blocks of each kind: the BERT backbone; the ViT without
# its classifier, whose zero-initialised head would zero every other gradient.
OVERRIDES = {
    "bert": dict(dropout=0.1),
    "vit": dict(num_classes=None, dropout=0.1),
    "transformer": dict(num_encoder_layers=2, num_decoder_layers=2),
    "conformer": dict(freq_mask_width=4),
    "modernbert": dict(dropout=0.1),
}
INPUTS = {family: FAMILIES[family].inputs(size=2, **OVERRIDES[family]) for family in NAMES}


def _build(family, **kw):
    return FAMILIES[family].backbone(**OVERRIDES[family], **kw)


BLOCKS = {
    "bert": ["transformer_block_0", "transformer_block_1"],
    "vit": ["transformer_block_0", "transformer_block_1"],
    "transformer": ["encoder_block_0", "encoder_block_1", "decoder_block_0", "decoder_block_1"],
    "conformer": ["conformer_block_0", "conformer_block_1"],
    "modernbert": ["transformer_block_0", "transformer_block_1"],
}


def build(family, remat, seed=3):
    """The family's tiny model; the same seed gives the same weights and
    dropout / SpecAugment seeds with and without remat."""
    keras.utils.set_random_seed(seed)
    return _build(family, remat=remat)


def mean_square(outputs):
    return sum(ops.mean(ops.square(ops.cast(o, "float32"))) for o in keras.tree.flatten(outputs))


@pytest.mark.parametrize("family", NAMES)
def test_remat_gives_the_same_outputs_gradients_and_state(family):
    plain, remat = build(family, remat=False), build(family, remat=True)
    remat.set_weights(plain.get_weights())
    inputs = INPUTS[family]
    outputs, grads, state = training_step_results(plain, inputs, mean_square)
    remat_outputs, remat_grads, remat_state = training_step_results(remat, inputs, mean_square)
    assert_all_close(outputs, remat_outputs, 1e-5, "output")
    assert_all_close(grads, remat_grads, 1e-5, "gradient")
    assert_all_close(state, remat_state, 1e-5, "state")
    assert sum(np.abs(g).max() > 0 for g in grads) > len(grads) // 2


@pytest.mark.parametrize("family", NAMES)
def test_remat_survives_config_and_keras_file(family, tmp_path):
    model = build(family, remat=True)
    inputs = INPUTS[family]
    assert model.get_config()["remat"] is True
    clone = model.__class__.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    path = str(tmp_path / f"{family}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.get_config()["remat"] is True
    assert_all_close(
        [to_numpy(o) for o in keras.tree.flatten(model(inputs))],
        [to_numpy(o) for o in keras.tree.flatten(reloaded(inputs))],
        1e-5,
        "output",
    )
    # Each block of the reloaded model is made inside the RematScope again,
    # listed by name (tests/layers/test_remat.py shows, in the JAX pass of
    # CI, that a listed block is one checkpoint in the program and its
    # sublayers none).
    for name in BLOCKS[family]:
        assert name in reloaded.get_layer(name)._remat_mode.layer_names
        assert model.get_layer(name)._remat_mode.layer_names == reloaded.get_layer(
            name)._remat_mode.layer_names


@pytest.mark.parametrize("value", [1, "true", None])
@pytest.mark.parametrize("family", NAMES)
def test_remat_must_be_a_bool(family, value):
    with pytest.raises(ValueError, match=rf"argument `remat`: it must be True or False\. Received: remat={value!r}"):
        _build(family, remat=value)


def test_constructors_take_remat_and_default_to_off():
    assert FAMILIES["bert"].backbone(num_layers=1).bert_config.remat is False
    assert BertBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                        intermediate_dim=16, remat=True).bert_config.remat is True
    assert ViT(image_size=8, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2,
               intermediate_dim=16, remat=True).get_config()["remat"] is True


def test_recipe_override_sets_remat():
    path = os.path.join(ROOT, "models", "vit", "vit_tiny_digits.json")
    resolved = recipes.load_recipe(path, ["model.overrides.remat=true"])
    assert resolved["model"]["overrides"]["remat"] is True
    with pytest.raises(ValueError, match=r"model\.overrides\.remat.*Received: model\.overrides\.remat='yes'"):
        recipes.load_recipe(path, ["model.overrides.remat=yes"])
