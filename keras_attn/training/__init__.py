"""Training pieces: losses, metrics, learning-rate schedules (keras.ops only,
importable without TensorFlow)."""

from keras_attn.training.losses import LabelSmoothedCrossEntropy
from keras_attn.training.metrics import MaskedTokenAccuracy
from keras_attn.training.schedules import TransformerSchedule
from keras_attn.training.schedules import transformer_adam

__all__ = [
    "LabelSmoothedCrossEntropy",
    "MaskedTokenAccuracy",
    "TransformerSchedule",
    "transformer_adam",
]
