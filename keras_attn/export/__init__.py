"""Deployment formats. TensorFlow is imported only when a function here runs."""

from keras_attn.export.image_classifier import export_image_classifier
from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.translator import export_translator

__all__ = ["export_image_classifier", "export_saved_model", "export_translator"]
