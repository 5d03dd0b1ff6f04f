"""The exception classes of keras_attn, for callers that catch by type.

Every class derives from `KerasAttnError`. The ones for bad input are also
`ValueError`s, as they were before these classes existed, so code that
catches `ValueError` keeps working:

- `RecipeError`: a recipe key is missing, unknown or out of range.
- `DataCheckError`: a batch of training data was refused by the check inside
  the `tf.data` pipeline (an id, mask or length out of range).
- `RunDirectoryError`: a run's output directory cannot be used (a file, not
  writable, or being trained by another process).
- `CorruptCheckpointError`: a checkpoint file is not intact.
- `NonFiniteLossError`: `fit` stopped after a step whose loss was not finite
  (the step changed no weight).

>>> issubclass(RecipeError, ValueError) and issubclass(RecipeError, KerasAttnError)
True
"""


class KerasAttnError(Exception):
    """The base of every exception keras_attn raises on purpose."""


class RecipeError(KerasAttnError, ValueError):
    """A recipe (or a `--set` override) that does not validate."""


class DataCheckError(KerasAttnError, ValueError):
    """A batch refused by the data check of the `tf.data` pipeline."""


class RunDirectoryError(KerasAttnError, ValueError):
    """A run directory that cannot be written or is in use."""


class CorruptCheckpointError(KerasAttnError, ValueError):
    """A checkpoint that is truncated, edited or otherwise not intact."""


class NonFiniteLossError(KerasAttnError, ValueError):
    """`fit` ended after a step whose loss was NaN or infinite."""


__all__ = [
    "CorruptCheckpointError",
    "DataCheckError",
    "KerasAttnError",
    "NonFiniteLossError",
    "RecipeError",
    "RunDirectoryError",
]
