import getpass
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Test-speed setting (inherited by the tests' subprocesses): XLA compiles the
# same HLO programs with no LLVM optimisation, which halves the compile time
# that dominates the JAX pass on a CPU (measured: 16.7 s -> 8.3 s for the
# fused-padding test's eight lengths). Results differ only by float rounding.
# XLA's CPU fusion emitters off as well: the compile of each small program
# (a JAX pass compiles ~15,000 on a cold cache) is ~35% shorter (100 eager
# ops: 14.9 s -> 9.8 s; tests/models/test_transformer.py, test_packing_conformer.py
# and tests/layers/test_streaming_layers.py, 2 workers, cold cache: 113 s -> 79 s;
# the whole JAX pass, cold: 844 s -> 548 s). Tested with jaxlib 0.10.2: XLA
# aborts on a flag it does not know, so a jaxlib that drops it fails loudly here.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                   "--xla_cpu_use_fusion_emitters=false")
# JAX's persistent compilation cache, shared by the xdist workers, the
# subprocesses that train on JAX (they inherit the variables) and the passes
# of one CI run: a program compiled once (the same shapes, ops and flags; the
# key leaves out layer names) is read back by every later test. Measured on
# tests/models under JAX, 2 workers, a fresh cache: 588 s -> 502 s. Every
# compile is kept (the default keeps those over 1 s; most of ours take less).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"keras_attn_tests_jax_cache_{getpass.getuser()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
sys.path.insert(0, os.path.dirname(__file__))  # `from test_case import ...`

import gc  # noqa: E402

import pytest  # noqa: E402

# The backend of this pass: Keras takes it from KERAS_BACKEND (set above
# when the caller did not), so it is known without importing Keras.
BACKEND = os.environ["KERAS_BACKEND"]


def pytest_configure(config):
    """Imports Keras and keras_attn, then freezes the garbage collector's
    view of them; not in pytest-xdist's controller process, which runs no
    test and collects none: there the imports (~6 s here, TensorFlow's
    mostly) only delayed the start of the workers, once per pass."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import keras

    import keras_attn.layers  # noqa: F401
    import keras_attn.models  # noqa: F401

    if keras.backend.backend() != BACKEND:
        raise pytest.UsageError(f"Keras runs on {keras.backend.backend()!r}, "
                                f"but KERAS_BACKEND={BACKEND!r}")
    # Test-speed setting: the objects alive now (TensorFlow's, JAX's,
    # Keras's modules: ~460,000) are moved out of the garbage collector's
    # sight, once per process. A full collection traverses them all (0.75 s
    # each here), and Keras runs one for every variable it deletes
    # (`Layer.__delattr__`: 24 in one int8 quantization of the tiny
    # Conformer), besides the interpreter's own oldest-generation
    # collections as a test allocates. After the freeze a collection sees
    # only what the tests made (~0.01 s). Nothing is leaked: only objects
    # alive at import time are frozen, and they live to the end. Measured on
    # tests/models/test_lora.py + test_bert.py: 13.9 -> 10.6 s of
    # collections; test_quantize.py's int8 tests 2-4x faster (e49a815).
    gc.collect()
    gc.freeze()


# marker -> the only backend whose pass collects the test (see setup.cfg).
ONLY_ON = {
    "tf_only": "tensorflow",
    "jax_only": "jax",
    "torch_only": "torch",
    # Pure Python, or subprocesses that choose their own backend: running it
    # again in the JAX and PyTorch passes would test nothing new.
    "backend_independent": "tensorflow",
    # A check of the preset tables (each preset, shrunk, builds and runs):
    # the layers and builders they reach are tested on every backend by the
    # model tests, and on JAX these ~60 eager builds cost ~3 min of the budget.
    "presets": "tensorflow",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers added here
def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) the tests that belong to another backend's pass,
    so that `KERAS_BACKEND=jax pytest` runs exactly what JAX can and must.
    A `large` test (full size) is `slow` too: the quick tier,
    `pytest -m "not slow"`, leaves both out."""
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("large") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        wanted = {ONLY_ON[m.name] for m in item.iter_markers() if m.name in ONLY_ON}
        for marker in item.iter_markers("backends"):  # @pytest.mark.backends("tensorflow", ...)
            wanted.update(marker.args)
        (keep if not wanted or BACKEND in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    import keras

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)


# An `exclusive` test runs with no other test beside it (_machine_share.py).
from _machine_share import pytest_runtest_protocol  # noqa: E402,F401


# Not test modules: run by the tests in subprocesses (a sitecustomize that
# blocks TensorFlow when a variable says so).
collect_ignore_glob = ["zoo/no_tensorflow/*"]
