"""Makes TensorFlow, and the packages that need it, not importable in this
process, as on a machine without them (the GPU machine): importing one raises
`ModuleNotFoundError`, and nothing of them enters `sys.modules` (Keras takes
"tensorflow" in `sys.modules` as TensorFlow being in use). Put this directory
first on PYTHONPATH of a subprocess (tests/zoo/test_prepared.py) and set
KERAS_ATTN_TEST_BLOCK_TENSORFLOW=1: without that variable this file does
nothing (pytest's --doctest-modules imports every file under tests/, and
once this one blocked TensorFlow inside the test workers themselves).

`importlib.util.find_spec` of them returns None, as there (torch._dynamo
and keras_attn ask it)."""

import importlib.abc
import importlib.util
import os
import sys

BLOCKED = {"tensorflow", "tensorflow_datasets", "tensorflow_text", "tf_keras", "keras_hub",
           "keras_nlp", "tensorboard"}
SWITCH = "KERAS_ATTN_TEST_BLOCK_TENSORFLOW"


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


_find_spec = importlib.util.find_spec


def _find_spec_or_none(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _find_spec(name, package)


if os.environ.get(SWITCH) == "1":
    sys.meta_path.insert(0, _NotInstalled())
    importlib.util.find_spec = _find_spec_or_none
