"""The template every model family follows, and its shared code.

Each family `x` has, with the same names and behaviour:

- `XConfig`: a frozen dataclass (a `ModelConfig`) whose fields are the
  model's constructor arguments (architecture only: training settings such
  as label smoothing belong to `compile` or the recipe), each declared once
  with its default and its check (`field(default, check)`);
- `X_PRESETS`: name -> `XConfig`, each with its source and parameter count;
- `get_x_config(config=<default preset>, **overrides)`: a config from an
  `XConfig`, a preset name or a dict of fields, with `overrides` applied;
- `replace_x_config(config, **overrides)`: `dataclasses.replace` whose error
  names an unknown field;
- the model class, whose `__init__` is wrapped by `config_arguments`: it
  takes the config's fields as keyword arguments with the config's
  defaults, as keras-hub's backbones take theirs;
- `build_x(config=<default preset>, **overrides)`: the model.

A config is checked when it is made (`ModelConfig.__post_init__`), with the
messages of `keras_attn._checks`: a preset with a bad override is a
`ValueError` from `get_x_config`, `replace_x_config`, the recipe check or the
constructor alike, before any data loads or any layer is built.
"""

import dataclasses
import functools
import inspect

from keras_attn._checks import check_bool
from keras_attn._checks import check_choice
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate

# Fields that left a config, with where they went: asked for, they are a
# `ValueError` that says so; read from a file saved before, they are dropped
# (`ConfigModel.from_config`).
MOVED_FIELDS = {
    "label_smoothing": "a training setting: `Transformer.compile(label_smoothing=...)` "
                       "or the recipe key `training.label_smoothing`",
}


# === Fields declared once, checked when a config is made ===


def field(default, check):
    """A config field: its default and `check(name, value)`, which raises a
    `ValueError` in the house form for a value the field does not take."""
    return dataclasses.field(default=default, metadata={"check": check})


positive_int = check_positive_int
optional_positive_int = functools.partial(check_positive_int, allow_none=True)
rate = check_rate
positive_float = check_positive_float
flag = check_bool


def one_of(choices):
    """The check of a field that takes one of `choices`."""
    return functools.partial(check_choice, choices=choices)


class ModelConfig:
    """The base of the families' frozen config dataclasses: a config is
    valid once it exists. `__post_init__` runs each field's own check (see
    `field`), then `check_relations`, the family's checks between fields."""

    def __post_init__(self):
        for config_field in dataclasses.fields(self):
            check = config_field.metadata.get("check")
            if check is not None:
                check(config_field.name, getattr(self, config_field.name))
        self.check_relations()

    def check_relations(self):
        """Raises `ValueError` for fields that do not fit together."""


def activation_name(name, value):
    """A config field holding an activation by name (the name is what the
    config saves): a string `get_activation` knows."""
    from keras_attn._checks import get_activation

    if not isinstance(value, str):
        raise ValueError(
            f"`{name}` must be the name of an activation (it is saved in the config). "
            f"Received: {name}={value!r}"
        )
    get_activation(name, value)


def check_heads_divide(config):
    """The heads split the width: `num_heads` divides `hidden_dim`."""
    if config.hidden_dim % config.num_heads:
        raise ValueError(
            "`num_heads` must divide `hidden_dim`. Received: "
            f"hidden_dim={config.hidden_dim}, num_heads={config.num_heads}"
        )


def _refuse_unknown(config_class, family, values):
    names = {config_field.name for config_field in dataclasses.fields(config_class)}
    for key, value in values.items():
        if key not in names:
            moved = f" (it is now {MOVED_FIELDS[key]})" if key in MOVED_FIELDS else ""
            raise ValueError(
                f"Unknown {family} config field {key!r}{moved}; valid fields are "
                f"{sorted(names)}. Received: {key}={value!r}"
            )


def replace_fields(config, family, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    _refuse_unknown(type(config), family, overrides)
    return dataclasses.replace(config, **overrides)


def resolve_config(config, config_class, presets, family, **overrides):
    """`config` as an instance of `config_class`, with `overrides` applied.

    Accepts an instance, a name from `presets`, or a dict of fields applied to
    the class defaults.
    """
    if isinstance(config, config_class):
        pass
    elif isinstance(config, str):
        if config not in presets:
            raise ValueError(
                f"Unknown {family} preset {config!r}; valid presets are "
                f"{sorted(presets)}. Received: config={config!r}"
            )
        config = presets[config]
    elif isinstance(config, dict):
        config = replace_fields(config_class(), family, **config)
    else:
        raise ValueError(
            f"`config` must be a {config_class.__name__}, a preset name or a dict. "
            f"Received: config={config!r}"
        )
    return replace_fields(config, family, **overrides) if overrides else config


def dtype_policy_with_quantization(model, base=None):
    """`base` (default: `model`'s dtype policy), or, when layers of `model`
    are quantized (`model.quantize("int8")`), a `DTypePolicyMap` of `base`
    and each quantized layer's policy by its path. Every layer of the four
    families passes its dtype policy to the layers it makes, so a model built
    with this map makes the quantized layers quantized again and a `.keras`
    file of a quantized model loads (the way keras-hub's backbones do it)."""
    import keras

    from keras_attn import _keras_compat

    base = model.dtype_policy if base is None else base
    quantized = {layer.path: layer.dtype_policy for layer in _keras_compat.sublayers(model)
                 if layer.quantization_mode is not None and layer.path}
    if not quantized:
        return base
    # A new map (`base` may be the model's own map, which get_config must not
    # change): base's entries, then each quantized layer's own policy.
    Map = keras.dtype_policies.DTypePolicyMap
    policies = Map(default_policy=base.default_policy if isinstance(base, Map) else base)
    entries = {path: base[path] for path in base} if isinstance(base, Map) else {}
    for path, policy in quantized.items():
        entries[path] = policy[path] if isinstance(policy, Map) else policy
    for path, policy in entries.items():
        policies[path] = policy
    return policies


# === The model side: constructor arguments and get_config ===

# Keyword arguments of `keras.Model` that a functional model keeps (besides
# `dtype`); any other keyword a model does not know is refused.
MODEL_ARGUMENTS = ("name", "trainable")


def config_arguments(config_class, family, extra=()):
    """Wraps a model's `__init__(self, config, dtype=None, **kwargs)` so that
    the model takes the fields of `config_class` as keyword (or positional)
    arguments with the config's defaults, then `dtype` and the
    `keras.Model` keywords (`name`, `trainable`): `BertBackbone(num_layers=2,
    ...)`, as keras-hub's backbones take theirs. `inspect.signature`,
    `help()` and Keras's serialization see those arguments. The wrapped
    `__init__` receives the config they make (checked when it is made); an
    unknown keyword is a `ValueError` that names it and the valid fields.

    `extra`: names of the model's own keyword arguments that are not
    architecture (default None; a classifier's `class_names`), passed to
    `__init__` as they are, after `dtype`."""
    fields = dataclasses.fields(config_class)
    Parameter = inspect.Parameter
    signature = inspect.Signature(
        [Parameter("self", Parameter.POSITIONAL_OR_KEYWORD)]
        + [Parameter(f.name, Parameter.POSITIONAL_OR_KEYWORD, default=f.default)
           for f in fields]
        + [Parameter(name, Parameter.POSITIONAL_OR_KEYWORD, default=None)
           for name in ("dtype",) + tuple(extra)]
        + [Parameter("kwargs", Parameter.VAR_KEYWORD)]
    )

    def wrap(init):
        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            arguments = signature.bind(self, *args, **kwargs).arguments
            model_kwargs = arguments.pop("kwargs", {})
            _refuse_unknown(config_class, family, {
                key: value for key, value in model_kwargs.items()
                if key not in MODEL_ARGUMENTS})
            config = config_class(**{f.name: arguments[f.name] for f in fields
                                     if f.name in arguments})
            own = {name: arguments[name] for name in extra if name in arguments}
            init(self, config, dtype=arguments.get("dtype"), **own, **model_kwargs)

        __init__.__signature__ = signature
        return __init__

    return wrap


class ConfigModel:
    """`get_config` / `from_config` for a functional `keras.Model` whose
    constructor (wrapped by `config_arguments`) takes the fields of its
    frozen config dataclass (stored in `self.<config_attribute>`), `dtype`,
    `name` and `trainable`.

    Mix it in before `keras.Model`: `class ViT(ConfigModel, keras.Model)`.
    """

    config_attribute = None

    def get_config(self):
        import keras

        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.saving.serialize_keras_object(dtype_policy_with_quantization(self)),
        }
        config.update(dataclasses.asdict(getattr(self, self.config_attribute)))
        return config

    @classmethod
    def from_config(cls, config):
        import keras

        config = {k: v for k, v in config.items() if k not in MOVED_FIELDS}
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        model = cls(**config)
        if isinstance(config.get("dtype"), keras.dtype_policies.DTypePolicyMap):
            from keras_attn import _keras_compat

            _keras_compat.resolve_policy_maps(model)
            # A functional model does not keep the `dtype` it was given; the
            # map must stay for the layers a task model puts on it (heads).
            model.dtype_policy = config["dtype"]
        return model
