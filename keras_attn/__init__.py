"""keras_attn: attention layers for Keras 3 and the models built from them.

Importing the package registers every serializable class (layers, the four
model families, losses, metrics, schedules and the optimizer guard), so
`keras.saving.load_model("run/model.keras")` needs no other import.

The public names are those in the `__all__` of the subpackages listed here
(README, "Public API"); `keras_attn.convert`, `.export`, `.viz` and `.zoo` are
imported on first use (`keras_attn.export` is TensorFlow only).
"""

import importlib

__version__ = "0.1.0"  # also in _version.py, which the package's own modules read

from keras_attn import _guard  # noqa: F401,E402  (registers SkipNonFiniteSteps)
from keras_attn import errors  # noqa: E402
from keras_attn import layers  # noqa: E402
from keras_attn import models  # noqa: E402
from keras_attn import training  # noqa: E402

_LAZY = ("convert", "export", "viz", "zoo")

__all__ = ["convert", "errors", "export", "layers", "models", "training", "viz", "zoo",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_attn.{name}")
    raise AttributeError(f"module 'keras_attn' has no attribute {name!r}")
