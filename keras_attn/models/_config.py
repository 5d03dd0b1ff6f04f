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
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
        }
        config.update(dataclasses.asdict(getattr(self, self.config_attribute)))
        return config

    @classmethod
    def from_config(cls, config):
        import keras

        config = {k: v for k, v in config.items() if k not in MOVED_FIELDS}
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)
