"""keras_attn: attention layers for Keras 3 and the models built from them.

Importing the package registers every serializable class (layers, the four
model families, losses, metrics, schedules and the optimizer guard), so
`keras.saving.load_model("run/model.keras")` needs no other import.

The public names are those in the `__all__` of the subpackages listed here
(README, "Public API"); `keras_attn.convert`, `.export`, `.viz` and `.zoo` are
imported on first use (`keras_attn.export` is TensorFlow only).
"""

import importlib

from keras_attn._version import __version__  # stated once, there (setup.cfg reads it too)

import sys as _sys  # noqa: E402
from importlib.util import find_spec as _find_spec  # noqa: E402


from keras_attn import errors  # noqa: E402  (Keras-free)

# Where Keras is installed, every serializable class is registered as soon as
# Keras is loaded (now, if it already is), so that `keras.saving.load_model`
# finds them after `import keras_attn`; the package itself loads no Keras, so
# that a deployment machine importing `keras_attn.export.portable`
# (`Artifact`), `keras_attn.export.streaming_runtime` or
# `keras_attn.data.packing` needs NumPy and a runtime only, Keras installed or
# not (keras_attn/_registration.py). `layers`, `models`, `training` load on
# first use, and say Keras is missing where it is not installed.
if _find_spec("keras") is not None or "keras" in _sys.modules:
    from keras_attn import _registration  # noqa: E402

    _registration.register_when_keras_loads()

_LAZY = ("convert", "export", "layers", "models", "training", "viz", "zoo")

__all__ = ["convert", "errors", "export", "layers", "models", "training", "viz", "zoo",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_attn.{name}")
    raise AttributeError(f"module 'keras_attn' has no attribute {name!r}")
