"""The README's front-door commands are the ones CI and users really run."""

import glob
import json
import os
import re

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_commands():
    with open(os.path.join(ROOT, "README.md")) as handle:
        text = handle.read()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = _readme_commands()
    assert len(commands) >= 2, "README must open with the main-job and the test command"
    test_command = commands[1].strip()
    assert "pytest" in test_command
    with open(os.path.join(ROOT, ".ci", "run")) as handle:
        ci_lines = [line.strip() for line in handle]
    assert test_command in ci_lines


def test_main_job_command_trains_an_existing_recipe():
    main_command = _readme_commands()[0]
    recipes = re.findall(r"keras-attn train (\S+)", main_command)
    assert recipes, main_command
    for recipe in recipes:
        path = recipe if recipe.endswith(".json") else None
        if path is None:  # a recipe name: models/<family>/<name>.json
            found = glob.glob(os.path.join(ROOT, "models", "*", f"{recipe}.json"))
            found = [p for p in found if os.path.basename(os.path.dirname(p)) != "results"]
            assert len(found) == 1, (recipe, found)
            path = found[0]
        with open(os.path.join(ROOT, path)) as handle:
            assert json.load(handle)["name"] == recipe.split("/")[-1].removesuffix(".json")
