"""The README's front-door commands are the ones CI and users really run."""

import atexit
import glob
import json
import os
import re
import select
import subprocess
import sys
import tempfile

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

# id(model) -> (name, x, y, loss before); id(model) -> the record written.
# Emptied before each block when several run in one process (BLOCKS_RUNNER).
_FIRST_LOSSES, _LAST_LOSSES = {}, {}

def _record_losses(keras):
    import functools
    import inspect
    import json
    import numpy as np

    fit = keras.Model.fit
    first, after = _FIRST_LOSSES, _LAST_LOSSES

    def first_batch(x, y, batch_size, sample_weight):
        # (x, y, sample_weight or None) of the first batch fit trains on: the
        # loss checked weighs examples (and tokens) as fit does.
        if y is None and hasattr(x, "element_spec"):   # a tf.data dataset
            batch = keras.tree.map_structure(np.asarray, next(iter(x)))
            return batch[0], batch[1], batch[2] if len(batch) > 2 else None
        if y is None:
            raise TypeError("test_readme reads the first batch of a tf.data dataset "
                            f"or of arrays; extend it for {type(x).__name__}")
        size = batch_size or 32
        bx, by = keras.tree.map_structure(lambda a: np.asarray(a)[:size], (x, y))
        return bx, by, None if sample_weight is None else np.asarray(sample_weight)[:size]

    def loss_on(model, x, y, weights):
        size = len(keras.tree.flatten(y)[0])
        return float(model.evaluate(x, y, sample_weight=weights, batch_size=size, verbose=0,
                                    return_dict=True)["loss"])

    def recorded_fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        if id(self) not in first:
            arguments = inspect.signature(fit).bind(self, x, y, batch_size, *args, **kwargs)
            batch = first_batch(x, y, batch_size, arguments.arguments.get("sample_weight"))
            first[id(self)] = (self.name, batch, loss_on(self, *batch))
        history = fit(self, x, y, batch_size, *args, **kwargs)
        name, batch, before = first[id(self)]
        after[id(self)] = {"model": name, "before": before, "after": loss_on(self, *batch)}
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


_ENV = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")


def _run(script, cwd, *args, timeout=1200):
    return subprocess.run(
        [sys.executable, "-c", LOSS_RECORDER + script, *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env=_ENV)


# Runs blocks in one long-lived process a pytest worker (importing TensorFlow
# and Keras costs 5-20 s a process; 19 pages' processes were ~100 worker-s),
# each block as a fresh process would: in its own globals and working
# directory, with os.environ, Keras's session, dtype policy and registered
# classes as they were before the first block, and keras_attn not yet imported
# (a block that loads a model must import keras_attn itself). It reads one
# request a line on stdin, [blocks file, results file] (the blocks file: JSON
# [[directory, block], ...]), writes the results file after each block,
# {index: {"error": traceback or None, "stdout": ..., "seconds": ...}}, and
# writes "done" to the file descriptor of its first argument after the last.
BLOCKS_RUNNER = """
import contextlib, io, json, os, sys, time, traceback
import keras
from keras.src.saving import object_registration as _registration

_done = os.fdopen(int(sys.argv[1]), "w")
_environ = dict(os.environ)
_policy, _floatx = keras.config.dtype_policy(), keras.config.floatx()
_names = dict(_registration.GLOBAL_CUSTOM_NAMES)
_objects = dict(_registration.GLOBAL_CUSTOM_OBJECTS)
for _request in sys.stdin:
    _listing, _reported = json.loads(_request)
    with open(_listing) as handle:
        _blocks = json.load(handle)
    _results = {}
    for _index, (_directory, _block) in enumerate(_blocks):
        os.chdir(_directory)
        _FIRST_LOSSES.clear()
        _LAST_LOSSES.clear()
        _stdout = io.StringIO()
        _start = time.monotonic()
        # Every block starts from the same random state, whatever ran before
        # it in this process (which pages a worker gets is xdist's choice):
        # an unseeded block's weights and dropout were the previous blocks'
        # leftovers, and docs/models.md's LoRA block once failed its "the
        # loss went down" check under another schedule (-n 3).
        keras.utils.set_random_seed(0)
        try:
            with contextlib.redirect_stdout(_stdout):
                exec(compile(_block, "<block>", "exec"), {"__name__": "__main__"})
            _error = None
        except BaseException:
            _error = traceback.format_exc()
        _results[_index] = {"error": _error, "stdout": _stdout.getvalue(),
                            "seconds": round(time.monotonic() - _start, 1)}
        with open(_reported, "w") as handle:
            json.dump(_results, handle)
        os.environ.clear()
        os.environ.update(_environ)
        for _name in [n for n in sys.modules
                      if n.split(".")[0] == "keras_attn"]:
            del sys.modules[_name]
        for _registry, _kept in ((_registration.GLOBAL_CUSTOM_NAMES, _names),
                                 (_registration.GLOBAL_CUSTOM_OBJECTS, _objects)):
            _registry.clear()
            _registry.update(_kept)
        keras.backend.clear_session()
        keras.config.set_floatx(_floatx)
        keras.config.set_dtype_policy(_policy)
    _done.write("done\\n")
    _done.flush()
"""


class _BlocksRunner:
    """The BLOCKS_RUNNER process of this pytest worker, started at its first
    page and restarted after one that ended it (a crash, a timeout)."""

    process = None

    def run(self, listing, reported, timeout):
        """Runs the blocks of `listing`; None, or why the process ended."""
        if self.process is None or self.process.poll() is not None:
            self._start()
        self.process.stdin.write(json.dumps([listing, reported]) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.done], [], [], timeout)
        if ready and self.done.readline() == "done\n":
            return None
        self.process.kill()
        self.process.wait()
        self.done.close()
        self.log.seek(0)
        ended = f"exit {self.process.returncode}, {'' if ready else 'timed out, '}"
        self.process = None
        return ended + self.log.read()[-3000:]

    def _start(self):
        done, write_end = os.pipe()
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-c", LOSS_RECORDER + BLOCKS_RUNNER, str(write_end)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.log, text=True,
            pass_fds=(write_end,), env=_ENV)
        os.close(write_end)
        self.done = os.fdopen(done)
        atexit.register(self.process.kill)


_BLOCKS = _BlocksRunner()


def _losses_that_did_not_go_down(cwd):
    """The models whose loss on their first batch did not go down (as
    LOSS_RECORDER reported them in `cwd`); None when no fit was recorded."""
    path = os.path.join(cwd, "readme_losses.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        losses = json.load(handle)
    return [entry for entry in losses if not entry["after"] < entry["before"]] if losses else None


def run_blocks_as_written(blocks, cwd):
    """Runs documentation blocks as written, each in a working directory of
    its own under `cwd`, and returns one result a block, in order: a dict of
    `error` (its traceback, or None), `stdout` and `cwd`. The blocks share one
    process (BLOCKS_RUNNER, kept for the pytest worker's later pages), except a block that sets os.environ (its backend,
    XLA flags) before importing Keras: it runs alone, as `python -c block`."""
    blocks = [block + (PADDING_CHECK if "encoder = keras.Model(" in block else "")
              for block in blocks]
    directories = [os.path.join(cwd, f"block_{i}") for i in range(len(blocks))]
    for directory in directories:
        os.makedirs(directory)
    shared = [i for i, block in enumerate(blocks) if "os.environ" not in block]
    results = [None] * len(blocks)
    for i in set(range(len(blocks))) - set(shared):
        process = _run(blocks[i], directories[i])
        results[i] = {"error": process.stderr if process.returncode else None,
                      "stdout": process.stdout}
    if shared:
        listing = os.path.join(cwd, "blocks.json")
        reported = os.path.join(cwd, "results.json")
        with open(listing, "w") as handle:
            json.dump([[directories[i], blocks[i]] for i in shared], handle)
        ended = _BLOCKS.run(listing, reported, timeout=1200 * len(shared))
        ran = {}
        if os.path.exists(reported):
            with open(reported) as handle:
                ran = json.load(handle)
        for position, i in enumerate(shared):
            results[i] = ran.get(str(position)) or {
                "error": f"the process ended ({ended}) before this block finished",
                "stdout": ""}
    return [dict(result, cwd=directory) for result, directory in zip(results, directories)]


def check_block_ran(result, block, where):
    """Asserts that a block (run by run_blocks_as_written) raised nothing
    and that every model it trains learns (`where` names the block in the
    failure)."""
    assert result["error"] is None, f"{where}:\n{block}\n{result['error'][-3000:]}"
    assert "encoder = keras.Model(" not in block or "padding-invariant" in result["stdout"]
    # A block that trains makes its loss go down: on the first batch it
    # trained on, after its last `fit`, for every model it trained.
    if re.search(r"\.fit\(", block):
        stuck = _losses_that_did_not_go_down(result["cwd"])
        assert stuck is not None, f"{where} trains but no fit was recorded"
        assert not stuck, (
            f"{where}: the loss on the first batch did not go down "
            f"(before training, after): {stuck}\n{block}")


@pytest.fixture(scope="module")
def ran_blocks(tmp_path_factory):
    """`ran_blocks(path)`: the results of the Python blocks of the Markdown
    file `path` (run_blocks_as_written), run once a module: the parameters of
    one page share its process (and an xdist group, so one worker runs it)."""
    runs = {}

    def ran(path):
        if path not in runs:
            cwd = tmp_path_factory.mktemp(os.path.basename(path).replace(".", "_"))
            runs[path] = run_blocks_as_written(python_blocks(path), str(cwd))
        return runs[path]
    return ran


@pytest.mark.slow
@pytest.mark.xdist_group("README.md")
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_python_block_runs_as_written(index, ran_blocks):
    path = os.path.join(ROOT, "README.md")
    check_block_ran(ran_blocks(path)[index], python_blocks(path)[index], f"README block {index}")


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


def test_a_block_that_ends_the_runner_fails_and_the_next_blocks_run_again(tmp_path):
    # The shared process dies with the block (os._exit): that block and the
    # ones after it in its page fail with the reason, and the next page gets
    # a new process that runs its blocks as written.
    blocks = ["import os\nprint('first')", "import os\nos._exit(3)", "print('never')"]
    first, ended, never = run_blocks_as_written(blocks, str(tmp_path / "a"))
    assert first["error"] is None and first["stdout"] == "first\n"
    assert "exit 3" in ended["error"] and "exit 3" in never["error"]
    again, = run_blocks_as_written(["print(1 + 1)"], str(tmp_path / "b"))
    assert again["error"] is None and again["stdout"] == "2\n"
