"""Integers wider than int32 are checked in their own dtype before the cast
to int32, which would wrap them into range silently (issue 57): an int64
2**32 + 3 is 3 after the cast. Where Python runs such a value is refused
naming it; inside a compiled graph the answer it touches is NaN (or -2
tokens) or the pipeline fails, never another value's answer."""

import keras
import numpy as np
import pytest
from keras import ops

WRAP = 2 ** 32  # added to a valid value, it wraps back to that value in int32


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def token_ids_of_a_tokenizer():
    """`pack_pairs` with a tokenizer whose int64 ids lie past int32."""
    import tensorflow as tf
    from keras_attn.data.text import pack_pairs

    class Tokenizer:
        def token_to_id(self, token):
            return {"[CLS]": 1, "[SEP]": 2, "[PAD]": 0}[token]

        def vocabulary_size(self):
            return 10

        def get_vocabulary(self):  # what text_form reads the special tokens from
            return ["[PAD]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(7)]

        def id_to_token(self, i):
            return self.get_vocabulary()[i]

        def __call__(self, texts):
            return tf.RaggedTensor.from_row_lengths(
                tf.constant([5, WRAP + 3], tf.int64), tf.constant([2], tf.int64))

    pack = tf.function(pack_pairs(Tokenizer(), 6))  # as a tf.data map runs it
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocabulary_size=10"):
        pack(tf.constant(["a b"]))


def token_classification_tags():
    from keras_attn.data.text import token_classification_dataset

    with pytest.raises(ValueError, match=r"`tags`.*Received: tags\[0\]\[1\]=.*4294967299"):
        token_classification_dataset([["a", "b"]], [[0, np.int64(WRAP + 3)]], None, 8)


def tfds_image_labels():
    import tensorflow as tf
    from keras_attn.data.images import checked_labels

    assert checked_labels(tf.constant([3], tf.int64), 10).numpy().tolist() == [3]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`label` must lie in \[0, 10\)"):
        checked_labels(tf.constant([WRAP + 3], tf.int64), 10)


def greedy_start_ids():
    from keras_attn.models.transformer.decoding import greedy_search

    def step_fn(last, index, state):
        return ops.one_hot(last + 1, 8), state  # the next token: one past the last

    start = np.array([3, WRAP + 3], "int64")
    with pytest.raises(ValueError, match=r"`start_ids`.*Received: start_ids\[1\]=4294967299"):
        greedy_search(step_fn, ops.zeros((2,)), start, max_length=2, end_id=7)
    if keras.backend.backend() == "tensorflow":  # compiled: no error, the row is -2
        import tensorflow as tf

        search = tf.function(lambda ids: greedy_search(step_fn, tf.zeros((2,)), ids, 2, 7))
        assert search(tf.constant(start)).numpy().tolist() == [[4, 5], [-2, -2]]


def beam_start_ids():
    from keras_attn.models.transformer.decoding import beam_search

    def step_fn(last, index, state):
        return ops.log(ops.one_hot(last + 1, 8) * 0.9 + 0.0125), state

    start = np.array([WRAP + 3], "int64")
    with pytest.raises(ValueError, match=r"`start_ids`.*Received: start_ids\[0\]=4294967299"):
        beam_search(step_fn, ops.zeros((2,)), start, 2, 7, beam_width=2)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tokens, scores = tf.function(
            lambda ids: beam_search(step_fn, tf.zeros((2,)), ids, 2, 7, beam_width=2))(
                tf.constant(start))
        assert tokens.numpy().tolist() == [[-2, -2]] and np.isnan(scores.numpy()).all()


def log_mel_waveform_length():
    from keras_attn.layers.log_mel_features import LogMelFeatures

    layer = LogMelFeatures(num_mel_bins=8, fft_length=64, frame_length=64, frame_step=32)
    waveform = np.random.default_rng(0).uniform(-0.5, 0.5, (2, 320)).astype("float32")
    features = to_numpy(layer(waveform, np.array([100, WRAP + 100], "int64")))
    assert np.isfinite(features[0]).all() and np.isnan(features[1]).all()


@pytest.fixture(scope="module")
def conformer():
    from keras_attn.models import build_conformer

    return build_conformer("conformer_tiny", vocabulary_size=3, num_layers=1)


def conformer_loss_guard(model):
    # The loss's guard sees the batch as the data gives it (int64 from tf.data).
    waveform = np.zeros((2, 800), "float32")
    ok = model.guard_relations({"waveform": waveform,
                                "waveform_length": np.array([800, 700], "int64")})
    wrapped = model.guard_relations({"waveform": waveform,
                                     "waveform_length": np.array([800, WRAP + 700], "int64")})
    assert float(to_numpy(ok)) == 1.0 and np.isnan(float(to_numpy(wrapped)))


def conformer_compiled_call(model):
    # Functional casts the input to int32 (wrapped) before any layer sees it.
    import tensorflow as tf

    waveform = np.random.default_rng(0).uniform(-0.5, 0.5, (2, 3200)).astype("float32")
    call = tf.function(lambda w, n: model({"waveform": w, "waveform_length": n})["logits"])
    logits = call(tf.constant(waveform), tf.constant([3200, WRAP + 3000], tf.int64)).numpy()
    assert np.isfinite(logits[0]).all() and np.isnan(logits[1]).all()


def conformer_packed_feature_length(model):
    from keras_attn.models.conformer.conformer_model import _checked_utterances

    features = np.zeros((1, 12, 80), "float32")
    segment_ids = np.array([[1] * 8 + [0] * 4])
    positions = np.array([list(range(8)) + [0] * 4])
    _checked_utterances(features, segment_ids, positions, np.array([8], "int64"))
    with pytest.raises(ValueError, match=r"feature_length.*Received: feature_length\[0\]="
                                         r"4294967304"):
        _checked_utterances(features, segment_ids, positions, np.array([WRAP + 8], "int64"))


def conformer_streaming_reference(model):
    from keras_attn.models.conformer import ConformerStreamer
    from keras_attn.models.conformer import build_conformer

    streamable = build_conformer("conformer_tiny", vocabulary_size=3, num_layers=1,
                                 chunk_size=2, left_context=2, causal_conv=True,
                                 feature_normalization="none")
    streamer = ConformerStreamer(streamable, chunk_size=2, left_context=2)
    wave = np.zeros((2, 1280), "float32")
    with pytest.raises(ValueError, match=r"`lengths`.*Received: lengths=\[1280, 4294968576\]"):
        streamer.full_forward_with_chunk_mask(wave, np.array([1280, WRAP + 1280], "int64"))


TF = pytest.mark.backends("tensorflow")


@pytest.mark.parametrize("check", [
    pytest.param(token_ids_of_a_tokenizer, marks=TF),
    pytest.param(token_classification_tags, marks=TF),
    pytest.param(tfds_image_labels, marks=TF),
    greedy_start_ids,
    beam_start_ids,
    log_mel_waveform_length,
])
def test_a_wide_id_is_checked_before_its_int32_cast(check):
    check()


@pytest.mark.parametrize("check", [
    conformer_loss_guard,
    pytest.param(conformer_compiled_call, marks=TF),
    conformer_packed_feature_length,
    conformer_streaming_reference,
])
def test_a_wide_conformer_length_is_checked_before_its_int32_cast(check, conformer):
    check(conformer)
