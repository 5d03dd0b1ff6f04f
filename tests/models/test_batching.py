"""An example's answer never depends on what else is in its batch or on
its padding: every family, inference and training mode (dropout off,
SpecAugment off, so that training mode is deterministic). Runs in CI's
TensorFlow and JAX passes."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.bert import build_bert
from keras_attn.models.conformer import build_conformer
from keras_attn.models.transformer import build_transformer
from keras_attn.models.vit import build_vit

ATOL = 1e-5
MODES = [False, True]  # training


def _np(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("training", MODES)
@pytest.mark.parametrize("fill", ["zeros", "noise"])
def test_bert_outputs_ignore_padding_and_batch_mates(training, fill):
    model = build_bert("bert_tiny", vocabulary_size=50, num_layers=2, hidden_dim=16,
                       num_heads=2, intermediate_dim=32, max_sequence_length=16,
                       dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (1, 5)).astype("int32")
    alone = model({"token_ids": ids, "segment_ids": np.zeros_like(ids),
                   "padding_mask": np.ones_like(ids)}, training=training)
    batch = rng.integers(1, 50, (3, 11)).astype("int32")  # batch mates of length 11
    mask = np.ones_like(batch)
    batch[1, :5], mask[1, 5:] = ids[0], 0
    if fill == "zeros":
        batch[1, 5:] = 0
    segments = rng.integers(0, 2, batch.shape).astype("int32")
    segments[1, :5] = 0
    out = model({"token_ids": batch, "segment_ids": segments, "padding_mask": mask},
                training=training)
    np.testing.assert_allclose(_np(out["sequence_output"])[1, :5],
                               _np(alone["sequence_output"])[0], atol=ATOL)
    np.testing.assert_allclose(_np(out["pooled_output"])[1], _np(alone["pooled_output"])[0],
                               atol=ATOL)


@pytest.mark.parametrize("training", MODES)
def test_transformer_logits_ignore_padding_and_batch_mates(training):
    model = build_transformer("transformer_base", vocabulary_size=30, hidden_dim=16,
                              intermediate_dim=32, num_heads=2, num_encoder_layers=2,
                              num_decoder_layers=2, dropout=0.0)
    rng = np.random.default_rng(1)
    source = rng.integers(1, 30, (1, 6)).astype("int32")
    target = rng.integers(1, 30, (1, 4)).astype("int32")
    alone = _np(model([source, target], training=training))
    sources = rng.integers(1, 30, (3, 10)).astype("int32")
    targets = rng.integers(1, 30, (3, 9)).astype("int32")
    sources[2] = 0
    sources[2, :6] = source[0]
    targets[2] = 0
    targets[2, :4] = target[0]
    out = _np(model([sources, targets], training=training))
    np.testing.assert_allclose(out[2, :4], alone[0], atol=ATOL)


@pytest.mark.parametrize("training", MODES)
def test_vit_logits_ignore_batch_mates(training):
    model = build_vit("vit_tiny_16", num_classes=4, image_size=8, patch_size=4,
                      num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
                      dropout=0.0)
    images = np.random.default_rng(2).integers(0, 256, (5, 8, 8, 3)).astype("uint8")
    alone = _np(model(images[3:4], training=training))
    out = _np(model(images, training=training))
    np.testing.assert_allclose(out[3], alone[0], atol=ATOL)


def _conformer():
    return build_conformer("conformer_tiny", vocabulary_size=6, num_layers=2,
                           hidden_dim=16, num_heads=2, intermediate_dim=32, kernel_size=5,
                           dropout=0.0, freq_mask_count=0, time_mask_count=0)


@pytest.mark.parametrize("fill", ["zeros", "noise"])
def test_conformer_logits_ignore_padding_and_batch_mates(fill):
    model = _conformer()
    rng = np.random.default_rng(3)
    speech = (rng.normal(size=6000) * 0.1).astype("float32")
    alone = model({"waveform": speech[None], "waveform_length": np.array([6000])})
    n = int(_np(alone["logit_lengths"])[0])
    waveform = (rng.normal(size=(3, 9000)) * 0.3).astype("float32")
    if fill == "zeros":
        waveform[1, 6000:] = 0.0
    waveform[1, :6000] = speech
    out = model({"waveform": waveform, "waveform_length": np.array([9000, 6000, 8000])})
    assert int(_np(out["logit_lengths"])[1]) == n
    np.testing.assert_allclose(_np(out["logits"])[1, :n], _np(alone["logits"])[0], atol=ATOL)


def test_conformer_training_outputs_ignore_padding():
    """In training mode BatchNorm normalises with the batch's statistics, so
    the batch mates matter by design; the padding must not: the same batch
    padded more, with noise in the padding, gives the same valid outputs."""
    model = _conformer()
    rng = np.random.default_rng(4)
    lengths = np.array([5000, 7000])
    short = np.zeros((2, 7000), "float32")
    for i, n in enumerate(lengths):
        short[i, :n] = rng.normal(size=n) * 0.1
    long = (rng.normal(size=(2, 9600)) * 0.5).astype("float32")
    long[:, :7000] = short
    long[0, 5000:7000] = rng.normal(size=2000)
    a = model({"waveform": short, "waveform_length": lengths}, training=True)
    b = model({"waveform": long, "waveform_length": lengths}, training=True)
    for i in range(2):
        n = int(_np(a["logit_lengths"])[i])
        np.testing.assert_allclose(_np(b["logits"])[i, :n], _np(a["logits"])[i, :n], atol=ATOL)
