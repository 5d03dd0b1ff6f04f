"""tf.data pipelines and dataset loaders.

Your own files to batches: `load_text_classification_files`,
`load_token_classification_files`, `load_image_files`, `load_speech_files`,
`load_translation_files` (they return a `FilesData`), and the text helpers
beneath them (`train_wordpiece_vocabulary`, `make_tokenizer`,
`classification_dataset`, `token_classification_dataset`); packing
(`pack_rows`, ...). Importing this package imports no TensorFlow: the text
helpers load `keras_attn.data.text` (TensorFlow) on first use, and the file
loaders import their pipelines when called. The other submodules
(`keras_attn.data.images`, ...) are imported by name.
"""

import importlib
import typing

from keras_attn.data.files import FilesData
from keras_attn.data.files import load_image_files
from keras_attn.data.files import load_speech_files
from keras_attn.data.files import load_text_classification_files
from keras_attn.data.files import load_token_classification_files
from keras_attn.data.files import load_translation_files
from keras_attn.data.packing import pack_rows
from keras_attn.data.packing import pack_sequences
from keras_attn.data.packing import pack_utterances
from keras_attn.data.packing import packing_fill

if typing.TYPE_CHECKING:  # for readers and the API reference; loaded lazily below
    from keras_attn.data.text import classification_dataset
    from keras_attn.data.text import make_tokenizer
    from keras_attn.data.text import token_classification_dataset
    from keras_attn.data.text import train_wordpiece_vocabulary

# name -> the submodule that defines it (TensorFlow: imported on first use).
_LAZY = {
    "train_wordpiece_vocabulary": "text",
    "make_tokenizer": "text",
    "classification_dataset": "text",
    "token_classification_dataset": "text",
}

__all__ = [
    "FilesData", "load_text_classification_files", "load_token_classification_files",
    "load_image_files", "load_speech_files", "load_translation_files",
    *_LAZY, "pack_rows", "pack_sequences", "pack_utterances", "packing_fill",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"keras_attn.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'keras_attn.data' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
