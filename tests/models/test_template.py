"""The families follow one template (keras_attn/models/_config.py): the
same names, defaults, lookups and argument errors in each."""

import dataclasses
import inspect

import pytest

from _families import FAMILIES as TABLE
from keras_attn import models

# family: (config class, presets, a tiny override set that builds fast), from
# the one table of tiny models (tests/_families.py).
FAMILIES = {
    name: (type(family.config()), getattr(models, f"{name.upper()}_PRESETS"), family.tiny)
    for name, family in TABLE.items()
}
DEFAULTS = {"bert": "bert_base", "vit": "vit_base_16", "transformer": "transformer_base",
            "conformer": "conformer_small", "modernbert": "modernbert_base"}


def _api(family):
    return (getattr(models, f"get_{family}_config"), getattr(models, f"replace_{family}_config"),
            getattr(models, f"build_{family}"))


@pytest.mark.parametrize("family", FAMILIES)
def test_configs_are_frozen_dataclasses_and_presets_are_instances(family):
    config_class, presets, _ = FAMILIES[family]
    assert dataclasses.is_dataclass(config_class)
    assert config_class.__dataclass_params__.frozen
    assert presets and all(isinstance(p, config_class) for p in presets.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_getter_and_builder_share_the_default_preset(family):
    get_config, _, build = _api(family)
    _, presets, _ = FAMILIES[family]
    for function in (get_config, build):
        assert inspect.signature(function).parameters["config"].default == DEFAULTS[family]
    assert get_config() == presets[DEFAULTS[family]]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_config_a_preset_name_and_a_dict_give_the_same_config(family):
    get_config, replace_config, _ = _api(family)
    config_class, presets, tiny = FAMILIES[family]
    name = sorted(presets)[0]
    from_name = get_config(name, **tiny)
    assert from_name == replace_config(presets[name], **tiny)
    assert get_config(from_name) == from_name
    assert get_config(dataclasses.asdict(from_name)) == from_name
    assert get_config(from_name, dropout=0.0).dropout == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_the_builder_applies_overrides(family):
    get_config, _, build = _api(family)
    _, presets, tiny = FAMILIES[family]
    model = build(sorted(presets)[0], **tiny)
    assert getattr(model, f"{family}_config") == get_config(sorted(presets)[0], **tiny)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_same_errors_in_every_family(family):
    get_config, replace_config, build = _api(family)
    config_class, presets, tiny = FAMILIES[family]
    label = {"bert": "BERT", "vit": "ViT", "transformer": "Transformer",
             "conformer": "Conformer", "modernbert": "ModernBERT"}[family]
    name = sorted(presets)[0]
    with pytest.raises(ValueError, match=rf"Unknown {label} preset 'nope'; valid presets are "
                                         rf".* Received: config='nope'"):
        get_config("nope")
    with pytest.raises(ValueError, match=rf"Unknown {label} config field 'width'; valid "
                                         rf"fields are .* Received: width=3"):
        get_config(name, width=3)
    with pytest.raises(ValueError, match=rf"Unknown {label} config field 'width'"):
        replace_config(presets[name], width=3)
    with pytest.raises(ValueError, match=rf"`config` must be a {config_class.__name__}, a "
                                         rf"preset name or a dict. Received: config=3"):
        get_config(3)
    bad = {
        "dropout": (1.5, r"argument `dropout`: it must be a number in \[0, 1\). Received: dropout=1.5"),
        "num_heads": (0, r"argument `num_heads`: it must be a positive integer. Received: num_heads=0"),
        "remat": (1, r"argument `remat`: it must be True or False. Received: remat=1"),
        "layer_norm_epsilon": (0.0, r"argument `layer_norm_epsilon`: it must be a positive number. "
                                    r"Received: layer_norm_epsilon=0.0"),
    }
    for field, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            build(name, **{**tiny, field: value})
    with pytest.raises(ValueError, match=r"`num_heads` must divide `hidden_dim`. Received: "
                                         r"hidden_dim=10, num_heads=3"):
        build(name, **{**tiny, "hidden_dim": 10, "num_heads": 3})


MODELS = {"bert": models.BertBackbone, "vit": models.ViT, "transformer": models.Transformer,
          "conformer": models.ConformerCTC, "modernbert": models.ModernBertBackbone}
# A model's own arguments that are not architecture (after `dtype`, default None).
OWN = {"vit": ["class_names"]}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_constructor_takes_the_config_fields_with_the_config_defaults(family):
    config_class, _, _ = FAMILIES[family]
    parameters = list(inspect.signature(MODELS[family]).parameters.values())
    fields = [(field.name, field.default) for field in dataclasses.fields(config_class)]
    assert [(p.name, p.default) for p in parameters[:len(fields)]] == fields
    assert [(p.name, p.default, p.kind) for p in parameters[len(fields):]] == [
        (name, None, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ["dtype"] + OWN.get(family, [])] + [
        ("kwargs", inspect.Parameter.empty, inspect.Parameter.VAR_KEYWORD)]
    # Keras reads the same signature from `__init__` (auto-config, get_config checks).
    assert list(inspect.signature(MODELS[family].__init__).parameters)[1:] == [
        p.name for p in parameters]


@pytest.mark.parametrize("family", FAMILIES)
def test_get_config_is_the_config_fields_and_from_config_rebuilds_them(family):
    _, presets, tiny = FAMILIES[family]
    get_config, _, _ = _api(family)
    expected = get_config(sorted(presets)[0], **tiny, dropout=0.0)
    model = MODELS[family](**dataclasses.asdict(expected), name="tiny")
    config = model.get_config()
    assert sorted(config) == sorted({"name", "trainable", "dtype", *OWN.get(family, [])}
                                    | {f.name for f in dataclasses.fields(expected)})
    assert {key: config[key] for key in dataclasses.asdict(expected)} == \
        dataclasses.asdict(expected)
    assert (config["name"], config["trainable"]) == ("tiny", True)
    revived = type(model).from_config(config)
    assert getattr(revived, f"{family}_config") == expected
    assert revived.get_config() == config
    assert revived.count_params() == model.count_params()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_constructor_takes_fields_by_keyword_or_in_field_order(family):
    config_class, presets, tiny = FAMILIES[family]
    get_config, _, _ = _api(family)
    config = get_config(sorted(presets)[0], **tiny)
    values = dataclasses.asdict(config)
    by_keyword = MODELS[family](**values)
    by_position = MODELS[family](*values.values())
    for model in (by_keyword, by_position):
        assert getattr(model, f"{family}_config") == config
