"""Every serializable class registered once Keras is loaded, without
loading Keras for it (standard library only).

A deployment machine imports `keras_attn.export.portable` (`Artifact`),
`keras_attn.export.streaming_runtime` or `keras_attn.data.packing` and must
not pay for Keras and TensorFlow even where they are installed; a training
machine relies on `import keras_attn` making `keras.saving.load_model` find
every keras_attn class. Both hold: the classes are registered (the packages
below imported) as soon as Keras itself is, whoever imports it and in either
order. Keras loads only packages of its own by the saved `module`, so the
registration must come from here: Python has no hook after an import, so a
finder stands in front of Keras's own import, once.
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import sys

# The packages whose import registers the classes a saved model names.
PACKAGES = ("keras_attn.layers", "keras_attn.models", "keras_attn.training")


# Below the layers, imported by them, and registering at its end too.
BELOW = ("keras_attn.ops",)


def _below_or_registering(name):
    """`PACKAGES`, `BELOW` and the private modules at the package's top
    (`keras_attn._keras_compat`, ...), which `PACKAGES` import: while one of
    them is half imported, importing `PACKAGES` would meet it half made."""
    return name in PACKAGES + BELOW or (
        name.startswith("keras_attn._") and name.count(".") == 1)


def _half_imported():
    return [name for name, module in list(sys.modules.items())
            if _below_or_registering(name)
            and getattr(getattr(module, "__spec__", None), "_initializing", False)]


def register_all(caller=None):
    """Imports `PACKAGES` where Keras is loaded. Each of them, and each
    private module that imports Keras, calls this at its end too (`caller`:
    its own name, whose code has run by then): while another of them is half
    imported, the last one to finish imports the rest."""
    if "keras" not in sys.modules or [name for name in _half_imported() if name != caller]:
        return
    for name in PACKAGES:
        importlib.import_module(name)


class _ThenRegister(importlib.abc.Loader):
    """Keras's own loader, which registers keras_attn's classes once Keras
    is executed (and holds back TensorFlow's C++ start-up notices, as
    `import keras_attn` did when it imported Keras itself)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        from keras_attn._base.quiet_tensorflow import holding_back_notices

        _remove_finder()
        module.__spec__.loader = module.__loader__ = self.loader
        quiet = "tensorflow" not in sys.modules
        if quiet:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        with holding_back_notices() if quiet else contextlib.nullcontext():
            self.loader.exec_module(module)
        register_all()


class _BeforeKeras(importlib.abc.MetaPathFinder):
    """Hands out Keras's spec with `_ThenRegister` as its loader. Stays in
    place until Keras is executed: a `find_spec("keras")` that only asks
    whether Keras is installed (TensorFlow does) imports nothing."""

    searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "keras" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec("keras")
        finally:
            self.searching = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


def _remove_finder():
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _BeforeKeras)]


def register_when_keras_loads():
    """Registers now where Keras is loaded, else when it is."""
    if "keras" in sys.modules:
        register_all()
    elif not any(isinstance(finder, _BeforeKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeKeras())
