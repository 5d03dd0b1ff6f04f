"""Importing TensorFlow without its start-up notices.

TensorFlow's C++ libraries (2.21) write these notices to the process's
stderr while they load, before TF_CPP_MIN_LOG_LEVEL applies: absl's note
that logging is not initialised, oneDNN's round-off notice, and "Could not
find cuda drivers" on a CPU machine. They come from below us and no setting
turns them off, so they alone are held back while TensorFlow is imported;
every other line it writes is passed on. Call `import_tensorflow_quietly()`
before Keras is imported (Keras imports TensorFlow on its TensorFlow backend).
"""

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import tempfile

_STARTUP_NOTICES = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|\] oneDNN custom operations are on"
    r"|\] Could not find cuda drivers on your machine"
)


def import_tensorflow_quietly():
    """Imports TensorFlow (when installed and not imported yet) with its
    start-up notices held back. The zoo's data pipelines use TensorFlow on
    every backend."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules and tensorflow_installed():
        import_holding_back_notices("tensorflow")


def tensorflow_module():
    """The `tensorflow` module, imported as `import_tensorflow_quietly` does
    (an ImportError where it is not installed). What keras_attn's
    TensorFlow-only modules (`keras_attn.data`, `keras_attn.export`) use in
    place of `import tensorflow`, so that on JAX and PyTorch, where Keras has
    not imported TensorFlow, its start-up notices stay held back too."""
    import_tensorflow_quietly()
    return importlib.import_module("tensorflow")


def tensorflow_installed():
    """Whether TensorFlow can be imported here, without importing it."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def import_holding_back_notices(module):
    """Imports `module` with the process's stderr file descriptor sent to a
    temporary file, then writes back every line of it except the start-up
    notices. Only fd 2 is redirected, and only during the import."""
    with holding_back_notices():
        importlib.import_module(module)


@contextlib.contextmanager
def holding_back_notices():
    """While the block runs, the process's stderr file descriptor goes to a
    temporary file; after it, every line written there is passed on except
    TensorFlow's start-up notices. Only fd 2 is redirected."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not _STARTUP_NOTICES.search(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def traced_as_written(function):
    """`function`, marked for TensorFlow to trace as written: without
    AutoGraph's rewrite of its source and of every function it calls
    (keras-hub's and tensorflow-text's included), which TensorFlow applies
    to `tf.data.Dataset.map` and `tf.function` by default. Every function
    keras_attn hands them is written for graph mode already (it branches
    with `tf.cond` / `tf.where`, never with Python control flow on a
    tensor), so the rewrite was only cost (tests/zoo/test_text_tasks.py +
    tests/data/test_user_files.py, back to back: 75.0/74.3 -> 73.4/71.1 s).
    A function that did need it fails loudly when traced (TensorFlow
    refuses a tensor used as a Python bool, or iterated over)."""
    return tensorflow_module().autograph.experimental.do_not_convert(function)
