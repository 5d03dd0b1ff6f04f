"""The template every model family follows, and its shared code.

Each family `x` has, with the same names and behaviour:

- `XConfig`: a frozen dataclass whose fields are the model's constructor
  arguments (architecture only: training settings such as label smoothing
  belong to `compile` or the recipe);
- `X_PRESETS`: name -> `XConfig`, each with its source and parameter count;
- `get_x_config(config=<default preset>, **overrides)`: a config from an
  `XConfig`, a preset name or a dict of fields, with `overrides` applied;
- `replace_x_config(config, **overrides)`: `dataclasses.replace` whose error
  names an unknown field;
- `build_x(config=<default preset>, **overrides)`: the model.

Every field is checked when the model is built, by the family's
`_check_config`, with the messages of `keras_attn._checks`.
"""

import dataclasses

# Fields that left a config, with where they went: asked for, they are a
# `ValueError` that says so; read from a file saved before, they are dropped
# (`ConfigModel.from_config`).
MOVED_FIELDS = {
    "label_smoothing": "a training setting: `Transformer.compile(label_smoothing=...)` "
                       "or the recipe key `training.label_smoothing`",
}


def replace_fields(config, family, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    fields = {field.name for field in dataclasses.fields(config)}
    for key in overrides:
        if key not in fields:
            moved = f" (it is now {MOVED_FIELDS[key]})" if key in MOVED_FIELDS else ""
            raise ValueError(
                f"Unknown {family} config field {key!r}{moved}; valid fields are "
                f"{sorted(fields)}. Received: {key}={overrides[key]!r}"
            )
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


class ConfigModel:
    """`get_config` / `from_config` for a functional `keras.Model` whose
    constructor takes the fields of its frozen config dataclass (stored in
    `self.<config_attribute>`), `dtype`, `name` and `trainable`.

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
