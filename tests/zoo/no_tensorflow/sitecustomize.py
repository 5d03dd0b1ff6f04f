"""Makes TensorFlow, and the packages that need it, not importable in this
process, as on a machine without them (the GPU machine): importing one raises
`ModuleNotFoundError`, and nothing of them enters `sys.modules` (Keras takes
"tensorflow" in `sys.modules` as TensorFlow being in use). Put this directory
first on PYTHONPATH of a subprocess (tests/zoo/test_prepared.py).

`importlib.util.find_spec` of them returns None, as there (torch._dynamo
and keras_attn ask it)."""

import importlib.abc
import importlib.util
import sys

BLOCKED = {"tensorflow", "tensorflow_datasets", "tensorflow_text", "tf_keras", "keras_hub",
           "keras_nlp", "tensorboard"}


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())


_find_spec = importlib.util.find_spec


def _find_spec_or_none(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _find_spec_or_none
