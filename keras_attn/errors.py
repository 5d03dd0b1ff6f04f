"""The exception classes of keras_attn, for callers that catch by type
(defined in `keras_attn._base.errors`, which imports no Keras, so that the
command line raises the same classes before Keras is imported).

Every class derives from `KerasAttnError`. The ones for bad input are also
`ValueError`s, so code that catches `ValueError` keeps working:

- `RecipeError`: a recipe key is missing, unknown or out of range.
- `DataCheckError`: a batch of training data was refused by the check inside
  the `tf.data` pipeline (an id, mask or length out of range).
- `DataFileError`: a file of your own data (`keras_attn.data.load_*_files`,
  a recipe's `files:` dataset, `keras-attn transcribe`) was refused: a
  value the task cannot read, naming the file, the line (or row), the field
  and the value.
- `RunDirectoryError`: a run's output directory cannot be used (a file, not
  writable, or being trained by another process).
- `CorruptCheckpointError`: a checkpoint file is not intact.
- `NonFiniteLossError`: `fit` stopped after a step whose loss was not finite
  (the step changed no weight).

>>> issubclass(RecipeError, ValueError) and issubclass(RecipeError, KerasAttnError)
True
"""

# `X as X`: re-exported (the names are those of keras_attn._base.errors.__all__).
from keras_attn._base.errors import CorruptCheckpointError as CorruptCheckpointError
from keras_attn._base.errors import DataCheckError as DataCheckError
from keras_attn._base.errors import DataFileError as DataFileError
from keras_attn._base.errors import KerasAttnError as KerasAttnError
from keras_attn._base.errors import NonFiniteLossError as NonFiniteLossError
from keras_attn._base.errors import RecipeError as RecipeError
from keras_attn._base.errors import RunDirectoryError as RunDirectoryError
from keras_attn._base.errors import __all__  # noqa: F401  (the same names)
