"""Reading a recipe file and applying `--set` overrides: the part of the
recipe machinery that needs neither Keras nor pydantic, shared by
`keras_attn.zoo.recipe` (which validates completely) and the command line's
early check (`keras_attn_base.recipe_check`, before Keras is imported)."""

import copy
import json
import os

from keras_attn_base.errors import RecipeError


def key_error(key, expectation, value):
    """A `RecipeError` for `key` (dotted) in the house form."""
    return RecipeError(f"Recipe key `{key}` {expectation}. Received: {key}={value!r}")


def parse_override(text):
    """`"dotted.key=value"` -> `("dotted.key", value)`; the value is parsed as
    JSON (`3`, `0.5`, `true`, `null`, `[8, 16]`, `{"a": 1}`), else kept as a
    string (`adamw`, `tfds:cifar10`)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(f"An override is dotted.key=value. Received: --set {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def apply_overrides(recipe, overrides):
    """A copy of `recipe` with `overrides` (`"key=value"` strings or
    `(key, value)` pairs) applied. Missing objects on the way are created
    (`training.schedule.alpha=0.1`); replacing a non-object is an error."""
    recipe = copy.deepcopy(recipe)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        parts = key.split(".")
        node = recipe
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[: i + 1])
                raise key_error(prefix, f"is not an object, so `{key}` cannot be set", child)
            node = child
        node[parts[-1]] = value
    return recipe


def read_recipe_file(path):
    """The JSON object in `path`, with a `ValueError` naming the file and
    the position for bad JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise RecipeError(f"Recipe {path} is not valid JSON: {error}. "
                         f"Received: {os.fspath(path)}") from None
