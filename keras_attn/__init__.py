"""keras_attn: attention layers for Keras 3 and the models built from them.

Importing the package registers every serializable class (layers, the four
model families, losses, metrics, schedules and the optimizer guard), so
`keras.saving.load_model("run/model.keras")` needs no other import.
"""

__version__ = "0.1.0"

from keras_attn import _guard  # noqa: F401  (registers SkipNonFiniteSteps)
from keras_attn import layers
from keras_attn import models
from keras_attn import training

__all__ = ["layers", "models", "training", "__version__"]
