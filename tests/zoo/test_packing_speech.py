"""`data.packing` for speech recipes (issue 42): the speech_ctc task packs
each training utterance's log-mel features, computed by the model's own
front end, into rows; a features-input twin of the model trains on them and
the run keeps the waveform model with the twin's weights, so that
evaluation, `load_run` from a checkpoint and export read waveforms as in an
unpacked run."""

import json
import os

import keras
import numpy as np
import pytest

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.errors import RecipeError
from keras_attn.training.resumable import restore_latest
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.recipe import validate_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

NAME = "conformer_tiny_digits"
PACKED = tiny_overrides(NAME, run=False) + ["data.packing=true"]
RUN = PACKED + ["training.epochs=2", "training.jit_compile=false",
                "training.checkpoint_every=2"]


def _segments(row):
    """The spans `[(start, end), ...]` of segments 1..k of a row."""
    return [tuple(np.flatnonzero(row == k)[[0, -1]] + [0, 1]) for k in range(1, row.max() + 1)]


@pytest.fixture(scope="module")
def task():
    return make_task(load_recipe(recipe_path(NAME), PACKED)).prepare()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("packed_speech") / "run")
    results = runs.train(recipe_path(NAME), RUN, output=output, export=False, verbose=0)
    return output, results


def test_speech_packs_embedded_and_files_data_only():
    with open(recipe_path(NAME)) as handle:
        recipe = json.load(handle)
    recipe["data"] = {"dataset": "tfds:librispeech", "packing": True}
    with pytest.raises(RecipeError, match=r"Recipe key `data\.packing` is for embedded and "
                                          r"files datasets.*Received: data\.packing=True"):
        validate_recipe(recipe)
    # Prepared speech data stores unpacked batches: refused by name.
    task = make_task(load_recipe(recipe_path(NAME), PACKED))
    with pytest.raises(ValueError, match=r"Received: data\.packing=True"):
        task.check_preparable()


def test_every_training_utterance_is_packed_once_with_the_front_ends_features(task):
    """Each utterance sits once in the rows, starting at a multiple of 4
    frames, with the frames the waveform model's front end gives it alone
    and its own transcript."""
    rows = task.packed_rows
    ids = rows["example_ids"]
    waveforms, transcripts = task.train_split
    assert sorted(ids[ids >= 0].tolist()) == list(range(len(waveforms)))
    assert (ids >= 0).sum(axis=1).max() > 1  # rows do hold several utterances
    model = task.served_model(task.build_model())  # the waveform model
    front_end = model.get_layer("log_mel")
    for r, row in enumerate(rows["segment_ids"]):
        for slot, (start, end) in enumerate(_segments(row)):
            index = ids[r, slot]
            assert start % 4 == 0
            alone = keras.ops.convert_to_numpy(front_end(
                waveforms[index][None], np.array([len(waveforms[index])], "int32")))[0]
            np.testing.assert_allclose(rows["inputs"][r, start:end], alone, atol=1e-4)
            np.testing.assert_array_equal(rows["positions"][r, start:end], np.arange(end - start))
            label = rows["labels"][r, slot]
            assert task._labels([transcripts[index]])[0].tolist() == label[label > 0].tolist()


def test_epochs_reorder_the_same_rows_as_a_function_of_seed_and_epoch(task):
    def rows(epoch):
        return np.concatenate([x["segment_ids"].numpy() for x, _ in task.train_dataset_fn(epoch)])

    first, second = rows(0), rows(1)
    assert len(first) == len(task.packed_rows["inputs"])
    assert task.batches_per_epoch == len(list(task.train_dataset_fn(0)))
    np.testing.assert_array_equal(rows(1), second)
    assert not np.array_equal(first, second)
    assert sorted(map(bytes, first)) == sorted(map(bytes, second))


def test_a_packed_run_trains_the_twin_and_keeps_the_waveform_model(run, task):
    output, results = run
    with open(os.path.join(output, "results.json")) as handle:
        assert json.load(handle)["metrics"] == results["metrics"]
    assert results["steps"] == 2 * task.batches_per_epoch
    model = keras.saving.load_model(os.path.join(output, "model.keras"), compile=False)
    assert model.conformer_config.input_type == "waveform"
    # model.keras holds the trained twin's weights (its last checkpoint),
    # which are not the initial ones.
    trained = make_task(load_recipe(recipe_path(NAME), RUN)).build_model()
    assert trained.conformer_config.input_type == "features"
    initial = {v.path: keras.ops.convert_to_numpy(v) for v in trained.weights}
    assert restore_latest(trained, os.path.join(output, "checkpoints")) == results["steps"]
    kept = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    assert sorted(kept) == sorted(initial)
    for variable in trained.weights:
        np.testing.assert_array_equal(kept[variable.path], variable, err_msg=variable.path)
    assert any(not np.array_equal(kept[path], initial[path]) for path in initial)
    # The twin's weights: its logits on an utterance's features are the kept
    # model's logits on the waveform.
    twin = task.build_model()
    by_path = {v.path: v for v in model.weights}
    for variable in twin.weights:
        variable.assign(by_path[variable.path])
    waveform = task.test_split[0][0]
    length = np.array([len(waveform)], "int32")
    features = task._features([waveform])[0][None]
    from_waveform = model({"waveform": waveform[None], "waveform_length": length})
    from_features = twin({"features": features,
                          "feature_length": np.array([features.shape[1]], "int32")})
    np.testing.assert_allclose(keras.ops.convert_to_numpy(from_features["logits"]),
                               keras.ops.convert_to_numpy(from_waveform["logits"]), atol=1e-4)


def test_the_packed_loss_goes_down_and_checkpoints_evaluate_as_waveform_models(run):
    output, results = run
    with open(os.path.join(output, "checkpoints", "history.json")) as handle:
        losses = json.load(handle)["loss"]
    assert len(losses) == 2 and losses[1] < losses[0]
    # An unfinished run is evaluated from its newest checkpoint (the twin's
    # weights), as the waveform model: the metrics of model.keras.
    os.rename(os.path.join(output, "model.keras"), os.path.join(output, "kept.keras"))
    try:
        _, model, source = runs.load_run(output)[1:]
        assert model.conformer_config.input_type == "waveform"
        assert source.startswith("checkpoint at step")
        _, metrics, _ = runs.evaluate(output)
        assert metrics == pytest.approx(results["metrics"], abs=1e-6)
    finally:
        os.rename(os.path.join(output, "kept.keras"), os.path.join(output, "model.keras"))
