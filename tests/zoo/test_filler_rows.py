"""Filler rows count for nothing (issue 45): a batch that the replicas do
not divide is filled up with its own first rows again (`even_batches`
from tf.data, `prepared.batch_rows` / `batch_kept` from prepared files),
and `Task.weightless_rows` makes those rows weightless, so that the filled
batch's loss and gradients are those of the real rows on one device, for
every task family: sample weights of 0 (ViT, BERT text classification,
masked LM + NSP, the Conformer's utterances) or labels of padding (the
Transformer's tokens)."""

import numpy as np
import pytest
import tensorflow as tf

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task
from keras_attn.zoo.tasks.base import even_batches

pytestmark = pytest.mark.tf_only

TOPICS = ["model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
          "model.overrides.num_heads=2", "model.overrides.intermediate_dim=32",
          "data.vocabulary_size=120", "data.sequence_length=16", "training.batch_size=8"]
QUIET = ["model.overrides.dropout=0", "model.overrides.freq_mask_count=0",
         "model.overrides.time_mask_count=0"]
# recipe, its overrides, whether the forward pass trains. The Conformer's
# runs in training (dropout and SpecAugment off): its BatchNorm then
# normalises over the batch's valid frames, which a filler must not join.
CASES = {
    "vit": ("vit_tiny_digits", tiny_overrides("vit_tiny_digits"), False),
    "masked_lm": ("bert_tiny_pydoc", tiny_overrides("bert_tiny_pydoc"), False),
    "text_classification": ("bert_tiny_topics", TOPICS, False),
    "translation": ("transformer_numbers", tiny_overrides("transformer_numbers"), False),
    "conformer": ("conformer_tiny_digits", tiny_overrides("conformer_tiny_digits") + QUIET,
                  True),
    "conformer_packed": ("conformer_tiny_digits", tiny_overrides("conformer_tiny_digits")
                         + QUIET + ["data.packing=true"], True),
}


def _task(case):
    name, overrides, _ = CASES[case]
    path = recipe_path(name) if name != "bert_tiny_topics" else recipe_path(
        "bert_tiny_pydoc").replace("bert_tiny_pydoc", "bert_tiny_topics")
    return make_task(load_recipe(path, overrides)).prepare()


def _loss_and_gradients(model, batch, training):
    x, y = batch[0], batch[1]
    weights = batch[2] if len(batch) > 2 else None
    with tf.GradientTape() as tape:
        y_pred = model(x, training=training)
        loss = model.compute_loss(x, y, y_pred, weights, training=training)
    gradients = tape.gradient(loss, model.trainable_variables)
    return float(loss), [np.asarray(tf.convert_to_tensor(g)) for g in gradients]


def _numpy(batch):
    return tf.nest.map_structure(np.asarray, batch)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_filled_batch_trains_as_its_real_rows_on_one_device(case):
    task = _task(case)
    model = task.compile(task.build_model())
    training = CASES[case][2]
    first = next(iter(task.train_dataset_fn(0)))
    real = tf.nest.map_structure(lambda tensor: tensor[:3], first)  # 3 rows, 2 replicas
    # From tf.data: rows 0, 1, 2 and row 0 again, weightless.
    filled = next(iter(even_batches(tf.data.Dataset.from_tensors(real), 2, task)))
    assert int(tf.nest.flatten(filled)[0].shape[0]) == 4
    # From prepared files (NumPy): the same rows, the same hook.
    rows, keep = np.array([0, 1, 2, 0]), np.array([True, True, True, False])
    prepared = task.weightless_rows(
        tf.nest.map_structure(lambda array: array[rows], _numpy(real)), keep)
    tf.nest.map_structure(np.testing.assert_array_equal, _numpy(filled), _numpy(prepared))

    expected_loss, expected = _loss_and_gradients(model, real, training)
    loss, found = _loss_and_gradients(model, filled, training)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    # Gradients of up to ~1 summed in another order; some are 0 in exact
    # arithmetic (the bias before the Conformer's BatchNorm) and differ by
    # float rounding alone (measured: 1.2e-6).
    for variable, got, want in zip(model.trainable_variables, found, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{case}: {variable.path}")
    # The same filled batch as it was fed before (the filler a plain row):
    # it counted twice.
    duplicated = tf.nest.map_structure(lambda array: array[rows], _numpy(real))
    counted, gradients = _loss_and_gradients(model, duplicated, training)
    assert not np.isclose(counted, expected_loss, rtol=1e-4) or not all(
        np.allclose(got, want, rtol=1e-4, atol=1e-5) for got, want in zip(gradients, expected))


def test_even_batches_weigh_the_fillers_zero_and_keep_given_weights():
    x = np.arange(7 * 2).reshape(7, 2)
    weights = {"a": np.arange(7 * 3, dtype="float32").reshape(7, 3) + 1,
               "b": np.ones(7, "float32")}
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, np.arange(7), weights)).batch(3)
    batches = list(even_batches(dataset, 2).as_numpy_iterator())  # 3, 3, 1 -> 4, 4, 2
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 0], [3, 4, 5, 3], [6, 6]]
    np.testing.assert_array_equal(batches[0][0]["x"], x[[0, 1, 2, 0]])
    np.testing.assert_array_equal(batches[1][2]["a"][:3], weights["a"][3:6])
    np.testing.assert_array_equal(batches[1][2]["a"][3], 0)
    assert [b[2]["b"].tolist() for b in batches] == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 0]]
    # No weights: one of 1 and 0 per row, added.
    plain = tf.data.Dataset.from_tensor_slices((x, np.arange(7))).batch(5)
    assert [b[2].tolist() for b in even_batches(plain, 4).as_numpy_iterator()] == [
        [1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0]]


def test_weightless_rows_refuses_a_batch_without_labels():
    from keras_attn.zoo.tasks.base import weightless_rows

    with pytest.raises(ValueError, match=r"only in batches of \(x, y\[, sample_weight\]\)\. "
                                         r"Received: a batch of tuple of 1 parts"):
        weightless_rows((np.zeros(3),), np.ones(3, bool))


@pytest.mark.parametrize("replicas, processes", [(2, 2), (4, 2), (3, 3)])
def test_each_process_makes_only_its_rows_and_they_are_its_slice(replicas, processes):
    """The embedded images (augmented): each process gathers and augments
    only its rows of every filled batch (`process_train_dataset_fn`), and
    they are bit for bit its slice of the whole batch filled up with
    weightless rows (`process_rows(even_batches(...))`)."""
    from keras_attn.training.distribute import process_rows

    # 1,293 training images in batches of 32: the last of 13, filled up.
    task = _task("vit")
    task.batch_size = 32
    evened = even_batches(task.train_dataset_fn(1), replicas, task)
    sliced = [list(process_rows(evened, k, processes).as_numpy_iterator())
              for k in range(processes)]
    assert 0 in sliced[-1][-1][2]  # the last batch's filler, on the last process
    for k in range(processes):
        found = list(task.process_train_dataset_fn(replicas, k, processes)(1)
                     .as_numpy_iterator())
        assert len(found) == len(sliced[k]) == 41
        for index, (got, want) in enumerate(zip(found, sliced[k])):
            tf.nest.map_structure(
                lambda a, b: np.testing.assert_array_equal(a, b, err_msg=f"{k}: {index}"),
                got, want)


def test_a_run_of_several_processes_takes_the_tasks_own_rows():
    """`keras-attn train --distribute` as process 1 of 2: the training data
    of `runs._training_data` is the task's own rows, checked
    (`check_batches`), not the whole batch cut."""
    from keras_attn.zoo import runs

    task = _task("vit")
    model = task.compile(task.build_model())
    asked = []
    own_rows = task.process_train_dataset_fn

    def spy(*args):
        asked.append(args)
        return own_rows(*args)

    task.process_train_dataset_fn = spy
    train_dataset_fn, _ = runs._training_data(task, model, None, 2, (1, 2))
    assert asked == [(2, 1, 2)]
    found = next(iter(train_dataset_fn(0)))
    expected = next(iter(own_rows(2, 1, 2)(0)))
    tf.nest.map_structure(np.testing.assert_array_equal, _numpy(found), _numpy(expected))


@pytest.mark.parametrize("case", ["vit", "text_classification"])
def test_the_weighted_accuracy_is_the_only_accuracy(case):
    """The classification tasks compile their accuracy as a weighted metric
    (fillers of weight 0 count in neither it nor the loss), instead of the
    model's own: one `accuracy`, no `weighted_accuracy` beside it, and on a
    filled batch the accuracy of the real rows."""
    task = _task(case)
    model = task.compile(task.build_model())
    real = tf.nest.map_structure(lambda tensor: tensor[:3], next(iter(task.train_dataset_fn(0))))
    filled = even_batches(tf.data.Dataset.from_tensors(real), 2, task)
    expected = model.evaluate(tf.data.Dataset.from_tensors(real), verbose=0, return_dict=True)
    found = model.evaluate(filled, verbose=0, return_dict=True)
    assert sorted(found) == sorted(expected) == ["accuracy", "loss"]
    np.testing.assert_allclose(found["accuracy"], expected["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(found["loss"], expected["loss"], rtol=1e-5)
