"""Deployment formats (SavedModel, ONNX, LiteRT). TensorFlow and the
converters are imported only when a function here runs."""

from keras_attn.export.image_classifier import export_image_classifier
from keras_attn.export.portable import Artifact
from keras_attn.export.portable import export_portable
from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.speech_recognizer import export_speech_recognizer
from keras_attn.export.streaming import export_streaming
from keras_attn.export.text_classifier import export_text_classifier
from keras_attn.export.translator import export_translator

__all__ = [
    "Artifact",
    "export_portable",
    "export_image_classifier",
    "export_saved_model",
    "export_speech_recognizer",
    "export_streaming",
    "export_text_classifier",
    "export_translator",
]
