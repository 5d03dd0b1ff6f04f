"""Deployment formats (SavedModel, ONNX, LiteRT). TensorFlow and the
converters are imported only when a function here runs; the exporters are
imported on first use, so that `keras_attn.export.portable` (`Artifact`),
`keras_attn.export.streaming_runtime`, `keras_attn.export.text_runtime`
(`TextClassifierArtifact`, with the `tokenizers` package) and
`keras_attn.export.speech_runtime` (`SpeechRecognizerArtifact`) load with
NumPy alone on a machine without Keras."""

import importlib
import typing

if typing.TYPE_CHECKING:  # for readers and the API reference; loaded lazily below
    from keras_attn.export.image_classifier import export_image_classifier
    from keras_attn.export.portable import Artifact
    from keras_attn.export.portable import export_portable
    from keras_attn.export.saved_model import export_saved_model
    from keras_attn.export.speech_recognizer import export_speech_recognizer
    from keras_attn.export.speech_runtime import SpeechRecognizerArtifact
    from keras_attn.export.streaming import export_streaming
    from keras_attn.export.text_classifier import export_text_classifier
    from keras_attn.export.text_runtime import TextClassifierArtifact
    from keras_attn.export.translator import export_translator

# name -> the submodule that defines it.
_LAZY = {
    "Artifact": "portable",
    "export_portable": "portable",
    "export_image_classifier": "image_classifier",
    "export_saved_model": "saved_model",
    "export_speech_recognizer": "speech_recognizer",
    "export_streaming": "streaming",
    "export_text_classifier": "text_classifier",
    "export_translator": "translator",
    "TextClassifierArtifact": "text_runtime",
    "SpeechRecognizerArtifact": "speech_runtime",
}

__all__ = [
    "Artifact",
    "export_portable",
    "export_image_classifier",
    "export_saved_model",
    "export_speech_recognizer",
    "export_streaming",
    "export_text_classifier",
    "export_translator",
    "TextClassifierArtifact",
    "SpeechRecognizerArtifact",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"keras_attn.export.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'keras_attn.export' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
