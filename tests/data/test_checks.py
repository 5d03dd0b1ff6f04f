"""Each batch is checked inside the tf.data pipeline, before a compiled step."""

import re

import numpy as np
import pytest
import tensorflow as tf

from _families import FAMILIES
from keras_attn.data.checks import check_batches
from keras_attn.data.checks import data_check_message
from keras_attn.models.bert import BertSequenceClassifier

# The checks run inside tf.data whatever the Keras backend (the model is read
# for its input specs only): the JAX pass would repeat the TensorFlow pass.
pytestmark = pytest.mark.backend_independent


def _bert():
    # the table's; the vocabulary and length the messages below name
    backbone = FAMILIES["bert"].backbone(vocabulary_size=30, max_sequence_length=10)
    return BertSequenceClassifier(backbone, num_classes=2)


def _bert_batches(ids, labels, mask=None):
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
         "padding_mask": np.ones_like(ids) if mask is None else mask}
    return tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)


def _first_error(dataset):
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        for _ in dataset:
            pass
    return data_check_message(error.value)


def test_good_batches_pass_unchanged():
    ids = np.arange(1, 17, dtype="int32").reshape(4, 4)
    batches = list(check_batches(_bert_batches(ids, np.array([0, 1, 1, 0])), _bert()))
    np.testing.assert_array_equal(np.concatenate([b[0]["token_ids"] for b in batches]), ids)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda ids, y, m: ids.__setitem__((3, 1), 30), r"`token_ids` must lie in \[0, 30\)"),
        (lambda ids, y, m: y.__setitem__(2, 2), r"`labels` must lie in \[0, 2\)"),
        (lambda ids, y, m: m.__setitem__((0, 0), 0.4), "`padding_mask` must be boolean or hold only 0 and 1"),
        (lambda ids, y, m: m.__setitem__(2, 0), "`padding_mask` has a row of padding only"),
    ],
)
def test_bad_batches_stop_the_pipeline_naming_the_input(edit, message):
    ids = np.ones((4, 4), "int32")
    labels = np.array([0, 1, 1, 0])
    mask = np.ones((4, 4), "float32")
    edit(ids, labels, mask)
    text = _first_error(check_batches(_bert_batches(ids, labels, mask), _bert()))
    assert text.startswith("keras_attn data check:")
    assert re.search(message, text), text


def test_too_long_sequences_stop_the_pipeline():
    ids = np.ones((2, 11), "int32")
    text = _first_error(check_batches(_bert_batches(ids, np.array([0, 1])), _bert()))
    assert "`token_ids` is longer than max_sequence_length=10" in text


def test_ctc_labels_the_utterance_cannot_emit_stop_the_pipeline():
    model = FAMILIES["conformer"].build()
    x = {"waveform": np.zeros((2, 2000), "float32"),  # 13 frames -> 2 logits
         "waveform_length": np.array([2000, 2000], "int32")}
    labels = np.array([[1, 2, 0], [3, 3, 0]], "int32")  # need 2 and 3 frames
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)
    text = _first_error(check_batches(dataset, model))
    assert "CTC label sequence is longer than its utterance can emit" in text


def test_a_fastconformers_labels_are_checked_against_its_8x_frames():
    # 4,000 samples: 26 feature frames, 7 logits after 4x, 4 after the
    # FastConformer's 8x. A transcript needing 5 frames fits the first only.
    from keras_attn.models.conformer import build_conformer

    model = build_conformer("conformer_tiny", vocabulary_size=5, subsampling="fast",
                            subsampling_filters=4, hidden_dim=16, num_layers=1, num_heads=2,
                            kernel_size=5, num_mel_bins=16, freq_mask_width=4)
    x = {"waveform": np.zeros((2, 4000), "float32"),
         "waveform_length": np.array([4000, 4000], "int32")}
    labels = np.array([[1, 2, 3, 4, 1], [1, 2, 3, 0, 0]], "int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)
    text = _first_error(check_batches(dataset, model))
    assert "can emit after 8x subsampling" in text
    shorter = np.array([[1, 2, 3, 4, 0], [1, 2, 0, 0, 0]], "int32")  # 4 and 2 frames
    fits = tf.data.Dataset.from_tensor_slices((x, shorter)).batch(2)
    assert len(list(check_batches(fits, model))) == 1


def test_a_parakeet_front_ends_labels_are_checked_against_its_frames():
    # 3,900 samples: Parakeet's front end gives 24 feature frames (L // 160,
    # not 1 + L // 160 = 25), 3 logits after 8x (25 frames would give 4).
    from keras_attn.models.conformer import build_conformer

    model = build_conformer("parakeet_ctc_tiny", vocabulary_size=5, subsampling_filters=4,
                            hidden_dim=16, num_layers=1, num_mel_bins=16, freq_mask_width=4)
    x = {"waveform": np.zeros((1, 3900), "float32"), "waveform_length": np.array([3900])}
    labels = np.array([[1, 2, 3, 4]], "int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(1)
    assert "can emit after 8x subsampling" in _first_error(check_batches(dataset, model))


def test_ctc_labels_with_a_zero_inside_stop_the_pipeline():
    model = FAMILIES["conformer"].build()
    x = {"waveform": np.zeros((2, 8000), "float32"),
         "waveform_length": np.array([8000, 8000], "int32")}
    labels = np.array([[1, 0, 2], [3, 4, 0]], "int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)
    text = _first_error(check_batches(dataset, model))
    assert "`labels` must be each transcript ids followed by 0s" in text


def test_a_refused_batch_is_a_data_check_error_by_type():
    """Callers (the command line among them) catch the refusal by its class,
    not by searching TensorFlow's message."""
    from keras_attn.data.checks import data_check_errors
    from keras_attn.errors import DataCheckError
    from keras_attn.errors import KerasAttnError

    ids = np.ones((4, 4), "int32")
    ids[3, 1] = 30
    with pytest.raises(DataCheckError, match=r"`token_ids` must lie in \[0, 30\)") as raised:
        with data_check_errors():
            for _ in check_batches(_bert_batches(ids, np.array([0, 1, 1, 0])), _bert()):
                pass
    assert isinstance(raised.value, (ValueError, KerasAttnError))
    assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)
    # Any other error passes through unchanged.
    with pytest.raises(tf.errors.InvalidArgumentError, match="unrelated"):
        with data_check_errors():
            raise tf.errors.InvalidArgumentError(None, None, "unrelated")
