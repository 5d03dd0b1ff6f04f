"""Training pieces: losses, metrics, learning-rate schedules, resumable
training with verified checkpoints (keras.ops only, importable without
TensorFlow)."""

from keras_attn.training.losses import LabelSmoothedCrossEntropy
from keras_attn.training.metrics import MaskedTokenAccuracy
from keras_attn.training.metrics import Perplexity
from keras_attn.training.resumable import ResumableTrainer
from keras_attn.training.resumable import restore_latest
from keras_attn.training.schedules import TransformerSchedule
from keras_attn.training.schedules import transformer_adam
from keras_attn.training.transducer_loss import rnnt_loss
from keras_attn.training.transducer_loss import tdt_loss

__all__ = [
    "LabelSmoothedCrossEntropy",
    "MaskedTokenAccuracy",
    "Perplexity",
    "ResumableTrainer",
    "TransformerSchedule",
    "restore_latest",
    "rnnt_loss",
    "tdt_loss",
    "transformer_adam",
]

# The other packages that register classes, once this one is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
