"""The zoo's files, read with the standard library only: the recipes shipped
with keras_attn (`models/<family>/<name>.json`, package data: found, listed,
located by name) and the names of the files in a run directory
(`keras_attn.zoo.runs` writes them)."""

import glob
import importlib.util
import json
import os

# A run directory (keras_attn.zoo.runs describes each file).
RECIPE = "recipe.json"
CHECKPOINTS = "checkpoints"
TIMES = "epoch_seconds.json"  # training seconds of each finished epoch, over all sessions
MODEL = "model.keras"
ADAPTERS = "adapters.npz"
SAVED_MODEL = "saved_model"
EXPORT_RUN = "run.json"  # in an exported SavedModel: the run it came from
CURVES = "learning_curves.png"
RESULTS = "results.json"

PARAMETERS = "parameters.json"  # in the zoo: recipe name -> parameter count


def models_directory():
    """The zoo's recipes: package data, `keras_attn/zoo/recipes` (in a source
    checkout a link to the repository's `models/`, their home), so that an
    installed wheel has them too. Found without running the package's
    `__init__` (which imports Keras)."""
    spec = importlib.util.find_spec("keras_attn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("The keras_attn package is not installed: no zoo recipes to read.")
    package = list(spec.submodule_search_locations)[0]
    return os.path.realpath(os.path.join(package, "zoo", "recipes"))


def recipe_paths(directory=None):
    """`{name: path}` of every recipe under `models/` (results and the
    parameter table left out)."""
    directory = directory or models_directory()
    paths = {}
    for path in sorted(glob.glob(os.path.join(directory, "*", "*.json"))):
        if os.path.basename(os.path.dirname(path)) == "results":
            continue
        paths.setdefault(os.path.splitext(os.path.basename(path))[0], path)
    return paths


def locate_recipe(recipe):
    """A recipe file from a path or a zoo recipe name."""
    if os.path.isfile(recipe):
        return recipe
    known = recipe_paths()
    if recipe in known:
        return known[recipe]
    raise ValueError(
        f"No recipe file {recipe!r} and no recipe of that name in {models_directory()} "
        f"(`list_recipes()` names them). Received: recipe={recipe!r}"
    )


def read_json(path):
    """The JSON file at `path` (a recipe, a run's recipe.json or results,
    the zoo's tables); one that is not UTF-8 JSON (edited by hand, cut
    short) is a ValueError naming the file and where it stops reading."""
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error.msg} at line {error.lineno}, "
                         f"column {error.colno}. Received: {path!r}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 JSON: the byte {error.object[error.start:error.start + 1]!r} "
                         f"at offset {error.start}. Received: {path!r}") from None


def list_recipes(family=None, directory=None):
    """One dict per zoo recipe (of `family`, if given): `name`, `family`,
    `preset`, `dataset`, `parameters` (from models/parameters.json or the
    recorded run; None if neither has it), `expected` (or None),
    `train_seconds` (the recorded run's training time, with its
    `hardware`; None where no run is recorded)."""
    directory = directory or models_directory()
    counts_path = os.path.join(directory, PARAMETERS)
    counts = read_json(counts_path) if os.path.exists(counts_path) else {}
    rows = []
    for name, path in recipe_paths(directory).items():
        recipe = read_json(path)
        if family and recipe.get("family") != family:
            continue
        count = counts.get(name)
        result_path = os.path.join(directory, "results", name + ".json")
        recorded = read_json(result_path) if os.path.exists(result_path) else {}
        if count is None:
            # Recipes on embedded data learn their vocabulary: counted by their run.
            count = recorded.get("parameters")
        rows.append({
            "name": name, "family": recipe.get("family", "?"),
            "preset": recipe.get("model", {}).get("preset", "?"),
            "dataset": recipe.get("data", {}).get("dataset", "?"),
            "parameters": count if isinstance(count, int) else None,
            "expected": recipe.get("expected") or None,
            "train_seconds": recorded.get("train_seconds"),
            "hardware": recorded.get("hardware"),
        })
    return rows


def recipe_families(directory=None):
    """The families that have recipes (their directories under `models/`)."""
    return sorted({os.path.basename(os.path.dirname(path))
                   for path in recipe_paths(directory).values()})
