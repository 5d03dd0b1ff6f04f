"""A config is valid once it exists: `get_x_config`, `replace_x_config`, the
dataclass itself, the model constructor and the recipe check refuse a bad
field at once, with the same `ValueError`, before a layer is built or any
data loads."""

import copy
import dataclasses
import json
import os

import pytest

from keras_attn import models
from keras_attn.zoo import recipe as recipes

pytestmark = pytest.mark.backend_independent  # configs and recipes: pure Python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# family: (config class, model class, a preset, {field: (bad value, message)})
FAMILIES = {
    "bert": (models.BertConfig, models.BertBackbone, "bert_tiny", {
        "num_heads": (-3, r"Invalid value for argument `num_heads`: it must be a positive "
                          r"integer. Received: num_heads=-3"),
        "dropout": (7.0, r"Invalid value for argument `dropout`: it must be a number in "
                         r"\[0, 1\). Received: dropout=7.0"),
        "activation": ("no_such", r"Received: activation='no_such'"),
    }),
    "vit": (models.ViTConfig, models.ViT, "vit_tiny_16", {
        "pooling": ("max", r"Invalid value for argument `pooling`: it must be one of "
                           r"\['cls', 'cls_gap', 'gap'\]. Received: pooling='max'"),
        "num_classes": (0, r"Received: num_classes=0"),
        "patch_size": (15, r"`patch_size` must divide `image_size`.*Received: image_size=224, "
                           r"patch_size=15"),
    }),
    "transformer": (models.TransformerConfig, models.Transformer, "transformer_base", {
        "pad_id": (37000, r"`pad_id` must be a token id of the vocabulary. Received: "
                          r"pad_id=37000, vocabulary_size=37000"),
        "norm_position": ("middle", r"Received: norm_position='middle'"),
        "activation": ("no_such", r"`activation` must be the name of a Keras activation"),
        "hidden_dim": (510, r"`num_heads` must divide `hidden_dim`. Received: hidden_dim=510, "
                            r"num_heads=8"),
    }),
    "conformer": (models.ConformerConfig, models.ConformerCTC, "conformer_tiny", {
        "vocabulary_size": (0, r"`vocabulary_size` must be a positive integer .*"
                               r"Received: vocabulary_size=0"),
        "time_mask_count": (-1, r"Received: time_mask_count=-1"),
        "freq_mask_width": (41, r"`freq_mask_width` must be at most num_mel_bins=40. "
                                r"Received: freq_mask_width=41"),
    }),
}
CASES = [(family, field) for family, (*_, bad) in FAMILIES.items() for field in bad]


def _api(family):
    return getattr(models, f"get_{family}_config"), getattr(models, f"replace_{family}_config")


@pytest.mark.parametrize("family, field", CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_every_way_to_make_a_config_refuses_a_bad_field_with_the_same_error(family, field):
    config_class, model_class, preset, bad = FAMILIES[family]
    value, message = bad[field]
    get_config, replace_config = _api(family)
    base = get_config(preset)
    extra = {"vocabulary_size": 5} if family == "conformer" and field != "vocabulary_size" else {}
    ways = {
        "get": lambda: get_config(preset, **{field: value}),
        "get from a dict": lambda: get_config({**extra, field: value}),
        "replace": lambda: replace_config(base, **{field: value}),
        "the dataclass": lambda: config_class(**{**dataclasses.asdict(base), field: value}),
        "the constructor": lambda: model_class(**{**dataclasses.asdict(base), **extra, field: value}),
    }
    if family == "conformer" and field == "freq_mask_width":
        ways.pop("get from a dict")  # the class default has 80 bins, the preset 40
    errors = {}
    for way, make in ways.items():
        with pytest.raises(ValueError, match=message) as error:
            make()
        errors[way] = str(error.value)
    assert len(set(errors.values())) == 1, errors


def test_the_example_of_the_issue_is_refused_when_the_config_is_made():
    with pytest.raises(ValueError, match=r"Received: num_heads=-3"):
        models.get_bert_config("bert_tiny", num_heads=-3, dropout=7.0)


def test_checks_between_fields_see_every_override_at_once():
    # 96 / 3 is a valid width and head count; one at a time against the
    # preset (128 / 2) the heads would not divide the width.
    config = models.get_bert_config("bert_tiny", hidden_dim=96, num_heads=3)
    assert (config.hidden_dim, config.num_heads) == (96, 3)
    with pytest.raises(ValueError, match=r"`num_heads` must divide `hidden_dim`. Received: "
                                         r"hidden_dim=128, num_heads=3"):
        models.replace_bert_config(config, hidden_dim=128)


def test_a_conformer_config_may_wait_for_its_vocabulary_but_the_model_may_not():
    config = models.get_conformer_config("conformer_tiny")
    assert config.vocabulary_size is None
    with pytest.raises(ValueError, match=r"Received: vocabulary_size=None"):
        models.ConformerCTC(**dataclasses.asdict(config))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_constructor_refuses_a_keyword_it_does_not_know(family):
    # It used to vanish into `keras.Model`'s keyword arguments.
    _, model_class, _, _ = FAMILIES[family]
    label = {"bert": "BERT", "vit": "ViT", "transformer": "Transformer",
             "conformer": "Conformer"}[family]
    with pytest.raises(ValueError, match=rf"Unknown {label} config field 'hidden_size'; "
                                         rf"valid fields are .* Received: hidden_size=8"):
        model_class(vocabulary_size=5, hidden_size=8) if family == "conformer" else \
            model_class(hidden_size=8)


# === The recipe check makes the config, before any data loads ===


def _recipe(path):
    with open(os.path.join(ROOT, "models", path), encoding="utf-8") as handle:
        return json.load(handle)


def _refused(recipe, overrides):
    with pytest.raises(ValueError) as error:
        recipes.validate_recipe(recipes.apply_overrides(copy.deepcopy(recipe), overrides))
    return str(error.value)


@pytest.mark.parametrize("path, key, value, message", [
    ("bert/bert_tiny_pydoc.json", "num_heads", -3, "it must be a positive integer"),
    ("bert/bert_tiny_pydoc.json", "dropout", 7.0, r"it must be a number in [0, 1)"),
    ("vit/vit_tiny_digits.json", "pooling", "max", "it must be one of ['cls', 'cls_gap', 'gap']"),
    ("transformer/transformer_numbers.json", "norm_position", "middle", "it must be one of"),
    ("conformer/conformer_tiny_digits.json", "time_mask_count", -1,
     "must be a non-negative integer"),
])
def test_the_recipe_check_refuses_what_the_config_refuses(path, key, value, message):
    text = _refused(_recipe(path), [(f"model.overrides.{key}", value)])
    assert f"Recipe key `model.overrides.{key}` is invalid: " in text, text
    assert message in text and f"Received: model.overrides.{key}={value!r}" in text, text


def test_the_recipe_check_takes_fields_that_are_valid_together():
    recipe = recipes.apply_overrides(_recipe("bert/bert_tiny_pydoc.json"),
                                     [("model.overrides.hidden_dim", 96),
                                      ("model.overrides.num_heads", 3)])
    overrides = recipes.validate_recipe(recipe)["model"]["overrides"]
    assert (overrides["hidden_dim"], overrides["num_heads"]) == (96, 3)


def test_the_recipe_check_names_the_override_that_is_wrong():
    recipe = _recipe("bert/bert_tiny_pydoc.json")
    # With the width and heads that fit together, the dropout is the one.
    text = _refused(recipe, [("model.overrides.hidden_dim", 96),
                             ("model.overrides.num_heads", 3),
                             ("model.overrides.dropout", 7.0)])
    assert "`model.overrides.dropout` is invalid" in text and "=7.0" in text, text
    # Heads that divide neither the preset's width nor the new one.
    text = _refused(recipe, [("model.overrides.hidden_dim", 100),
                             ("model.overrides.num_heads", 3)])
    assert "`model.overrides.num_heads` is invalid: `num_heads` must divide" in text, text
