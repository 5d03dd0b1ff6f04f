"""Each small recipe trains through `keras-attn train` on JAX and on PyTorch,
and the model.keras written on one backend serves the same outputs on the
other two.

Each family: one run on JAX and one on PyTorch (subprocesses). The JAX run's
model.keras is loaded here on TensorFlow and in a PyTorch subprocess, the
PyTorch run's here and in a JAX subprocess; the writer's own numbers are its
test metrics in results.json, which TensorFlow must reproduce."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _tiny import ROOT
from _tiny import SMALL
from _tiny import tiny_overrides

pytestmark = [pytest.mark.tf_only, pytest.mark.large]
HERE = os.path.dirname(os.path.abspath(__file__))


def _run(backend, args, cwd):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                            timeout=1200, cwd=cwd, env=env)
    assert result.returncode == 0, f"{backend}: {result.stderr[-4000:]}"
    return result


def _train(name, backend, run, cwd):
    sets = [item for value in tiny_overrides(name) for item in ("--set", value)]
    # The SavedModel of a JAX run, written by a TensorFlow subprocess, is
    # tested in test_cli.py; here --no-export keeps the suite short.
    result = _run(backend, ["-m", "keras_attn.cli", "train", name, "--output", run,
                            "--verbose", "0", "--no-export", *sets], cwd)
    results = json.loads((run / "results.json").read_text())
    assert results["backend"] == backend and results["steps"] == 3
    for path in ("model.keras", "learning_curves.png"):
        assert (run / path).is_file(), path
    assert not (run / "saved_model").exists()
    assert f"SavedModel:      not written; `keras-attn export {run}` writes it" in result.stdout
    assert list((run / "checkpoints").glob("ckpt-*.npz"))
    return results


def _same(actual, expected, context):
    assert sorted(actual) == sorted(expected), context
    for key in expected:
        assert actual[key].shape == expected[key].shape, (context, key)
        if np.issubdtype(expected[key].dtype, np.integer):
            np.testing.assert_array_equal(actual[key], expected[key], err_msg=f"{context} {key}")
        else:
            np.testing.assert_allclose(actual[key], expected[key], atol=1e-4, rtol=1e-4,
                                       err_msg=f"{context} {key}")


@pytest.mark.parametrize("name", sorted(SMALL))
def test_trains_on_jax_and_torch_and_loads_on_every_backend(name, tmp_path):
    from keras_attn.zoo.recipe import validate_recipe
    from keras_attn.zoo.tasks import make_task

    runs = {backend: tmp_path / backend for backend in ("jax", "torch")}
    results = {backend: _train(name, backend, run, tmp_path) for backend, run in runs.items()}
    for writer, reader in (("jax", "torch"), ("torch", "jax")):
        run = runs[writer]
        task = make_task(validate_recipe(json.loads((run / "recipe.json").read_text())))
        model = task.load_model(str(run / "model.keras"))
        # TensorFlow reproduces the writer's own test metrics...
        metrics = task.evaluate(model)
        for key, value in results[writer]["metrics"].items():
            assert metrics[key] == pytest.approx(value, abs=1e-4), (writer, key)
        # ...and the third backend serves what TensorFlow serves.
        expected = task.reference_outputs(model, task.example_inputs())
        _run(reader, [os.path.join(HERE, "_load_run.py"), run, tmp_path / "out.npz"], tmp_path)
        with np.load(tmp_path / "out.npz") as served:
            _same(dict(served), expected, f"{writer} -> {reader}")
