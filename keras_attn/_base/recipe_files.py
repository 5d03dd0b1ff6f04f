"""Reading a recipe file and applying `--set` overrides: the part of the
recipe machinery that needs neither Keras nor pydantic, shared by
`keras_attn.zoo.recipe` (which validates completely) and the command line's
early check (`keras_attn._base.recipe_check`, before Keras is imported)."""

import copy
import json
import math
import os

from keras_attn._base.errors import RecipeError


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
        value = json.loads(raw, parse_constant=_not_a_number, parse_float=_finite)
    except json.JSONDecodeError:
        value = raw
    except _NotFinite:
        raise key_error(key, "must be a finite number (JSON has no infinity or NaN)",
                        raw) from None
    except RecursionError:
        raise key_error(key, "is nested too deeply", raw[:40] + "...") from None
    return key, value


class _NotFinite(Exception):
    """A number JSON cannot hold (NaN, Infinity, 1e309), raised by the parser."""


def _not_a_number(text):
    raise _NotFinite(text)


def _finite(text):
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def apply_overrides(recipe, overrides):
    """A copy of `recipe` with `overrides` (`"key=value"` strings or
    `(key, value)` pairs) applied. Missing objects on the way are created
    (`training.schedule.alpha=0.1`); replacing a non-object is an error."""
    recipe = copy.deepcopy(recipe)
    if overrides and not isinstance(recipe, dict):
        raise key_error("recipe", "must be a JSON object", recipe)
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
            return json.load(handle, parse_constant=_not_a_number, parse_float=_finite)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RecipeError(f"Recipe {path} is not valid JSON: {error}. "
                         f"Received: {os.fspath(path)}") from None
    except _NotFinite as error:
        raise RecipeError(f"Recipe {path} holds the number {error}, which is not finite "
                         f"(JSON has no infinity or NaN). Received: {os.fspath(path)}") from None
    except RecursionError:
        raise RecipeError(f"Recipe {path} is nested too deeply to read. "
                         f"Received: {os.fspath(path)}") from None
