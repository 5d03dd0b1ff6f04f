"""The command line's early recipe check: a mistyped key, a value of the
wrong type or out of its limits is reported before Keras is imported
(seconds sooner than the complete check, which needs the package).

What it checks against is the published JSON Schema of the recipes
(`models/recipe.schema.json`, generated from the pydantic declaration by
`python -m keras_attn.zoo.reference`; tests/zoo/test_recipe.py checks the
two agree), with `jsonschema` (a well-kept validator; the schema is written
for editors, which use it the same way). The complete check
(`keras_attn.zoo.recipe.validate_recipe`) still runs after: it alone knows
what needs Python (a tfds name, a field of the family's config, a data
folder's layout), and it is the authority: this one only refuses what the
schema refuses, in the same words where it can (unknown and missing keys).
Without `jsonschema` installed the early check is skipped.
"""

import importlib.util
import json
import os

from keras_attn._base.errors import RecipeError
from keras_attn._base.recipe_files import apply_overrides
from keras_attn._base.recipe_files import read_recipe_file
from keras_attn._base.zoo_files import locate_recipe
from keras_attn._base.zoo_files import models_directory

SCHEMA_FILE = "recipe.schema.json"


def check_recipe_early(recipe, overrides=()):
    """Refuses (`RecipeError`) the recipe `recipe` (a file or a zoo name)
    with `overrides` applied where the published JSON Schema refuses it;
    returns None otherwise, and when the schema or `jsonschema` is missing
    or the recipe's task is not one the schema knows (the complete check
    reports those)."""
    path = locate_recipe(recipe)
    data = apply_overrides(read_recipe_file(path), overrides)
    schema_path = os.path.join(models_directory(), SCHEMA_FILE)
    if not isinstance(data, dict) or importlib.util.find_spec("jsonschema") is None \
            or not os.path.isfile(schema_path):
        return
    import jsonschema

    with open(schema_path, encoding="utf-8") as handle:
        schema = json.load(handle)
    # The schema's discriminator is an OpenAPI keyword jsonschema ignores:
    # validate against the recipe's own task's branch, as an editor would.
    task = data.get("task")
    branch = schema.get("discriminator", {}).get("mapping", {}).get(task) \
        if isinstance(task, str) else None
    if isinstance(branch, dict):  # a task of several families: a union on `family`
        families = branch.get("discriminator", {}).get("mapping", {})
        family = data.get("family")
        branch = families.get(family) if isinstance(family, str) else None
        if branch is None:
            raise RecipeError(f"Recipe key `family` must be one of {sorted(families)} for "
                              f"task {task!r}. Received: family={family!r}")
    if branch is None:
        return
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": branch})
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return
    messages = list(dict.fromkeys(_message(error) for error in errors))
    if len(messages) == 1:
        raise RecipeError(messages[0])
    raise RecipeError(f"{len(messages)} problems in the recipe:\n"
                      + "\n".join(f"- {message}" for message in messages))


def _message(error):
    """A jsonschema error in the words of the complete check."""
    parent = ".".join(str(part) for part in error.absolute_path)
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(key for key in instance if key not in allowed)
        key = f"{parent}.{unknown[0]}" if parent else unknown[0]
        where = f" in `{parent}`" if parent else ""
        return (f"Unknown recipe key `{key}`; valid keys{where} are {allowed}. "
                f"Received: {key}={instance[unknown[0]]!r}")
    if error.validator == "required" and isinstance(instance, dict):
        missing = next(name for name in error.validator_value if name not in instance)
        key = f"{parent}.{missing}" if parent else missing
        received = f"{parent}={instance!r}" if parent else f"keys {sorted(instance)}"
        return f"Missing recipe key `{key}` (required). Received: {received}"
    key = parent or "recipe"
    return f"Recipe key `{key}`: {error.message}. Received: {key}={instance!r}"
