"""The packing contract for the Conformer (TensorFlow, JAX and PyTorch):
utterances packed into rows of feature frames (`pack_utterances`, each
starting at a multiple of the subsampling's 4 frames, no longer gap) give
every utterance at inference the logits (<= 1e-5) and the CTC loss it gets
alone, and in training the gradient it gets alone (LayerNorm in the
convolution module) or padded with the same batch (BatchNorm, whose batch
statistics mix the batch's utterances whether packed or padded); without
the packed inputs the model computes what it computed before; a bad packing
is a ValueError naming the input in an eager call and NaN for that row only
inside a compiled step."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.data.packing import pack_utterances
from keras_attn.models.conformer import build_conformer
from keras_attn.models.conformer.conformer_model import unpack_utterances
from _packing_checks import check_fit_lowers_the_loss
from _packing_checks import check_only_the_bad_row_is_nan_when_compiled
from test_case import assert_all_close
from test_case import to_numpy
from test_case import training_step_results

VOCAB = 6
MELS = 16
ROW = 64
LENGTHS = (23, 40, 17, 31, 12, 28, 9)  # feature frames of each utterance
CHUNKED = dict(chunk_size=2, left_context=3, causal_conv=True)


def _model(**overrides):
    keras.utils.set_random_seed(2)
    config = dict(vocabulary_size=VOCAB, input_type="features", num_mel_bins=MELS,
                  num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=24,
                  kernel_size=5, dropout=0.0, attention_dropout=0.0,
                  freq_mask_count=0, time_mask_count=0)
    config.update(overrides)
    return build_conformer("conformer_tiny", **config)


def _utterances(seed=0):
    """Each utterance: feature frames `(L, MELS)` and a transcript short
    enough for its logits."""
    rng = np.random.default_rng(seed)
    return [{"features": rng.standard_normal((n, MELS)).astype("float32"),
             "labels": rng.integers(1, VOCAB + 1, max(1, (n - 7) // 8)).astype("int32")}
            for n in LENGTHS]


def _alone(utterance):
    return {"features": utterance["features"][None],
            "feature_length": np.array([len(utterance["features"])], "int32")}


def _pack(utterances):
    """Packed inputs and `(R, K, L)` labels, and each utterance's (row,
    slot) in the packed rows."""
    packed = pack_utterances([u["features"] for u in utterances], ROW,
                             labels=[u["labels"] for u in utterances], buffer_size=4)
    assert packed["example_ids"].shape[1] > 1  # some row holds several utterances
    where = {int(index): (row, slot) for row, ids in enumerate(packed["example_ids"])
             for slot, index in enumerate(ids[ids >= 0])}
    inputs = {"features": packed["inputs"].astype("float32"),
              "feature_length": np.full(len(packed["inputs"]), ROW, "int32"),
              "segment_ids": packed["segment_ids"], "positions": packed["positions"]}
    return inputs, packed["labels"], where


def _padded(utterances):
    """`utterances` padded one per row: inputs and labels. Each row's
    outputs are those of its utterance alone, padding masked and rows
    independent (test_without_the_packed_inputs_the_model_computes_as_before
    checks it against calls at each utterance's own length): the
    utterances' references at one shape, where on JAX each call at its own
    length compiled every op of the model again."""
    rows, longest = len(utterances), max(LENGTHS)
    features = np.zeros((rows, longest, MELS), "float32")
    labels = np.zeros((rows, max(len(u["labels"]) for u in utterances)), "int32")
    for i, u in enumerate(utterances):
        features[i, :len(u["features"])] = u["features"]
        labels[i, :len(u["labels"])] = u["labels"]
    lengths = np.array([len(u["features"]) for u in utterances], "int32")
    return {"features": features, "feature_length": lengths}, labels


def test_pack_utterances_starts_each_utterance_at_a_multiple_of_the_alignment():
    utterances = _utterances()
    packed = pack_utterances([u["features"] for u in utterances], ROW,
                             labels=[u["labels"] for u in utterances], buffer_size=4)
    ids, positions = packed["segment_ids"], packed["positions"]
    for row, examples in enumerate(packed["example_ids"]):
        for slot, index in enumerate(examples[examples >= 0]):
            frames = np.flatnonzero(ids[row] == slot + 1)
            assert frames[0] % 4 == 0 and len(frames) == LENGTHS[index]
            np.testing.assert_array_equal(positions[row, frames], np.arange(len(frames)))
            np.testing.assert_array_equal(packed["inputs"][row, frames],
                                          utterances[index]["features"])
            assert packed["lengths"][row, slot] == LENGTHS[index]
            labels = packed["labels"][row, slot]
            np.testing.assert_array_equal(labels[labels > 0], utterances[index]["labels"])
    with pytest.raises(ValueError, match="`row_length`: it must be a multiple of alignment=4"):
        pack_utterances([np.ones((3, 2))], 10)
    with pytest.raises(ValueError, match="`features`: every example must hold 1 to 8"):
        pack_utterances([np.ones((7, 2)), np.ones((9, 2))], 8)


# === Outputs ===


@pytest.mark.parametrize("variant", [{}, CHUNKED], ids=["offline", "chunked"])
def test_each_packed_utterance_gets_its_logits_alone(variant):
    model, utterances = _model(**variant), _utterances()
    inputs, _, where = _pack(utterances)
    out = {k: to_numpy(v) for k, v in model(inputs).items()}
    ids = out["logit_segment_ids"]
    reference = model(_padded(utterances)[0])
    logits, lengths = to_numpy(reference["logits"]), to_numpy(reference["logit_lengths"])
    for index, (row, slot) in where.items():
        alone = logits[index, :lengths[index]]
        got = out["logits"][row][ids[row] == slot + 1]
        assert got.shape == alone.shape, f"utterance {index}"
        np.testing.assert_allclose(got, alone, rtol=0, atol=1e-5, err_msg=f"utterance {index}")
    unpacked, lengths = unpack_utterances(out["logits"], ids, ids.max())
    row, slot = where[1]
    np.testing.assert_allclose(to_numpy(unpacked)[row, slot, :to_numpy(lengths)[row, slot]],
                               out["logits"][row][ids[row] == slot + 1], rtol=0, atol=0)


@pytest.mark.parametrize("variant", [{}, CHUNKED], ids=["offline", "chunked"])
def test_without_the_packed_inputs_the_model_computes_as_before(variant):
    # Both variants: each is the padded-row reference of the packed tests.
    model, utterances = _model(**variant), _utterances()
    padded, _ = _padded(utterances)  # the other tests' reference shape
    out = model(padded)
    assert sorted(out) == ["logit_lengths", "logits"]
    for i, u in enumerate(utterances[:2]):
        alone = to_numpy(model(_alone(u))["logits"])[0]
        np.testing.assert_allclose(to_numpy(out["logits"])[i, :len(alone)], alone,
                                   rtol=0, atol=1e-5)


# === Loss and gradient ===


def test_packed_batch_loss_is_the_padded_batch_loss():
    """The compiled CTC loss (the mean over utterances) of the packed rows,
    `(R, K, L)` labels, equals that of the same utterances padded one per
    row: each utterance's CTC loss is its own."""
    model, utterances = _model(), _utterances()
    model.compile(optimizer="sgd")
    inputs, labels, _ = _pack(utterances)
    padded, padded_labels = _padded(utterances)

    def loss(x, y):
        return float(to_numpy(model.compute_loss(x=x, y=y, y_pred=model(x), training=False)))

    padded_loss = loss(padded, padded_labels)
    assert np.isfinite(padded_loss)
    np.testing.assert_allclose(loss(inputs, labels), padded_loss, rtol=1e-5)


def test_packed_rows_weigh_their_utterances_as_sample_weight_says():
    """`sample_weight` `(R,)` of packed rows: each utterance weighs its
    row's weight, as the same utterances padded one per row with those
    weights (a row of weight 0, a filler of several replicas, adds nothing)."""
    model, utterances = _model(), _utterances()
    model.compile(optimizer="sgd")
    inputs, labels, where = _pack(utterances)
    padded, padded_labels = _padded(utterances)
    rows = len(labels)
    weights = np.arange(rows, dtype="float32") % 3  # 0, 1, 2, 0, ...
    per_utterance = np.array([weights[where[i][0]] for i in range(len(utterances))])

    def loss(x, y, w):
        return float(to_numpy(model.compute_loss(x=x, y=y, y_pred=model(x), sample_weight=w,
                                                 training=False)))

    expected = loss(padded, padded_labels, per_utterance)
    assert np.isfinite(expected)
    np.testing.assert_allclose(loss(inputs, labels, weights), expected, rtol=1e-5)
    assert not np.isclose(expected, loss(padded, padded_labels, None), rtol=1e-4)


def _summed_ctc(logits, lengths, labels):
    """CTC losses of `labels` `(N, L)` summed over the utterances."""
    labels = ops.convert_to_tensor(labels)
    return ops.sum(ops.ctc_loss(labels, ops.cast(logits, "float32"),
                                ops.sum(ops.cast(labels > 0, "int32"), axis=1),
                                ops.cast(lengths, "int32"), mask_index=0))


def _packed_summed_ctc(outputs, labels):
    slots = labels.shape[1]
    logits, lengths = unpack_utterances(outputs["logits"], outputs["logit_segment_ids"], slots)
    present = np.any(labels > 0, axis=2).reshape(-1)
    rows = np.flatnonzero(present)
    flat = ops.reshape(logits, (-1, logits.shape[2], logits.shape[3]))
    return _summed_ctc(ops.take(flat, rows, axis=0),
                       ops.take(ops.reshape(lengths, (-1,)), rows, axis=0),
                       labels.reshape(-1, labels.shape[2])[rows])


def _assert_gradients_close(expected, got):
    """Equal within 1e-5 of the largest gradient entry. float32 sums differ
    with their order by ~1e-6 of the terms summed: the CTC gradients of the
    subsampling's kernels reach ~30, and a weight whose gradient cancels
    (the depthwise bias before BatchNorm, 0 in theory) sums terms of that
    size to ~1e-6, with ~1e-5 of rounding."""
    assert len(expected) == len(got)
    scale = max(1.0, max(float(np.abs(a).max()) for a in expected))
    for i, (a, b) in enumerate(zip(expected, got)):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * scale,
                                   err_msg=f"weight gradient #{i}")


def test_gradient_is_the_sum_of_the_utterances_gradients():
    """With LayerNorm in the convolution module nothing mixes utterances:
    the weight gradient of packed rows is the sum of the utterances'."""
    model, utterances = _model(conv_norm="layer_norm"), _utterances()
    inputs, labels, _ = _pack(utterances)
    _, grads, _ = training_step_results(model, inputs,
                                        lambda out: _packed_summed_ctc(out, labels))
    # The utterances' gradients summed in one step: one per row, each row
    # its utterance alone (see _padded), the loss their sum. On JAX a
    # step per utterance compiled the model's training step once each.
    padded, padded_labels = _padded(utterances)
    _, total, _ = training_step_results(model, padded, lambda out: _summed_ctc(
        out["logits"], out["logit_lengths"], padded_labels))
    assert sum(float(np.abs(g).max() > 0) for g in grads) > len(grads) // 2
    _assert_gradients_close(total, grads)


def test_with_batch_norm_packed_training_matches_the_padded_batch():
    """BatchNorm's batch statistics mix the utterances of a batch, over its
    real frames: packed or padded, the same utterances give the same
    statistics, so the same gradient (alone they would differ)."""
    utterances = _utterances()
    inputs, labels, _ = _pack(utterances)
    padded, padded_labels = _padded(utterances)
    # Two models with the same weights: a step updates the moving statistics.
    _, packed_grads, packed_state = training_step_results(
        _model(), inputs, lambda out: _packed_summed_ctc(out, labels))
    _, padded_grads, padded_state = training_step_results(
        _model(), padded, lambda out: _summed_ctc(out["logits"], out["logit_lengths"],
                                                  padded_labels))
    _assert_gradients_close(padded_grads, packed_grads)
    assert_all_close(packed_state, padded_state, atol=1e-5, what="BatchNorm statistics")


# === Bad packings ===


def _multi_utterance_row(inputs):
    return int(np.argmax(inputs["segment_ids"].max(axis=1) >= 2))


def _shifted_start(inputs):
    """`inputs` with the second utterance of a row starting 2 frames late
    (its first 2 frames made a gap): no longer aligned to 4."""
    row = _multi_utterance_row(inputs)
    ids, positions = inputs["segment_ids"].copy(), inputs["positions"].copy()
    frames = np.flatnonzero(ids[row] == 2)
    ids[row, frames[:2]] = 0
    positions[row, frames] = positions[row, frames] - 2
    positions[row, frames[:2]] = 0
    return dict(inputs, segment_ids=ids, positions=positions), row


def test_a_bad_packing_is_refused_naming_the_input():
    model, utterances = _model(), _utterances()
    inputs, _, _ = _pack(utterances)
    with pytest.raises(ValueError, match="`segment_ids`: each utterance must start at a "
                                         "multiple of 4 frames"):
        model(_shifted_start(inputs)[0])
    ids = inputs["segment_ids"].copy()
    row = _multi_utterance_row(inputs)
    ids[row, np.flatnonzero(ids[row] == 2)[-1]] = 1  # back to utterance 1
    with pytest.raises(ValueError, match="`segment_ids`: the frames of a row's k utterances"):
        model(dict(inputs, segment_ids=ids))
    with pytest.raises(ValueError, match="`positions`"):
        model(dict(inputs, positions=inputs["positions"] + 1))
    with pytest.raises(ValueError, match="`feature_length`: it must not end a row"):
        model(dict(inputs, feature_length=inputs["feature_length"] - 8))
    with pytest.raises(ValueError, match=r"need all of \['segment_ids', 'positions'\]"):
        model({k: v for k, v in inputs.items() if k != "positions"})
    with pytest.raises(ValueError, match="`segment_ids`.*dtype=float32"):
        model(dict(inputs, segment_ids=inputs["segment_ids"].astype("float32")))


def test_a_waveform_model_refuses_packed_inputs():
    model = _model(input_type="waveform", num_mel_bins=MELS)
    inputs = {"waveform": np.zeros((1, 1600), "float32"),
              "waveform_length": np.array([1600], "int32"),
              "segment_ids": np.ones((1, 11), "int32"),
              "positions": np.arange(11, dtype="int32")[None]}
    with pytest.raises(ValueError, match="input_type='waveform'"):
        model(inputs)


def test_labels_must_give_one_transcript_per_utterance():
    model, utterances = _model(), _utterances()
    model.compile(optimizer="sgd")
    inputs, labels, _ = _pack(utterances)
    with pytest.raises(ValueError, match="`labels`: packed rows need one transcript per "
                                         "utterance.*K=1"):
        model.fit(inputs, labels[:, :1], epochs=1, verbose=0)
    extra = np.concatenate([labels, np.ones_like(labels[:, :1])], axis=1)
    with pytest.raises(ValueError, match="`labels`: a transcript for an utterance the row "
                                         "does not hold"):
        model.fit(inputs, extra, epochs=1, verbose=0)


def test_a_bad_packing_in_a_compiled_step_makes_that_row_nan_only():
    model, utterances = _model(), _utterances()
    inputs, _, _ = _pack(utterances)
    bad, row = _shifted_start(inputs)
    check_only_the_bad_row_is_nan_when_compiled(model, inputs, bad, row)


# === fit ===


def test_fit_on_packed_rows_lowers_the_loss():
    inputs, labels, _ = _pack(_utterances())
    # One block: `fit` traces the model, and what it checks (packed rows
    # train on this backend, SpecAugment on) does not depend on the depth;
    # the packed logits and gradients are checked on two blocks above.
    check_fit_lowers_the_loss(_model(num_layers=1, freq_mask_count=1, time_mask_count=1),
                              inputs, labels, learning_rate=3e-3)
