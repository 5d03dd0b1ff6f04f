"""Streaming a ConformerTransducer (issue 71): the labels streamed chunk by
chunk, the prediction network's state and a TDT walk's skip carried from
chunk to chunk, are the offline model's greedy transcript (the same chunk
mask), on every backend; a bad decoder state is refused by name."""

import keras
import numpy as np
import pytest

from keras_attn.models.conformer import build_conformer_transducer
from keras_attn.models.conformer import transducer_greedy_decode
from test_case import redraw_transducer
from test_case import to_numpy

TINY = dict(num_layers=2, hidden_dim=16, num_heads=2, kernel_size=5, num_mel_bins=20,
            freq_mask_width=4)
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
LENGTHS = np.array([64, 37], "int32")  # feature frames: 16 and 9 encoder frames


def streamable(durations, seed, **overrides):
    """A tiny streamable transducer on features, every weight drawn by
    NumPy (the same model on every backend); the seeds chosen so that the
    walks mix labels, guard moves and (TDT) moves past a chunk's end."""
    fields = dict(TINY, input_type="features", chunk_size=2, left_context=4, causal_conv=True,
                  predictor_dim=8, durations=durations, max_symbols_per_step=3)
    model = build_conformer_transducer("conformer_tiny", vocabulary_size=5,
                                       **dict(fields, **overrides))
    return redraw_transducer(model, seed)


def features(seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((2, int(LENGTHS.max()), 20)).astype("float32")
    return values * (np.arange(values.shape[1])[None, :, None] < LENGTHS[:, None, None])


def stream(model, values, frames_per_step, chunk_size=None):
    """Each row's labels streamed in chunks of `frames_per_step` feature
    frames (the last one padded, each row's valid frames given), then
    flushed; and the largest `decoder/skip` any step left."""
    state = model.initial_state(len(values), chunk_size=chunk_size)
    labels, skip = [[] for _ in values], 0
    for start in range(0, values.shape[1], frames_per_step):
        piece = values[:, start:start + frames_per_step]
        piece = np.pad(piece, ((0, 0), (0, frames_per_step - piece.shape[1]), (0, 0)))
        valid = np.clip(LENGTHS - start, 0, frames_per_step).astype("int32")
        outputs, state = model.stream_step(piece, state, valid, chunk_size=chunk_size)
        _collect(labels, outputs)
        skip = max(skip, int(to_numpy(state["decoder/skip"]).max()))
    outputs, state = model.flush(state, chunk_size=chunk_size)
    _collect(labels, outputs)
    return labels, skip


def _collect(labels, outputs):
    ids = to_numpy(outputs["token_ids"])
    assert ids.dtype == np.int32 and len(ids) == len(labels)
    assert to_numpy(outputs["frames"]).shape[:1] == (len(labels),)
    for row, row_ids in enumerate(ids):
        kept = row_ids[row_ids >= 0]
        assert np.all(row_ids[len(kept):] == -1)  # -1 only after a row's last label
        labels[row] += kept.tolist()


def offline(model, values):
    decoded = model.decode({"features": values, "feature_length": LENGTHS})
    return [row[row > 0].tolist() for row in decoded]


# (durations, seed): a walk of each kind whose labels vary.
CASES = [(None, 1), ([0, 1, 2, 3], 2)]
STEPS = [4, 8, 12] if ON_TENSORFLOW else [8]  # feature frames a step: 1, 2 and 3 encoder frames


@pytest.mark.parametrize("durations, seed", CASES, ids=["rnnt", "tdt"])
def test_streamed_labels_are_the_offline_transcript(durations, seed):
    """The prediction network's state crosses each chunk boundary (a
    stream that restarts it there gives other labels, as does a TDT stream
    that forgets its skip; both checked when this test was written)."""
    model = streamable(durations, seed)
    values = features(seed)
    expected = offline(model, values)
    assert len(set(expected[0] + expected[1])) >= 2, expected  # the walk is not one label
    for frames_per_step in STEPS:
        labels, skip = stream(model, values, frames_per_step)
        assert labels == expected, frames_per_step
        if durations is not None:
            assert skip > 0  # a move went past a chunk's end


def test_another_chunk_size_streams_its_own_chunk_mask():
    """`chunk_size=3` on a model built with 2: the transcript of the
    encoder's frames under a 3-frame chunk mask."""
    model = streamable([0, 1, 2, 3], 2)
    values = features(2)
    reference = model.streamer(3).full_forward_with_chunk_mask(values, LENGTHS)
    expected = transducer_greedy_decode(
        reference["logits"], reference["logit_lengths"], model.predictor, model.joint,
        blank_id=0, durations=model.durations, max_symbols_per_step=3)
    labels, _ = stream(model, values, 12, chunk_size=3)
    assert labels == expected
    assert labels != offline(model, values)  # another chunk mask, another transcript


# The encoder's waveform streaming is tested on every backend in
# test_conformer_streaming.py; the transducer's once.
@pytest.mark.tf_only
def test_a_waveform_model_streams_its_offline_transcript():
    model = streamable(None, 1, input_type="waveform", feature_normalization="none")
    rng = np.random.default_rng(0)
    # Tones that change every 0.1 s: frames that differ.
    t = np.arange(12800) / 16000
    tones = np.repeat(rng.uniform(200, 3000, (2, 8)), 1600, axis=1)
    wave = (0.3 * np.sin(2 * np.pi * tones * t)).astype("float32")
    lengths = np.array([12800, 7000], "int32")
    wave[1, 7000:] = 0
    decoded = model.decode({"waveform": wave, "waveform_length": lengths})
    expected = [row[row > 0].tolist() for row in decoded]
    chunk = 2 * 4 * 160 * 3  # three attention chunks of samples
    state, labels = model.initial_state(2), [[], []]
    for start in range(0, 12800, chunk):
        piece = np.pad(wave[:, start:start + chunk], ((0, 0), (0, max(0, start + chunk - 12800))))
        outputs, state = model.stream_step(piece, state,
                                           np.clip(lengths - start, 0, chunk).astype("int32"))
        _collect(labels, outputs)
    outputs, state = model.flush(state)
    _collect(labels, outputs)
    assert labels == expected and sum(map(len, labels)) > 0


def test_a_bad_decoder_state_is_refused_and_the_callers_is_kept():
    model = streamable([0, 1, 2, 3], 2)
    state = model.initial_state(2)
    piece = features(2)[:, :8]
    _, state = model.stream_step(piece, state)
    held = {name: to_numpy(value).copy() for name, value in state.items()}
    first, _ = model.stream_step(piece, state)
    missing = {name: value for name, value in state.items() if name != "decoder/lstm_1"}
    with pytest.raises(ValueError, match=r"decoder entries.*missing \['decoder/lstm_1'\]"):
        model.stream_step(piece, missing)
    with pytest.raises(ValueError, match=r"state\['decoder/prediction'\] of shape \(2, 4\)"):
        model.stream_step(piece, dict(state, **{"decoder/prediction": np.zeros((2, 4), "float32")}))
    with pytest.raises(ValueError, match=r"decoder/skip.*-1"):
        model.stream_step(piece, dict(state, **{"decoder/skip": np.array([0, -1], "int32")}))
    with pytest.raises(ValueError, match=r"entry 'decoder/skip' must be int32 of shape \(2,\)"):
        model.stream_step(piece, dict(state, **{"decoder/skip": np.zeros((3,), "int32")}))
    second, _ = model.stream_step(piece, state)
    np.testing.assert_array_equal(to_numpy(first["token_ids"]), to_numpy(second["token_ids"]))
    for name, value in held.items():
        np.testing.assert_array_equal(to_numpy(state[name]), value)
