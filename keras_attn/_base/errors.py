"""The exception classes of keras_attn, documented (and re-exported) in
`keras_attn.errors`; defined here, without Keras, so that the command line's
early recipe check (`keras_attn._base.recipe_check`) raises the same classes.
"""


class KerasAttnError(Exception):
    """The base of every exception keras_attn raises on purpose."""


class RecipeError(KerasAttnError, ValueError):
    """A recipe (or a `--set` override) that does not validate."""


class DataCheckError(KerasAttnError, ValueError):
    """A batch refused by the data check of the `tf.data` pipeline."""


class RunDirectoryError(KerasAttnError, ValueError):
    """A run directory that cannot be written or is in use."""


class DataFileError(KerasAttnError, ValueError):
    """A file of the user's own data (a table, an image, a WAV file) that
    cannot be read as it stands: named with its line (or row) and value."""


class CorruptCheckpointError(KerasAttnError, ValueError):
    """A checkpoint that is truncated, edited or otherwise not intact."""


class NonFiniteLossError(KerasAttnError, ValueError):
    """`fit` ended after a step whose loss was NaN or infinite."""


__all__ = [
    "CorruptCheckpointError",
    "DataCheckError",
    "DataFileError",
    "KerasAttnError",
    "NonFiniteLossError",
    "RecipeError",
    "RunDirectoryError",
]
