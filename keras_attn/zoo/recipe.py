"""Training recipes: load a recipe JSON, apply `--set` overrides, validate it
completely before anything trains, and fill in the defaults.

A recipe is `models/<family>/<name>.json`. `load_recipe(path, overrides)`
returns the *resolved* recipe: every key present, defaults filled in, the
dict that `keras-attn train` writes to `<run>/recipe.json`. Any problem is a
`ValueError` that names the dotted key and the value received, e.g.
"Recipe key `training.optimizer.name`: input should be 'adam' or 'adamw'.
Received: training.optimizer.name='sgd'".

The keys, their types, defaults and limits are declared once, with pydantic,
in `keras_attn.zoo.schema` (what every recipe shares) and in each task
adapter `keras_attn.zoo.tasks.<task>` (the task's own keys); the reference
`models/RECIPES.md` and the JSON Schema `models/recipe.schema.json` are
generated from them (`keras_attn.zoo.reference`).
"""

import copy
import json
import os

import pydantic

from keras_attn.zoo import schema
from keras_attn.errors import RecipeError

# Documentation only: not part of a run's fingerprint.
DOCUMENTATION_KEYS = ("description", "expected", "paper")


def _error(key, expectation, value):
    return RecipeError(f"Recipe key `{key}` {expectation}. Received: {key}={value!r}")


def validate_recipe(recipe, name=None):
    """The resolved recipe (defaults filled in), or a `ValueError` naming
    every wrong key and its value.

    Args:
        recipe: the recipe dict (as read from JSON).
        name: the recipe file's stem; the recipe's `name` must equal it.
    """
    from keras_attn.zoo.tasks import TASKS
    from keras_attn.zoo.tasks import families

    if not isinstance(recipe, dict):
        raise _error("recipe", "must be a JSON object", recipe)
    # The keys that choose the schema of the others come first.
    for key in ("family", "task"):
        if key not in recipe:
            raise RecipeError(f"Missing recipe key `{key}` (required). "
                             f"Received: keys {sorted(recipe)}")
    family, task = recipe["family"], recipe["task"]
    known = families()
    if family not in known:
        raise _error("family", f"must be one of {sorted(known)}", family)
    if task not in known[family]:
        tasks = known[family]
        expected = repr(tasks[0]) if len(tasks) == 1 else f"one of {tasks}"
        raise _error("task", f"must be {expected} for family {family!r}", task)
    model = schema.recipe_model(TASKS[task])
    try:
        resolved = model.model_validate(recipe).model_dump()
    except pydantic.ValidationError as error:
        raise schema.recipe_error(error, recipe, model) from None
    if name is not None and resolved["name"] != name:
        raise _error("name", f"must equal the file name's stem {name!r}", resolved["name"])
    return resolved


# === Overrides and files ===


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
                raise _error(prefix, f"is not an object, so `{key}` cannot be set", child)
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


def load_recipe(path, overrides=()):
    """Reads, overrides and validates the recipe at `path`; returns the
    resolved recipe. Its `name` must equal the file's stem."""
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return validate_recipe(apply_overrides(read_recipe_file(path), overrides), name=stem)


# Model overrides that change neither the numbers nor the variables: a run
# may resume with them changed (say, remat turned on after running out of
# memory).
RUN_NEUTRAL_OVERRIDES = ("remat",)


def fingerprint(recipe):
    """What identifies a run: the resolved recipe without the documentation
    keys (a run resumes after `expected` is filled in) and without the
    run-neutral model overrides (`model.overrides.remat`)."""
    found = {k: v for k, v in recipe.items() if k not in DOCUMENTATION_KEYS}
    model = found.get("model")
    if isinstance(model, dict) and isinstance(model.get("overrides"), dict):
        overrides = {
            k: v for k, v in model["overrides"].items() if k not in RUN_NEUTRAL_OVERRIDES
        }
        found["model"] = {**model, "overrides": overrides}
    return found
