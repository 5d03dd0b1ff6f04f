"""The packing contract at the model level (TensorFlow, JAX and PyTorch):
BERT's backbone and pretrainer give every example of a packed row the
outputs (<= 1e-5), the loss and the gradient contribution it gets alone,
whatever else is in its row; without the packed inputs they compute what
they computed before; a bad packing is a ValueError in an eager call and
NaN for that row only inside a compiled step."""

import keras
import numpy as np
import pytest
from keras import ops

from _families import FAMILIES
from keras_attn.data import pack_sequences
from keras_attn.models.bert import BertPretrainer
from test_case import assert_all_close
from test_case import to_numpy
from test_case import training_step_results

VOCAB = 40
ROW = 16
LENGTHS = (5, 9, 4, 7, 3, 6, 11)
MASKED = 2  # masked-LM predictions per example


def _backbone(**overrides):
    keras.utils.set_random_seed(1)
    # the table's, on the ids below and rows of ROW positions; dropout off
    return FAMILIES["bert"].backbone(vocabulary_size=VOCAB, max_sequence_length=ROW,
                                     dropout=0.0, attention_dropout=0.0, **overrides)


def _examples(seed=0):
    """Each example: token ids `[CLS] ... [SEP]`, sentence ids (A then B),
    `MASKED` positions to predict, their labels and a next-sentence label."""
    rng = np.random.default_rng(seed)
    examples = []
    for n in LENGTHS:
        tokens = rng.integers(4, VOCAB, n)
        tokens[0], tokens[-1] = 2, 3
        sentences = (np.arange(n) >= n // 2).astype("int32")
        examples.append({
            "tokens": tokens.astype("int32"), "sentences": sentences,
            "mask_positions": np.sort(rng.choice(np.arange(1, n), MASKED, replace=False)),
            "mlm": rng.integers(4, VOCAB, MASKED), "nsp": int(rng.integers(0, 2)),
        })
    return examples


def _alone(example):
    n = len(example["tokens"])
    return {"token_ids": example["tokens"][None], "segment_ids": example["sentences"][None],
            "padding_mask": np.ones((1, n), "int32"),
            "mask_positions": example["mask_positions"][None].astype("int32")}


def _pack(examples, max_segments):
    """Packed inputs, targets and weights of `examples`, and each example's
    (row, slot, first token) in the packed rows."""
    columns = [np.stack([e["tokens"], e["sentences"]], axis=1) for e in examples]
    packed = pack_sequences(columns, ROW, buffer_size=4, max_segments=max_segments)
    assert packed["example_ids"].shape[1] > 1  # some row holds several examples
    rows, k = packed["example_ids"].shape
    positions = np.zeros((rows, k * MASKED), "int32")
    mlm = np.zeros((rows, k * MASKED), "int32")
    mlm_weight = np.zeros((rows, k * MASKED), "float32")
    nsp = np.zeros((rows, max_segments), "int32")
    nsp_weight = np.zeros((rows, max_segments), "float32")
    where = {}
    for row, ids in enumerate(packed["example_ids"]):
        for slot, index in enumerate(ids[ids >= 0]):
            start = int(np.flatnonzero(packed["segment_ids"][row] == slot + 1)[0])
            e, span = examples[index], slice(slot * MASKED, (slot + 1) * MASKED)
            positions[row, span] = start + e["mask_positions"]
            mlm[row, span], mlm_weight[row, span] = e["mlm"], 1.0
            nsp[row, slot], nsp_weight[row, slot] = e["nsp"], 1.0
            where[int(index)] = (row, slot, start)
    inputs = {"token_ids": packed["inputs"][..., 0], "segment_ids": packed["inputs"][..., 1],
              "padding_mask": (packed["segment_ids"] > 0).astype("int32"),
              "packed_segment_ids": packed["segment_ids"], "positions": packed["positions"],
              "mask_positions": positions}
    return (inputs, {"mlm": mlm, "nsp": nsp}, {"mlm": mlm_weight, "nsp": nsp_weight},
            where)


def _one_per_row(examples):
    """`examples` padded one per row to the longest: inputs, targets and
    weights. Each row's outputs are those of its example alone, padding
    masked and rows independent
    (test_without_the_packed_inputs_the_models_compute_as_before checks it
    against calls at each example's own length): one shape for every
    example's reference, where on JAX each call at its own length compiled
    every op of the model again."""
    rows, n = len(examples), max(len(e["tokens"]) for e in examples)
    padded = {k: np.zeros((rows, n), "int32")
              for k in ("token_ids", "segment_ids", "padding_mask")}
    for i, e in enumerate(examples):
        m = len(e["tokens"])
        padded["token_ids"][i, :m], padded["segment_ids"][i, :m] = e["tokens"], e["sentences"]
        padded["padding_mask"][i, :m] = 1
    padded["mask_positions"] = np.stack([e["mask_positions"] for e in examples]).astype("int32")
    return (padded, {"mlm": np.stack([e["mlm"] for e in examples]),
                     "nsp": np.array([e["nsp"] for e in examples])},
            {"mlm": np.ones((rows, MASKED), "float32"), "nsp": np.ones((rows,), "float32")})


def _backbone_inputs(inputs):
    return {k: v for k, v in inputs.items() if k != "mask_positions"}


# === Outputs ===


# padding_id 1: RoBERTa's positions, from row 2 (the examples hold no id 1).
@pytest.mark.parametrize("padding_id", [None, 1])
def test_backbone_gives_each_packed_example_its_own_outputs(padding_id):
    backbone, examples = _backbone(padding_id=padding_id), _examples()
    inputs, _, _, where = _pack(examples, max_segments=4)
    got = to_numpy(backbone(_backbone_inputs(inputs))["sequence_output"])
    alone = to_numpy(backbone(_backbone_inputs(_one_per_row(examples)[0]))["sequence_output"])
    for index, (row, _, start) in where.items():
        n = len(examples[index]["tokens"])
        np.testing.assert_allclose(got[row, start:start + n], alone[index, :n],
                                   rtol=0, atol=1e-5, err_msg=f"example {index}")


def test_pretrainer_gives_each_packed_example_its_masked_lm_and_nsp_logits():
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    inputs, _, _, where = _pack(examples, max_segments=4)
    got = {k: to_numpy(v) for k, v in model(inputs).items()}
    assert got["nsp"].shape == (len(inputs["token_ids"]), 4, 2)
    reference = {k: to_numpy(v) for k, v in model(_one_per_row(examples)[0]).items()}
    for index, (row, slot, _) in where.items():
        alone = {k: v[index] for k, v in reference.items()}
        span = slice(slot * MASKED, (slot + 1) * MASKED)
        np.testing.assert_allclose(got["mlm"][row, span], alone["mlm"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got["nsp"][row, slot], alone["nsp"], rtol=0, atol=1e-5)


def test_without_the_packed_inputs_the_models_compute_as_before():
    """The optional inputs left out: the padded batch's outputs are those of
    each example alone (padding masked), with the unpacked shapes."""
    model, examples = BertPretrainer(_backbone()), _examples()
    alone = [model(_alone(e)) for e in examples[:2]]
    out = model(_one_per_row(examples)[0])  # the other tests' reference shape
    assert tuple(out["nsp"].shape) == (len(examples), 2)
    for i in range(2):
        assert_all_close([to_numpy(out[k])[i] for k in ("mlm", "nsp")],
                         [to_numpy(alone[i][k])[0] for k in ("mlm", "nsp")], atol=1e-5,
                         what="padded outputs")


# === Loss and gradient ===


def _per_example_loss(outputs, labels, weights):
    """Summed cross-entropy of the weighted predictions: the packed sum is
    the sum of the examples' sums."""
    total = 0.0
    for name in ("mlm", "nsp"):
        ce = keras.losses.sparse_categorical_crossentropy(
            ops.convert_to_tensor(labels[name]), outputs[name], from_logits=True)
        total = total + ops.sum(ce * ops.convert_to_tensor(weights[name]))
    return total


def test_pretrainer_gradient_is_the_sum_of_the_examples_gradients():
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    inputs, labels, weights, _ = _pack(examples, max_segments=4)
    _, grads, _ = training_step_results(
        model, inputs, lambda out: _per_example_loss(out, labels, weights))
    # The examples' gradients summed in one step: one per row, each row its
    # example alone (see _one_per_row), the loss their sum. On JAX a step
    # per example compiled the model's training step once each.
    padded, padded_labels, padded_weights = _one_per_row(examples)
    _, total, _ = training_step_results(
        model, padded, lambda out: _per_example_loss(out, padded_labels, padded_weights))
    assert sum(float(np.abs(g).max() > 0) for g in grads) > len(grads) // 2
    assert_all_close(total, grads, atol=1e-5, what="weight gradient")


def _auto_loss(model, x, y, weights):
    return float(to_numpy(model.compute_loss(x=x, y=y, y_pred=model(x),
                                             sample_weight=weights)))


def test_packed_batch_loss_is_the_padded_batch_loss():
    """The "auto" loss of `compile` (masked-LM mean over real predictions
    plus NSP mean over real examples) of the packed rows equals that of the
    same examples padded one per row."""
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    model.compile(optimizer="sgd")
    inputs, labels, weights, _ = _pack(examples, max_segments=4)
    padded_loss = _auto_loss(model, *_one_per_row(examples))
    np.testing.assert_allclose(_auto_loss(model, inputs, labels, weights), padded_loss,
                               rtol=1e-5)


# === Bad packings ===


def _bad_packing():
    """A pretrainer, packed inputs, the same with a row whose segment ids go
    back to segment 1, and that row."""
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    inputs, _, _, _ = _pack(examples, max_segments=4)
    bad = dict(inputs, packed_segment_ids=inputs["packed_segment_ids"].copy())
    row = int(np.argmax(bad["packed_segment_ids"].max(axis=1) >= 2))
    ids = bad["packed_segment_ids"][row]
    ids[np.flatnonzero(ids == 2)[-1]] = 1
    return model, inputs, bad, row


def test_a_bad_packing_is_refused_naming_the_input():
    model, inputs, bad, _ = _bad_packing()
    with pytest.raises(ValueError, match="`packed_segment_ids`"):
        model(bad)
    with pytest.raises(ValueError, match="both 'packed_segment_ids' and 'positions'"):
        model({k: v for k, v in inputs.items() if k != "positions"})
    bad = dict(inputs, positions=inputs["positions"] + 1)  # do not restart at 0
    with pytest.raises(ValueError, match="`positions`"):
        model(bad)


def test_more_examples_in_a_row_than_max_segments_is_refused():
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    inputs, _, _, _ = _pack(examples, max_segments=4)
    small = BertPretrainer(model.backbone, max_segments=1)
    with pytest.raises(ValueError, match="max_segments=1"):
        small(inputs)


def test_a_bad_packing_in_a_compiled_step_makes_that_row_nan_only():
    model, inputs, bad, row = _bad_packing()
    if keras.backend.backend() == "torch":  # predict runs eagerly: it raises
        with pytest.raises(ValueError, match="segment_ids`"):
            model.predict_on_batch(bad)
        return
    clean, got = model.predict_on_batch(inputs), model.predict_on_batch(bad)
    others = [r for r in range(len(inputs["token_ids"])) if r != row]
    for name in ("mlm", "nsp"):
        assert np.all(np.isnan(got[name][row]))
        np.testing.assert_allclose(got[name][others], clean[name][others], atol=1e-5)


# === fit ===


def test_fit_on_packed_rows_lowers_the_loss():
    """`fit` on packed rows trains on every backend (PyTorch traces the model
    on "meta" tensors first: the segment-id checks must run on them)."""
    model, examples = BertPretrainer(_backbone(), max_segments=4), _examples()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    inputs, labels, weights, _ = _pack(examples, max_segments=4)
    history = model.fit(inputs, labels, sample_weight=weights, epochs=8,
                        batch_size=len(inputs["token_ids"]), shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
