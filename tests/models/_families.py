"""Tiny models of the four families with inputs, for the tests that run the
same check on every family (LoRA, int8)."""

import keras
import numpy as np

from keras_attn.models import BertSequenceClassifier
from keras_attn.models import build_bert
from keras_attn.models import build_conformer
from keras_attn.models import build_transformer
from keras_attn.models import build_vit
from test_case import to_numpy

RNG = np.random.default_rng(5)


def bert_classifier(**kw):
    backbone = build_bert("bert_tiny", vocabulary_size=40, num_layers=2, hidden_dim=16,
                          intermediate_dim=32, max_sequence_length=16, **kw)
    return BertSequenceClassifier(backbone, num_classes=3)


BERT_INPUTS = {
    "token_ids": RNG.integers(1, 40, (2, 9)).astype("int32"),
    "segment_ids": np.zeros((2, 9), "int32"),
    "padding_mask": np.array([[1] * 9, [1] * 6 + [0] * 3], "int32"),
}
# family -> (build, inputs, the task head's layer names)
FAMILIES = {
    "bert": (bert_classifier, BERT_INPUTS, ("classifier",)),
    "vit": (
        lambda: build_vit("vit_tiny_16", image_size=16, patch_size=4, num_layers=2,
                          hidden_dim=16, num_heads=2, intermediate_dim=32, num_classes=3),
        RNG.integers(0, 256, (2, 16, 16, 3)).astype("uint8"),
        ("classifier",),
    ),
    "transformer": (
        lambda: build_transformer("transformer_base", vocabulary_size=30, hidden_dim=16,
                                  intermediate_dim=32, num_heads=2, num_encoder_layers=1,
                                  num_decoder_layers=1),
        [np.array([[4, 9, 3, 2, 0], [5, 6, 7, 8, 2]], "int32"),
         np.array([[1, 7, 7, 0], [1, 3, 4, 5]], "int32")],
        (),
    ),
    "conformer": (
        lambda: build_conformer("conformer_tiny", vocabulary_size=6, num_layers=2,
                                hidden_dim=16, num_mel_bins=20, freq_mask_width=8),
        {"waveform": (RNG.standard_normal((2, 4000)) * 0.1).astype("float32"),
         "waveform_length": np.array([4000, 3000], "int32")},
        ("ctc_logits",),
    ),
}



def outputs(model, inputs):
    """Every output of `model` on `inputs` (inference), as NumPy arrays.

    On JAX through `predict_on_batch` (one compiled program): called op by
    op, JAX compiles every primitive of the model on its first call, which
    made these tests ~2x slower there. Elsewhere a plain call."""
    if keras.backend.backend() == "jax":
        return [to_numpy(o) for o in keras.tree.flatten(model.predict_on_batch(inputs))]
    return [to_numpy(o) for o in keras.tree.flatten(model(inputs, training=False))]
