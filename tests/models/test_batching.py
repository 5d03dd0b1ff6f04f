"""An example's answer never depends on what else is in its batch or on
its padding, beyond what `run_model_test` checks on each family's task
outputs (tests/models/test_<family>.py): the BERT backbone's every token, and
the Conformer in training mode (dropout off, SpecAugment off, so that
training mode is deterministic)."""

import numpy as np
import pytest
from keras import ops

from _families import FAMILIES

ATOL = 1e-5
MODES = [False, True]  # training


def _np(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("training", MODES)
@pytest.mark.parametrize("fill", ["zeros", "noise"])
def test_bert_outputs_ignore_padding_and_batch_mates(training, fill):
    # the table's, on the 50 ids drawn below; dropout off
    model = FAMILIES["bert"].backbone(vocabulary_size=50, dropout=0.0, attention_dropout=0.0)
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


def _conformer():
    return FAMILIES["conformer"].build(kernel_size=5, dropout=0.0, freq_mask_count=0,
                                       time_mask_count=0)


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
