"""tf.data pipelines and dataset loaders. Packing is NumPy only and
exported here; the names for your own files (`load_*_files`, `FilesData`,
`keras_attn.data.files`) and the tokenizer helpers are TensorFlow's, loaded
on first use, so that importing `keras_attn` never imports TensorFlow; the
other submodules (`keras_attn.data.images`, ...) are imported by name."""

import importlib

from keras_attn.data.packing import pack_rows
from keras_attn.data.packing import pack_sequences
from keras_attn.data.packing import packing_fill

# name -> the submodule that defines it (imported on first use).
_LAZY = {
    "FilesData": "files",
    "load_text_classification_files": "files",
    "load_token_classification_files": "files",
    "load_image_files": "files",
    "load_speech_files": "files",
    "load_translation_files": "files",
    "train_wordpiece_vocabulary": "text",
    "make_tokenizer": "text",
    "classification_dataset": "text",
    "token_classification_dataset": "text",
}

__all__ = ["pack_rows", "pack_sequences", "packing_fill", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"keras_attn.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'keras_attn.data' has no attribute {name!r}")
