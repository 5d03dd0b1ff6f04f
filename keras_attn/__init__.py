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

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402
from importlib.util import find_spec as _find_spec  # noqa: E402

from keras_attn_base.quiet_tensorflow import holding_back_notices as _holding_back  # noqa: E402

from keras_attn import errors  # noqa: E402  (Keras-free)

# On a deployment machine, which has NumPy and a runtime (onnxruntime,
# ai-edge-litert) but no Keras, the package imports without it: the
# Keras-free modules (`keras_attn.export.portable`'s `Artifact`,
# `keras_attn.export.streaming_runtime`, `keras_attn.data.packing`) work, and
# `layers`, `models`, `training` say Keras is missing when asked for. Where
# Keras is installed, it is imported here and every class registered.
_HAS_KERAS = "keras" in _sys.modules or _find_spec("keras") is not None
# Imported first here, Keras (and TensorFlow on its TensorFlow backend) loads
# without the C++ start-up notices that no setting turns off (absl's, oneDNN's,
# "Could not find cuda drivers"), and with TensorFlow's INFO lines off unless
# TF_CPP_MIN_LOG_LEVEL says otherwise (warnings and errors still show).
# Where Keras or TensorFlow is already imported, nothing changes.
if _HAS_KERAS and "keras" not in _sys.modules and "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with _holding_back():
        import keras  # noqa: E402,F401

if _HAS_KERAS:
    from keras_attn import _guard  # noqa: F401,E402  (registers SkipNonFiniteSteps)
    from keras_attn import layers  # noqa: E402
    from keras_attn import models  # noqa: E402
    from keras_attn import training  # noqa: E402

_LAZY = ("convert", "export", "viz", "zoo") + (() if _HAS_KERAS else ("layers", "models",
                                                                       "training"))

__all__ = ["convert", "errors", "export", "layers", "models", "training", "viz", "zoo",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_attn.{name}")
    raise AttributeError(f"module 'keras_attn' has no attribute {name!r}")
