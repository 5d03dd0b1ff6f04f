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


def python_blocks(path=os.path.join(ROOT, "README.md")):
    """The ```python blocks of a Markdown file (README.md by default; the
    documentation's pages too, tests/test_docs.py)."""
    with open(path, encoding="utf-8") as handle:
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


# Before every block: each `fit` reports the loss on the first batch it
# trains on, measured with `evaluate` before the model's first `fit` and after
# each one, to `readme_losses.json` (a block that trains nothing, e.g. with a
# probability loss on logits, still exits 0). Installed when the block imports
# keras, so a block may choose its backend and XLA flags first.
LOSS_RECORDER = """
import importlib.abc, importlib.machinery, sys

def _record_losses(keras):
    import functools
    import json
    import numpy as np

    fit = keras.Model.fit
    first = {}   # id(model) -> (name, x, y, loss before)
    after = {}

    def first_batch(x, y, batch_size):
        if y is None and hasattr(x, "element_spec"):   # a tf.data dataset
            batch = keras.tree.map_structure(np.asarray, next(iter(x)))
            return batch[0], batch[1]
        if y is None:
            raise TypeError("test_readme reads the first batch of a tf.data dataset "
                            f"or of arrays; extend it for {type(x).__name__}")
        size = batch_size or 32
        return keras.tree.map_structure(lambda a: np.asarray(a)[:size], (x, y))

    def loss_on(model, x, y):
        size = len(keras.tree.flatten(y)[0])
        return float(model.evaluate(x, y, batch_size=size, verbose=0, return_dict=True)["loss"])

    def recorded_fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        if id(self) not in first:
            bx, by = first_batch(x, y, batch_size)
            first[id(self)] = (self.name, bx, by, loss_on(self, bx, by))
        history = fit(self, x, y, batch_size, *args, **kwargs)
        name, bx, by, before = first[id(self)]
        after[id(self)] = {"model": name, "before": before, "after": loss_on(self, bx, by)}
        with open("readme_losses.json", "w") as handle:
            json.dump(list(after.values()), handle)
        return history

    # functools.wraps: the model's guard binds fit's arguments by the
    # signature of keras.Model.fit, which must stay Keras's own.
    keras.Model.fit = functools.wraps(fit)(recorded_fit)

class _AfterKerasImport(importlib.abc.MetaPathFinder):
    # Stays in place until keras is loaded: a find_spec("keras") that only
    # looks (TensorFlow's does) loads nothing.
    def find_spec(self, name, path, target=None):
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            sys.meta_path.remove(self)
            run(module)
            _record_losses(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _AfterKerasImport())
"""


def _run(script, cwd):
    return subprocess.run(
        [sys.executable, "-c", LOSS_RECORDER + script], capture_output=True, text=True,
        timeout=1200, cwd=cwd,
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _losses_that_did_not_go_down(cwd):
    """The models whose loss on their first batch did not go down (as
    LOSS_RECORDER reported them in `cwd`); None when no fit was recorded."""
    path = os.path.join(cwd, "readme_losses.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        losses = json.load(handle)
    return [entry for entry in losses if not entry["after"] < entry["before"]] if losses else None


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_python_block_runs_as_written(index, tmp_path):
    run_block_as_written(python_blocks()[index], tmp_path, f"README block {index}")


def run_block_as_written(block, cwd, where):
    """Runs a documentation block in a fresh process in `cwd` and asserts
    that it exits 0 and that every model it trains learns (`where` names
    the block in the failure)."""
    layers_block = "encoder = keras.Model(" in block
    result = _run(block + (PADDING_CHECK if layers_block else ""), cwd)
    assert result.returncode == 0, f"{where}:\n{block}\n{result.stderr[-3000:]}"
    assert not layers_block or "padding-invariant" in result.stdout
    # A block that trains makes its loss go down: on the first batch it
    # trained on, after its last `fit`, for every model it trained.
    if re.search(r"\.fit\(", block):
        stuck = _losses_that_did_not_go_down(cwd)
        assert stuck is not None, f"{where} trains but no fit was recorded"
        assert not stuck, (
            f"{where}: the loss on the first batch did not go down "
            f"(before training, after): {stuck}\n{block}")


def test_the_loss_check_sees_a_model_that_trains_nothing(tmp_path):
    script = """
import numpy as np
import tensorflow as tf
import keras

x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
y = np.arange(32) % 3
for name, rate in (("still", 0.0), ("learning", 0.1)):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name=name)
    model.compile(keras.optimizers.SGD(rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0)
    model.fit(x, y, batch_size=8, verbose=0)
"""
    result = _run(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    stuck = _losses_that_did_not_go_down(tmp_path)
    assert [entry["model"] for entry in stuck] == ["still"], stuck
    assert stuck[0]["after"] == stuck[0]["before"]
