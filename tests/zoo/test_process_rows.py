"""Each process of a data-parallel job makes only its rows of every
training batch where the task can (`Task.process_train_dataset_fn`, issue
45), and they are bit for bit its slice of the whole batch filled up with
weightless rows: `process_rows(even_batches(train_dataset_fn(epoch),
replicas, task), process, processes)`, what one process would feed."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.training.distribute import process_rows
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task
from keras_attn.zoo.tasks.base import even_batches

pytestmark = pytest.mark.tf_only


@functools.lru_cache(maxsize=None)
def _task(name, *overrides):
    """The tiny recipe's task, prepared (once per module: read only here)."""
    return make_task(load_recipe(recipe_path(name), tiny_overrides(name) + list(overrides))
                     ).prepare()


def _assert_own_rows_are_the_slices(task, replicas, processes, epoch=1):
    """Every process's own rows == its slice of the filled batches; returns
    the slices (for the caller's checks of what they hold)."""
    # The filled batches made once (a pass of the whole pipeline), then cut.
    evened = tf.data.experimental.from_list(list(
        even_batches(task.train_dataset_fn(epoch), replicas, task).as_numpy_iterator()))
    sliced = [list(process_rows(evened, k, processes).as_numpy_iterator())
              for k in range(processes)]
    for k in range(processes):
        found = list(task.process_train_dataset_fn(replicas, k, processes)(epoch)
                     .as_numpy_iterator())
        assert len(found) == len(sliced[k]) == task.batches_per_epoch
        for index, (got, want) in enumerate(zip(found, sliced[k])):
            tf.nest.map_structure(
                lambda a, b: np.testing.assert_array_equal(a, b, err_msg=f"{k}: {index}"),
                got, want)
    return sliced


@pytest.mark.parametrize("packing", [False, True])
# 102 training pairs (and packed rows): batches of 13 end with 11 rows,
# which 3 and 4 replicas fill up, so the last process's last rows are
# fillers.
@pytest.mark.parametrize("replicas, processes", [(4, 2), (3, 3)])
def test_masked_lm_each_process_tokenizes_and_masks_only_its_rows(packing, replicas,
                                                                  processes):
    """BERT pretraining (padded pairs, or packed rows): a process's rows are
    masked with the whole batch's draws, so they are those of the whole
    batch, the last batch's fillers weightless."""
    task = _task("bert_tiny_pydoc", "training.batch_size=13",
                 *(["data.packing=true"] if packing else []))
    sliced = _assert_own_rows_are_the_slices(task, replicas, processes)
    last = sliced[-1][-1]
    # A filler row (weight 0) on the last process, and masks drawn at all.
    assert 0 in last[2]["nsp"]
    assert sum(batch[2]["mlm"].sum() for k in sliced for batch in k) > 0


def test_masked_lm_rows_keep_the_one_process_masks():
    """The masks of one process are unchanged by the per-row draw: the
    rows `0..B` of a batch masked alone are those of the batch masked
    whole, and every row of it is masked by the batch's draws (a row cut
    and masked on its own, with another seed, differs)."""
    from keras_attn.data import text

    task = _task("bert_tiny_pydoc", "training.batch_size=13")
    mask = text.dynamic_masking(task.tokenizer, 0.5, 6, seed=0)
    batch = next(iter(task.train_dataset_fn(0)))[0]["token_ids"]
    seed = tf.constant([3, 4], tf.int64)
    whole = mask(batch, seed)
    rows = tf.constant([5, 0, 2, 5])
    some = mask(tf.gather(batch, rows), seed, rows=rows, batch_size=tf.shape(batch)[0])
    for name in whole:
        np.testing.assert_array_equal(tf.gather(whole[name], rows), some[name], err_msg=name)
    alone = mask(tf.gather(batch, rows), seed)
    assert not np.array_equal(alone["mask_positions"], some["mask_positions"])
    with pytest.raises(ValueError, match="batch_size"):
        mask(batch, seed, rows=rows)


# 200 training pairs in length buckets: batches of 16 end each bucket with a
# partial batch, which 3 replicas and (for most) 4 do not divide.
@pytest.mark.parametrize("replicas, processes", [(4, 2), (3, 3)])
def test_translation_each_process_encodes_only_its_rows(replicas, processes):
    """The Transformer's bucketed batches: found from the token lengths,
    then each process encodes its rows only, padded to the whole batch's
    longest source and target; the filler rows' labels all padding."""
    task = _task("transformer_numbers")
    sliced = _assert_own_rows_are_the_slices(task, replicas, processes)
    # Filler rows (labels all padding) on the last process.
    assert any(np.all(batch[1] == 0, axis=1).any() for batch in sliced[-1])


def test_bucket_batches_are_those_of_tf_data():
    """The batches `bucket_by_sequence_length` makes, the partial buckets
    at the end lowest first, found from the lengths alone."""
    from keras_attn.data.translation import bucket_batches

    lengths = np.random.default_rng(0).integers(1, 40, 101)
    dataset = tf.data.Dataset.from_tensor_slices((np.arange(101), lengths))
    dataset = dataset.bucket_by_sequence_length(
        lambda index, length: tf.cast(length, tf.int32), [8, 16, 32], [6, 6, 6, 6])
    expected = [index for index, _ in dataset.as_numpy_iterator()]
    found = bucket_batches(lengths, [8, 16, 32], 6)
    assert len(found) == len(expected) == 18
    # The partial buckets last, lowest first (bucket 0 has 18, none partial).
    assert [len(batch) for batch in found[-3:]] == [5, 4, 2]
    for got, want in zip(found, expected):
        np.testing.assert_array_equal(got, want)


# 16 training utterances in batches of 5, bucketed by duration: each
# bucket's last batch partial, so the replicas leave fillers.
@pytest.mark.parametrize("replicas, processes", [(4, 2), (3, 3)])
def test_speech_each_process_pads_only_its_rows(replicas, processes):
    """The Conformer's bucketed batches: found from the lengths, then each
    process pads its utterances only, to the bucket's boundary and the whole
    batch's longest transcript; the fillers of no frames and weight 0."""
    task = _task("conformer_tiny_digits", "training.batch_size=5")
    sliced = _assert_own_rows_are_the_slices(task, replicas, processes)
    assert any(0 in batch[2] for batch in sliced[-1])
