"""Each small recipe trains through `keras_attn.zoo.train` (what `keras-attn
train` calls) from tf.data on the backend it does not train on in
test_prepared.py (which trains from prepared files without TensorFlow: the
ViT on JAX, the others on PyTorch), so that every recipe trains on both; the
model.keras written on one backend serves the same outputs on the other two.

One subprocess per backend (_backend_worker.py) trains its recipes and
loads the other backend's model.keras files; each run is also loaded here on
TensorFlow. The writer's own numbers are its test metrics in results.json,
which TensorFlow must reproduce.
`keras-attn train` itself (the command line) is tested per backend in
test_cli.py."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from _tiny import ROOT
from _tiny import SMALL

# One worker runs the module: its fixtures train every recipe once.
pytestmark = [pytest.mark.tf_only, pytest.mark.large, pytest.mark.xdist_group("backends")]
HERE = os.path.dirname(os.path.abspath(__file__))
# The backend each recipe trains on here (the other one in test_prepared.py).
WRITER = {"vit_tiny_digits": "torch", "bert_tiny_pydoc": "jax", "transformer_numbers": "jax",
          "conformer_tiny_digits": "jax"}
READER = {"jax": "torch", "torch": "jax"}


class _Worker:
    """A `_backend_worker.py` process on `backend`, given its commands one
    at a time (`do`), each answered once done."""

    def __init__(self, backend, cwd):
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
        if backend == "torch":
            # The JAX runs' recipes say jit_compile=true (_backend_worker.py),
            # which Keras turns into torch.compile on PyTorch: Dynamo's compiles
            # of BERT's predict took 190 s of a loaded 2-core machine, the eager
            # call a fraction of that. What is tested is the loaded weights and
            # layers serving TensorFlow's outputs, not torch.compile.
            env["TORCH_COMPILE_DISABLE"] = "1"
        self.backend, self.errors = backend, open(cwd / "stderr.txt", "w+")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_backend_worker.py")], cwd=cwd, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True)
        # A hung process is killed (its stdout ends): the test fails, naming it.
        self.watchdog = threading.Timer(2400, self.process.kill)
        self.watchdog.start()

    def do(self, *command):
        self.process.stdin.write(json.dumps([str(arg) for arg in command]) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.strip() == "done":
                return
        self.close()
        self.errors.seek(0)
        raise AssertionError(f"{self.backend} {command[0]}: {self.errors.read()[-4000:]}")

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        self.watchdog.cancel()
        self.errors.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`({recipe name: run directory}, {recipe name: outputs})`: each recipe
    trained on its WRITER backend, and what the third backend (READER of the
    writer) serves from its model.keras. One process per backend: PyTorch
    trains, JAX trains and reads PyTorch's run, PyTorch reads JAX's."""
    runs, served = {}, {}
    names = {backend: sorted(name for name in SMALL if WRITER[name] == backend)
             for backend in READER}
    workers = {backend: _Worker(backend, tmp_path_factory.mktemp(f"{backend}_worker"))
               for backend in ("torch", "jax")}
    try:
        for backend in ("torch", "jax"):
            out = tmp_path_factory.mktemp(backend)
            workers[backend].do("train", out, *names[backend])
            runs.update({name: out / name for name in names[backend]})
        for writer in ("torch", "jax"):
            out = tmp_path_factory.mktemp(f"{writer}_on_{READER[writer]}")
            pairs = [item for name in names[writer] for item in (runs[name], out / f"{name}.npz")]
            workers[READER[writer]].do("load", *pairs)
            if READER[writer] == "jax":
                workers["jax"].close()
            for name in names[writer]:
                with np.load(out / f"{name}.npz") as arrays:
                    served[name] = dict(arrays)
    finally:
        for worker in workers.values():
            if not worker.errors.closed:
                worker.close()
    return runs, served


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
def test_trains_on_jax_or_torch_and_loads_on_every_backend(name, trained):
    from keras_attn.zoo.recipe import validate_recipe
    from keras_attn.zoo.tasks import make_task

    runs, served = trained
    writer, run = WRITER[name], runs[name]
    results = json.loads((run / "results.json").read_text())
    assert results["backend"] == writer and results["steps"] == 3
    for path in ("model.keras", "learning_curves.png"):
        assert (run / path).is_file(), path
    assert not (run / "saved_model").exists()
    assert list((run / "checkpoints").glob("ckpt-*.npz"))
    task = make_task(validate_recipe(json.loads((run / "recipe.json").read_text())))
    model = task.load_model(str(run / "model.keras"))
    # TensorFlow reproduces the writer's own test metrics...
    metrics = task.evaluate(model)
    for key, value in results["metrics"].items():
        assert metrics[key] == pytest.approx(value, abs=1e-4), (writer, key)
    # ...and the third backend serves what TensorFlow serves.
    expected = task.reference_outputs(model, task.example_inputs())
    _same(served[name], expected, f"{writer} -> {READER[writer]}")


def test_every_recipe_trains_on_both_backends_between_here_and_test_prepared():
    from test_prepared import TRAINED_WITHOUT_TENSORFLOW

    for name in SMALL:
        assert {WRITER[name], TRAINED_WITHOUT_TENSORFLOW[name]} == {"jax", "torch"}, name
