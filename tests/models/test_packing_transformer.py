"""The packing contract for the Transformer (TensorFlow, JAX and PyTorch):
source and target rows packed in step give every example the logits
(<= 1e-5), the loss and the gradient contribution it gets alone, whatever
else is in its rows; without the packed inputs the model computes what it
computed before; a bad packing is a ValueError naming the input in an eager
call and NaN for that row only inside a compiled step."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.data import pack_sequences
from keras_attn.models.transformer import build_transformer
from _packing_checks import check_fit_lowers_the_loss
from _packing_checks import check_only_the_bad_row_is_nan_when_compiled
from test_case import assert_all_close
from test_case import to_numpy
from test_case import training_step_results

VOCAB = 30
PAD = 0
BOS = 1
SOURCE_ROW, TARGET_ROW = 16, 14
# (source length, target length) of each example
LENGTHS = ((5, 4), (9, 7), (4, 6), (7, 5), (3, 3), (6, 8), (11, 9))


def _model(**overrides):
    keras.utils.set_random_seed(3)
    config = dict(vocabulary_size=VOCAB, hidden_dim=16, intermediate_dim=24, num_heads=2,
                  num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, pad_id=PAD,
                  max_sequence_length=SOURCE_ROW)
    config.update(overrides)
    return build_transformer("transformer_base", **config)


def _examples(seed=0):
    """Each example: source ids, target input ids (BOS, y_1 .. y_{n-1}) and
    target labels (y_1 .. y_n)."""
    rng = np.random.default_rng(seed)
    examples = []
    for n, m in LENGTHS:
        target = rng.integers(2, VOCAB, m).astype("int32")
        examples.append({"source": rng.integers(2, VOCAB, n).astype("int32"),
                         "target_in": np.concatenate([[BOS], target[:-1]]).astype("int32"),
                         "labels": target})
    return examples


def _alone(example):
    return {"source_ids": example["source"][None], "target_ids": example["target_in"][None]}


def _pack(examples):
    """Packed inputs and labels of `examples`, and each example's (row,
    first source token, first target token) in the packed rows."""
    targets = [np.stack([e["target_in"], e["labels"]], axis=1) for e in examples]
    packed = pack_sequences([e["source"] for e in examples], SOURCE_ROW, targets=targets,
                            target_row_length=TARGET_ROW, buffer_size=4, pad_value=PAD)
    assert packed["example_ids"].shape[1] > 1  # some row holds several examples
    where = {}
    for row, ids in enumerate(packed["example_ids"]):
        for slot, index in enumerate(ids[ids >= 0]):
            where[int(index)] = (
                row, int(np.flatnonzero(packed["segment_ids"][row] == slot + 1)[0]),
                int(np.flatnonzero(packed["target_segment_ids"][row] == slot + 1)[0]))
    inputs = {"source_ids": packed["inputs"], "target_ids": packed["targets"][..., 0],
              "source_segment_ids": packed["segment_ids"],
              "source_positions": packed["positions"],
              "target_segment_ids": packed["target_segment_ids"],
              "target_positions": packed["target_positions"]}
    return inputs, packed["targets"][..., 1], where


def _padded(examples):
    """The examples padded one per row: inputs and labels. Each row's
    outputs are those of its example alone, padding masked and rows
    independent (test_without_the_packed_inputs_the_model_computes_as_before
    checks it against calls at each example's own lengths): the examples'
    references at one shape, where on JAX each call at its own lengths
    compiled every op of the model again."""
    rows = len(examples)
    source = np.full((rows, max(n for n, _ in LENGTHS)), PAD, "int32")
    target, labels = (np.full((rows, max(m for _, m in LENGTHS)), PAD, "int32")
                      for _ in range(2))
    for i, e in enumerate(examples):
        source[i, :len(e["source"])] = e["source"]
        target[i, :len(e["target_in"])] = e["target_in"]
        labels[i, :len(e["labels"])] = e["labels"]
    return [source, target], labels


# === Outputs ===


@pytest.mark.parametrize("position_embedding", ["sinusoidal", "learned"])
def test_each_packed_example_gets_its_logits_alone(position_embedding):
    model, examples = _model(position_embedding=position_embedding), _examples()
    inputs, _, where = _pack(examples)
    got = to_numpy(model(inputs))
    assert got.shape == (len(inputs["source_ids"]), TARGET_ROW, VOCAB)
    reference = to_numpy(model(_padded(examples)[0]))
    for index, (row, _, start) in where.items():
        alone = reference[index, :len(examples[index]["target_in"])]
        np.testing.assert_allclose(got[row, start:start + len(alone)], alone,
                                   rtol=0, atol=1e-5, err_msg=f"example {index}")


def test_without_the_packed_inputs_the_model_computes_as_before():
    """A dict of the two ids runs the functional graph: the outputs of the
    list call, each padded example's those of the example alone."""
    model, examples = _model(), _examples()
    (source, target), _ = _padded(examples)  # the other tests' reference shape
    listed = to_numpy(model([source, target]))
    named = to_numpy(model({"source_ids": source, "target_ids": target}))
    np.testing.assert_allclose(named, listed, rtol=0, atol=0)
    for i, e in enumerate(examples[:2]):
        alone = to_numpy(model(_alone(e)))[0]
        np.testing.assert_allclose(listed[i, :len(alone)], alone, rtol=0, atol=1e-5)


# === Loss and gradient ===


def _summed_loss(logits, labels):
    """Cross-entropy summed over the real target tokens (labels != pad)."""
    labels = ops.convert_to_tensor(labels)
    ce = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return ops.sum(ce * ops.cast(ops.not_equal(labels, PAD), ce.dtype))


def test_gradient_is_the_sum_of_the_examples_gradients():
    model, examples = _model(), _examples()
    inputs, labels, _ = _pack(examples)
    _, grads, _ = training_step_results(model, inputs, lambda out: _summed_loss(out, labels))
    # The examples' gradients summed in one step: one per row, each row its
    # example alone (see _padded), the loss their sum. On JAX a step per
    # example compiled the model's training step once each.
    padded, padded_labels = _padded(examples)
    _, total, _ = training_step_results(model, padded,
                                        lambda out: _summed_loss(out, padded_labels))
    assert sum(float(np.abs(g).max() > 0) for g in grads) > len(grads) // 2
    assert_all_close(total, grads, atol=1e-5, what="weight gradient")


def test_packed_batch_loss_is_the_padded_batch_loss():
    """compile's "auto" loss (label-smoothed cross-entropy over the real
    target tokens) of the packed rows equals that of the same examples
    padded one per row."""
    model, examples = _model(), _examples()
    model.compile(optimizer="sgd")
    inputs, labels, _ = _pack(examples)
    padded, padded_labels = _padded(examples)

    def loss(x, y):
        return float(to_numpy(model.compute_loss(x=x, y=y, y_pred=model(x))))

    np.testing.assert_allclose(loss(inputs, labels), loss(padded, padded_labels), rtol=1e-5)


# === Bad packings ===


def _with(inputs, name, change):
    values = inputs[name].copy()
    change(values)
    return dict(inputs, **{name: values})


def _multi_segment_row(inputs):
    return int(np.argmax(inputs["source_segment_ids"].max(axis=1) >= 2))


def _back_to_segment_1(inputs, name):
    """`inputs` with a row whose `name` segment ids go back to segment 1."""
    row = _multi_segment_row(inputs)

    def change(ids):
        ids[row, np.flatnonzero(ids[row] == 2)[-1]] = 1
    return _with(inputs, name, change), row


def test_a_bad_packing_is_refused_naming_the_input():
    model, examples = _model(), _examples()
    inputs, _, _ = _pack(examples)
    for name in ("source_segment_ids", "target_segment_ids"):
        with pytest.raises(ValueError, match=f"`{name}`"):
            model(_back_to_segment_1(inputs, name)[0])
    for name in ("source_positions", "target_positions"):
        with pytest.raises(ValueError, match=f"`{name}`"):
            model(dict(inputs, **{name: inputs[name] + 1}))  # do not restart at 0
    with pytest.raises(ValueError, match="packed rows need all of"):
        model({k: v for k, v in inputs.items() if k != "target_positions"})
    with pytest.raises(ValueError, match="`source_segment_ids`.*dtype=float32"):
        model(dict(inputs, source_segment_ids=inputs["source_segment_ids"].astype("float32")))


def test_rows_with_different_numbers_of_segments_are_refused():
    """A target segment without its source segment would attend to nothing
    in the cross-attention."""
    model, examples = _model(), _examples()
    inputs, _, _ = _pack(examples)
    row = _multi_segment_row(inputs)

    def drop_last(ids):  # the target row's last segment becomes padding
        ids[row, ids[row] == ids[row].max()] = 0
    bad = _with(inputs, "target_segment_ids", drop_last)
    bad["target_positions"] = np.where(bad["target_segment_ids"] > 0,
                                       bad["target_positions"], 0)
    with pytest.raises(ValueError, match="`target_segment_ids`: a target row must hold as many"):
        model(bad)


def test_a_pad_id_inside_a_segment_is_refused():
    """The padded model masks a pad id; in a packed row a segment's tokens
    are all real, so the two would differ: refused. A target segment's
    first token (the start token) may be the pad id (Marian)."""
    model, examples = _model(), _examples()
    inputs, _, _ = _pack(examples)
    with pytest.raises(ValueError, match="`source_ids`: a token of a segment may not be"):
        model(_with(inputs, "source_ids", lambda ids: ids.__setitem__((0, 1), PAD)))
    with pytest.raises(ValueError, match="`target_ids`: a token of a segment may not be"):
        model(_with(inputs, "target_ids", lambda ids: ids.__setitem__((0, 1), PAD)))
    starts = (inputs["target_positions"] == 0) & (inputs["target_segment_ids"] > 0)
    marian = _with(inputs, "target_ids", lambda ids: ids.__setitem__(starts, PAD))
    assert np.all(np.isfinite(to_numpy(model(marian))))


def test_a_bad_packing_in_a_compiled_step_makes_that_row_nan_only():
    model, examples = _model(), _examples()
    inputs, _, _ = _pack(examples)
    bad, row = _back_to_segment_1(inputs, "target_segment_ids")
    check_only_the_bad_row_is_nan_when_compiled(model, inputs, bad, row)


# === fit ===


def test_fit_on_packed_rows_lowers_the_loss():
    inputs, labels, _ = _pack(_examples())
    # One layer a side: `fit` traces the model, and what it checks (packed
    # rows train on this backend) does not depend on the depth; the packed
    # logits and gradients are checked on two layers above.
    check_fit_lowers_the_loss(_model(num_encoder_layers=1, num_decoder_layers=1), inputs,
                              labels, learning_rate=1e-2)
