"""`data.packing` in the zoo (issue 42): the masked_lm task trains on packed
rows, each epoch a pure function of the seed and the epoch holding every
training example once; its held-out metrics are those of padded batches;
a packed run trains, resumes exactly and round-trips through `prepare`;
tasks that do not pack refuse the key by name."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.errors import RecipeError
from keras_attn.zoo import prepared as prepared_module
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import fingerprint
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.recipe import validate_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

NAME = "bert_tiny_pydoc"
# Rows of 64 (the tiny recipe's 32 holds one sentence pair of the corpus).
PACKED = tiny_overrides(NAME, run=False) + ["data.packing=true", "data.sequence_length=64"]
# Two epochs of 4 steps, a checkpoint every 3 (and at epoch ends): step 6
# falls inside the second epoch, step 4 is the first epoch's end.
TRANSLATION = "transformer_numbers"
TRANSLATION_PACKED = tiny_overrides(TRANSLATION, run=False) + ["data.packing=true"]
RESUMABLE = PACKED + ["training.epochs=2", "training.steps_per_epoch=4",
                      "training.checkpoint_every=3", "training.jit_compile=false"]


def _recipe(overrides, name=NAME):
    return load_recipe(recipe_path(name), overrides)


@pytest.fixture(scope="module")
def task():
    return make_task(_recipe(PACKED)).prepare()


# === The key ===


@pytest.mark.parametrize("value", ['"yes"', "1", "null", "{}"])
def test_a_packing_that_is_not_a_boolean_is_refused_by_name(value):
    with pytest.raises(RecipeError, match=r"Recipe key `data\.packing`.*Received: data\.packing="):
        _recipe(tiny_overrides(NAME) + [f"data.packing={value}"])


@pytest.mark.parametrize("name", ["vit_tiny_digits"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_tasks_that_do_not_pack_refuse_the_key_by_name(name, value):
    # Speech packs too (tests/zoo/test_packing_speech.py).
    with pytest.raises(RecipeError, match=r"Recipe key `data\.packing` is not taken by this "
                                          r"task: packed rows train the masked_lm, "
                                          r"translation and speech_ctc tasks only"):
        _recipe(tiny_overrides(name) + [f"data.packing={value}"], name)


def test_translation_packs_embedded_and_files_data_only():
    with open(recipe_path(TRANSLATION)) as handle:
        recipe = json.load(handle)
    recipe["data"] = {"dataset": "tfds:wmt14_translate/de-en", "packing": True}
    with pytest.raises(RecipeError, match=r"Recipe key `data\.packing` is for embedded and "
                                          r"files datasets.*Received: data\.packing=True"):
        validate_recipe(recipe)
    # Rows of max(bucket_boundaries) tokens: a longer pair is refused by name.
    task = make_task(_recipe(TRANSLATION_PACKED + ["data.bucket_boundaries=[4, 8]"],
                             TRANSLATION))
    with pytest.raises(ValueError, match=r"Recipe key `data\.packing` packs rows of "
                                         r"max\(data\.bucket_boundaries\)=8 tokens"):
        task.prepare()


def test_an_unpacked_recipe_resolves_and_fingerprints_as_before():
    """`packing: false` (given or not) leaves no trace in the resolved recipe:
    the runs and prepared data of unpacked recipes stay theirs."""
    default = _recipe(tiny_overrides(NAME))
    given = _recipe(tiny_overrides(NAME) + ["data.packing=false"])
    assert "packing" not in default["data"] and given == default
    assert fingerprint(given) == fingerprint(default)
    assert _recipe(PACKED)["data"]["packing"] is True
    translation = _recipe(tiny_overrides(TRANSLATION) + ["data.packing=false"], TRANSLATION)
    assert translation == _recipe(tiny_overrides(TRANSLATION), TRANSLATION)


# === The packed rows ===


def _segments(row):
    """The spans `[(start, end), ...]` of segments 1..k of a row."""
    return [tuple(np.flatnonzero(row == k)[[0, -1]] + [0, 1]) for k in range(1, row.max() + 1)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_each_epoch_packs_every_training_example_once_into_valid_rows(task, epoch):
    rows = task.packed_epoch(epoch)
    ids = rows["example_ids"]
    present = ids[ids >= 0]
    assert sorted(present.tolist()) == list(range(len(task.train_examples)))  # once each
    assert rows["token_ids"].shape == (len(ids), 64)  # data.sequence_length
    assert ids.shape[1] == task.max_segments and (ids >= 0).sum(axis=1).max() == task.max_segments
    assert (ids >= 0).sum(axis=1).max() > 1  # rows do hold several examples
    for r, row in enumerate(rows["packed_segment_ids"]):
        k = int(row.max())
        spans = _segments(row)
        # Segments 1..k, contiguous and in order from the start, then padding.
        assert (np.flatnonzero(row) == np.arange(spans[-1][1])).all()
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[0][0] == 0
        assert (row[spans[-1][1]:] == 0).all()
        for slot, (start, end) in enumerate(spans):
            example = task.train_examples[ids[r, slot]]
            np.testing.assert_array_equal(rows["token_ids"][r, start:end], example[:, 0])
            np.testing.assert_array_equal(rows["segment_ids"][r, start:end], example[:, 1])
            np.testing.assert_array_equal(rows["positions"][r, start:end],
                                          np.arange(end - start))
        np.testing.assert_array_equal(rows["nsp"][r, :k], task.train_labels[ids[r, :k]])
        np.testing.assert_array_equal(rows["nsp_weights"][r], np.arange(task.max_segments) < k)


def test_the_packing_is_a_function_of_seed_and_epoch(task):
    again = make_task(_recipe(PACKED)).prepare()
    np.testing.assert_array_equal(again.packed_epoch(1)["example_ids"],
                                  task.packed_epoch(1)["example_ids"])
    assert not np.array_equal(task.packed_epoch(0)["example_ids"],
                              task.packed_epoch(1)["example_ids"])
    other_seed = make_task(_recipe(PACKED + ["training.seed=1"])).prepare()
    assert not np.array_equal(other_seed.packed_epoch(1)["example_ids"],
                              task.packed_epoch(1)["example_ids"])


def test_packed_batches_carry_the_packed_inputs_and_mask_real_tokens_only(task):
    batches = list(task.train_dataset_fn(1))
    assert len(batches) == task.batches_per_epoch
    rows = task.packed_epoch(1)
    special = [task.vocabulary.index(t) for t in ("[PAD]", "[CLS]", "[SEP]")]
    start = 0
    for x, y, weight in batches:
        x = {name: np.asarray(value) for name, value in x.items()}
        size = len(x["token_ids"])
        here = slice(start, start + size)
        start += size
        np.testing.assert_array_equal(x["packed_segment_ids"], rows["packed_segment_ids"][here])
        np.testing.assert_array_equal(x["positions"], rows["positions"][here])
        np.testing.assert_array_equal(x["padding_mask"], x["packed_segment_ids"] > 0)
        np.testing.assert_array_equal(np.asarray(y["nsp"]), rows["nsp"][here])
        # The masked LM predicts real, non-special tokens of the row: the
        # original ids of the unmasked row at its positions.
        chosen = np.asarray(weight["mlm"]) > 0
        positions = x["mask_positions"]
        original = np.take_along_axis(rows["token_ids"][here], positions, axis=1)
        assert chosen.any()
        assert (np.take_along_axis(x["packed_segment_ids"], positions, axis=1)[chosen] > 0).all()
        assert not np.isin(original[chosen], special).any()
        np.testing.assert_array_equal(np.asarray(y["mlm"])[chosen], original[chosen])
        # Every other token is the row's own.
        untouched = np.ones_like(x["token_ids"], bool)
        untouched[np.nonzero(chosen)[0], positions[chosen]] = False
        np.testing.assert_array_equal(x["token_ids"][untouched],
                                      rows["token_ids"][here][untouched])
    assert start == len(rows["token_ids"])
    # Fewer rows than examples: padding was spent on real tokens.
    assert start < len(task.train_examples)


def test_held_out_batches_stay_padded_one_example_per_row(task):
    padded = make_task(_recipe(PACKED[:-2] + ["data.sequence_length=64"])).prepare()
    for packed_pass, padded_pass in ((task.test_data(), padded.test_data()),
                                     (task.validation_data(), padded.validation_data())):
        for a, b in zip(packed_pass, padded_pass, strict=True):
            for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# === Runs ===


def _weights(run):
    with np.load(sorted(glob.glob(os.path.join(run, "checkpoints", "ckpt-*.npz")))[-1]) as ckpt:
        return {key: ckpt[key] for key in ckpt.files}


# One packed run serves the two tests below (one run less, the suite's budget):
# 3 epochs of its 4 batches at a rate that moves the loss, a checkpoint every
# 5 steps (and at epoch ends); the 3 kept are those of steps 8, 10 and 12.
TRAINED = PACKED + ["training.epochs=3", "training.jit_compile=false",
                    "training.optimizer.learning_rate=0.005", "training.checkpoint_every=5"]


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("packed_run") / "whole")
    return runs.train(NAME, TRAINED, output=output, export=False, verbose=0)


@pytest.mark.xdist_group("packed_bert_run")  # one worker trains the module's run once
def test_a_packed_run_trains_and_is_scored_on_padded_batches(packed_run):
    task = make_task(_recipe(TRAINED)).prepare()
    untrained = task.compile(task.build_model())
    before = task.evaluate(untrained)
    results = packed_run
    after = results["metrics"]
    assert results["steps"] == 3 * task.batches_per_epoch
    assert set(after) == set(before)
    # 12 steps of a one-layer model: the held-out loss falls by ~0.3 (5.30 ->
    # 5.01 at seed 0), the training loss with every epoch.
    assert after["mlm_loss"] < before["mlm_loss"] - 0.1, (before, after)
    with open(os.path.join(results["output"], "checkpoints", "history.json")) as handle:
        losses = json.load(handle)["loss"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses


@pytest.mark.xdist_group("packed_bert_run")  # one worker trains the module's run once
def test_a_packed_run_resumes_exactly(packed_run, tmp_path):
    """Cut back to the checkpoint of step 10 (inside the third epoch: its
    packing is made again and 2 batches skipped), the run ends with the
    uninterrupted weights."""
    whole, cut = packed_run["output"], str(tmp_path / "cut")
    # The run as a kill right after step 10's checkpoint leaves it.
    kept = "ckpt-00000010."
    shutil.copytree(whole, cut, ignore=lambda _, names: [
        name for name in names if name in ("model.keras", "results.json")
        or (name.startswith("ckpt-") and not name.startswith(kept))])
    assert sorted(os.listdir(os.path.join(cut, "checkpoints"))) == [
        kept + "json", kept + "npz", "history.json"]
    runs.train(NAME, TRAINED, output=cut, export=False, verbose=0)
    expected, resumed = _weights(whole), _weights(cut)
    assert sorted(resumed) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(resumed[key], expected[key], atol=1e-6, rtol=0, err_msg=key)


def test_prepare_stores_the_packed_batches_and_reads_them_back(tmp_path):
    recipe = _recipe(RESUMABLE)
    directory = str(tmp_path / "prepared")
    prepared_module.prepare(NAME, RESUMABLE, output=directory, verbose=False)
    data = prepared_module.PreparedData(directory, recipe)
    task = make_task(recipe).prepare()
    assert data.state["max_segments"] == task.max_segments > 1
    for split, epoch, expected in (("train", 0, task.train_dataset_fn(0)),
                                   ("train", 1, task.train_dataset_fn(1)),
                                   ("test", None, task.test_data())):
        stored = data.batches(split, epoch, task.finish_prepared)
        count = 0
        for want, got in zip(expected, stored):
            assert sorted(got[0]) == sorted(want[0])
            for a, b in zip(tf.nest.flatten(tuple(want)), tf.nest.flatten(tuple(got)),
                            strict=True):
                a = np.asarray(a)
                assert a.dtype == b.dtype and a.shape == b.shape, (split, epoch)
                np.testing.assert_array_equal(b, a, err_msg=f"{split} {epoch}")
            count += 1
        assert count == len(stored) == (4 if split == "train" else len(list(expected)))
    # A model made from the prepared state alone takes every stored batch.
    fresh = make_task(recipe)
    fresh.use_prepared(data.state)
    model = fresh.build_model()
    assert model.max_segments == task.max_segments
    data.check(model, fresh)


# === Translation ===


def test_translation_rows_pack_every_pair_once_in_step_and_shuffle_by_epoch():
    task = make_task(_recipe(TRANSLATION_PACKED, TRANSLATION)).prepare()
    rows = task.packed_rows
    ids = rows["example_ids"]
    assert sorted(ids[ids >= 0].tolist()) == list(range(len(task.train_sources)))
    assert (ids >= 0).sum(axis=1).max() > 1
    # Segment k of a target row is the translation of segment k of its source row.
    np.testing.assert_array_equal(rows["segment_ids"].max(axis=1),
                                  rows["target_segment_ids"].max(axis=1))
    tokenizer = task.tokenizer
    r, k = 0, 1
    source = rows["inputs"][r][rows["segment_ids"][r] == k]
    target = rows["targets"][r][rows["target_segment_ids"][r] == k]
    pair = ids[r, k - 1]
    np.testing.assert_array_equal(source[:-1], np.asarray(tokenizer(task.train_sources[pair])))
    np.testing.assert_array_equal(target[1:, 0], target[:-1, 1])  # labels: inputs shifted
    np.testing.assert_array_equal(target[:-1, 1],
                                  np.asarray(tokenizer(task.train_targets[pair])))
    # Every epoch: all the rows, once, in an order of its own; the same batch count.
    epochs = []
    for epoch in (0, 1):
        batches = list(task.train_dataset_fn(epoch))
        assert len(batches) == task.batches_per_epoch
        epochs.append(np.concatenate([np.asarray(x["source_ids"]) for x, _ in batches]))
    assert sorted(map(bytes, epochs[0])) == sorted(map(bytes, epochs[1]))
    assert sorted(map(bytes, epochs[0])) == sorted(map(bytes, rows["inputs"].astype("int32")))
    assert not np.array_equal(epochs[0], epochs[1])


def test_a_packed_translation_run_trains(tmp_path):
    # A constant rate: the recipe's schedule warms up over 1000 steps.
    overrides = TRANSLATION_PACKED + ["training.epochs=3", "training.jit_compile=false",
                                      'training.schedule={"name": "constant"}',
                                      "training.optimizer.learning_rate=0.005"]
    results = runs.train(TRANSLATION, overrides, output=str(tmp_path / "run"), export=False,
                         verbose=0)
    with open(os.path.join(results["output"], "checkpoints", "history.json")) as handle:
        losses = json.load(handle)["loss"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
    assert set(results["metrics"]) >= {"bleu", "exact_match"}


def test_prepare_stores_the_packed_translation_rows_and_reads_them_back(tmp_path):
    overrides = TRANSLATION_PACKED + ["training.epochs=2"]
    recipe = _recipe(overrides, TRANSLATION)
    directory = str(tmp_path / "prepared")
    prepared_module.prepare(TRANSLATION, overrides, output=directory, verbose=False)
    data = prepared_module.PreparedData(directory, recipe)
    task = make_task(recipe).prepare()
    for epoch in (0, 1):
        stored = data.batches("train", epoch, task.finish_prepared)
        expected = list(task.train_dataset_fn(epoch))
        assert len(stored) == len(expected) == task.batches_per_epoch
        for want, got in zip(expected, stored, strict=True):
            assert sorted(got[0]) == sorted(want[0])  # the packed inputs, by name
            assert {"source_segment_ids", "target_positions"} <= set(got[0])
            for a, b in zip(tf.nest.flatten(tuple(want)), tf.nest.flatten(tuple(got)),
                            strict=True):
                a = np.asarray(a)
                assert a.dtype == b.dtype and a.shape == b.shape, epoch
                np.testing.assert_array_equal(b, a, err_msg=f"train {epoch}")
    # A model made from the prepared state alone takes every stored batch.
    fresh = make_task(recipe)
    fresh.use_prepared(data.state)
    data.check(fresh.build_model(), fresh)
