"""Runs an example the way a user does (`python3 examples/NAME.py ...` from
the checkout, with no logging variables set) and checks that it succeeded
and printed none of the start-up notices or Keras warnings that issue 20
removed at their cause (or, for TensorFlow's own C++ lines, held back)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOISE = (
    "absl::InitializeLog",            # TensorFlow's C++ logging start-up
    "oneDNN custom operations",       # TensorFlow on a CPU
    "Could not find cuda drivers",    # TensorFlow without a GPU
    "rebuild TensorFlow",             # TensorFlow's CPU-instructions notice
    "ran out of data",                # a dataset of unknown length given to fit
    "shuffle=True",                   # fit's default with a tf.data dataset
    "np.object",                      # NumPy's FutureWarning at Keras's ONNX export
)


def run_example(name, *args, timeout=900, **env):
    environment = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)  # conftest sets it; users do not
    environment.update(env)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=environment, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    noisy = [line for line in (result.stdout + result.stderr).splitlines()
             if any(text in line for text in NOISE)]
    assert not noisy, noisy
    if "--smoke" in args:  # a smoke run's numbers mean nothing: it says so first
        assert result.stdout.startswith("--smoke: a few steps"), result.stdout[:300]
    return result
