"""The README's front-door commands are the ones CI and users really run."""

import glob
import json
import os
import re
import subprocess
import sys

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


def _python_blocks():
    with open(os.path.join(ROOT, "README.md")) as handle:
        return re.findall(r"```python\n(.+?)\n```", handle.read(), flags=re.S)


# After the layers block: real tokens' outputs do not change when padding is
# appended (the mask reaches every block).
PADDING_CHECK = """
import numpy as np
ids = np.array([[5, 6, 7, 8]])
padded = np.array([[5, 6, 7, 8, 0, 0, 0]])
alone = keras.ops.convert_to_numpy(encoder(ids, training=False))
in_padding = keras.ops.convert_to_numpy(encoder(padded, training=False))
np.testing.assert_allclose(in_padding[:, :4], alone, atol=1e-5)
print("padding-invariant")
"""


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_every_python_block_runs_as_written(index, tmp_path):
    block = _python_blocks()[index]
    layers_block = "encoder = keras.Model(" in block
    script = block + (PADDING_CHECK if layers_block else "")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=1200,
        cwd=tmp_path, env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, f"README block {index}:\n{block}\n{result.stderr[-3000:]}"
    assert not layers_block or "padding-invariant" in result.stdout
