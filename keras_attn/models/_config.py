"""Config lookup shared by the model families: a config object, a preset
name or a dict of fields, with errors that name the unknown key."""

import dataclasses


def replace_fields(config, family, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    fields = {field.name for field in dataclasses.fields(config)}
    for key in overrides:
        if key not in fields:
            raise ValueError(
                f"Unknown {family} config field {key!r}; valid fields are "
                f"{sorted(fields)}. Received: {key}={overrides[key]!r}"
            )
    return dataclasses.replace(config, **overrides)


def resolve_config(config, config_class, presets, family):
    """`config` as an instance of `config_class`.

    Accepts an instance, a name from `presets`, or a dict of fields applied to
    the class defaults.
    """
    if isinstance(config, config_class):
        return config
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(
                f"Unknown {family} preset {config!r}; valid presets are "
                f"{sorted(presets)}. Received: config={config!r}"
            )
        return presets[config]
    if isinstance(config, dict):
        return replace_fields(config_class(), family, **config)
    raise ValueError(
        f"`config` must be a {config_class.__name__}, a preset name or a dict. "
        f"Received: config={config!r}"
    )


class ConfigModel:
    """`get_config` / `from_config` for a functional `keras.Model` whose
    constructor takes the fields of its frozen config dataclass (stored in
    `self.<config_attribute>`), the names in `extra_config` (stored as
    attributes of the same name), `dtype`, `name` and `trainable`.

    Mix it in before `keras.Model`: `class ViT(ConfigModel, keras.Model)`.
    """

    config_attribute = None
    extra_config = ()

    def get_config(self):
        import keras

        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
        }
        config.update({key: getattr(self, key) for key in self.extra_config})
        config.update(dataclasses.asdict(getattr(self, self.config_attribute)))
        return config

    @classmethod
    def from_config(cls, config):
        import keras

        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)
