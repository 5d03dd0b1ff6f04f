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

import os

import pydantic

from keras_attn.errors import RecipeError
from keras_attn.zoo import schema
# Reading a recipe file and applying `--set` overrides need no Keras: they
# live in keras_attn._base, which the command line's early check uses too.
from keras_attn._base.recipe_files import apply_overrides  # noqa: F401  (API)
from keras_attn._base.recipe_files import key_error as _error
from keras_attn._base.recipe_files import parse_override  # noqa: F401  (API)
from keras_attn._base.recipe_files import read_recipe_file

# Documentation only: not part of a run's fingerprint.
DOCUMENTATION_KEYS = ("description", "expected", "paper")


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
    model = schema.recipe_model(TASKS[task], family)
    try:
        resolved = model.model_validate(recipe).model_dump()
    except pydantic.ValidationError as error:
        raise schema.recipe_error(error, recipe, model) from None
    if name is not None and resolved["name"] != name:
        raise _error("name", f"must equal the file name's stem {name!r}", resolved["name"])
    return resolved


# === Overrides and files ===


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
