"""`data.packing` for speech recipes (issue 42): the speech_ctc task packs
each training utterance's log-mel features, computed by the model's own
front end, into rows; a features-input twin of the model trains on them and
the run keeps the waveform model with the twin's weights, so that
evaluation, `load_run` from a checkpoint and export read waveforms as in an
unpacked run. `keras-attn prepare` stores the rows the twin trains on, and a
run from those files is the run from tf.data."""

import glob
import json
import os
import shutil

import keras
import numpy as np
import pytest

from _tiny import recipe_path
from _tiny import tiny_overrides
from test_prepared import _edit_manifest
from test_prepared import _rewrite
from keras_attn.errors import RecipeError
from keras_attn.training.resumable import restore_latest
from keras_attn.zoo import prepared as prepared_module
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


# The tests of the module's packed run (and of the run from its prepared
# files) share one worker: the run is trained once.
RUN_GROUP = pytest.mark.xdist_group("packed_speech_run")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("packed_speech") / "run")
    results = runs.train(recipe_path(NAME), RUN, output=output, export=False, verbose=0)
    return output, results


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The packed run's data prepared (`keras-attn prepare`)."""
    directory = str(tmp_path_factory.mktemp("packed_speech_prepared") / "prepared")
    prepared_module.prepare(NAME, RUN, output=directory, verbose=False)
    return directory


def test_speech_packs_embedded_and_files_data_only(prepared):
    with open(recipe_path(NAME)) as handle:
        recipe = json.load(handle)
    recipe["data"] = {"dataset": "tfds:librispeech", "packing": True}
    with pytest.raises(RecipeError, match=r"Recipe key `data\.packing` is for embedded and "
                                          r"files datasets.*Received: data\.packing=True"):
        validate_recipe(recipe)
    # `prepare` stores the packed rows once, their features as float32, and
    # each epoch's batches as the rows they hold; the validation features
    # and the test waveforms' rows as for an unpacked run.
    data = prepared_module.PreparedData(prepared, load_recipe(recipe_path(NAME), RUN))
    assert sorted(data.files) == ["tables", "test", "train-0000", "train-0001", "validation"]
    assert data.files["tables"]["dtypes"] == {
        "x/features": "float32", "x/feature_length": "int32", "x/segment_ids": "int32",
        "x/positions": "int32", "y": "int32"}
    assert data.files["train-0000"]["dtypes"] == {"row": "int32"}
    assert sorted(data.files["validation"]["dtypes"]) == ["x/feature_length", "x/features", "y"]
    assert sorted(data.files["test"]["dtypes"]) == ["index", "length", "width", "y"]


@RUN_GROUP
def test_prepared_packed_batches_are_the_pipelines_batches(prepared, task):
    """Every epoch's packed batches and the validation features read back
    bit for bit as the tf.data pipelines give them, the test batches as the
    waveform model's; a model built from the prepared state alone takes
    every stored row."""
    recipe = load_recipe(recipe_path(NAME), RUN)
    data = prepared_module.PreparedData(prepared, recipe)
    fresh = make_task(recipe)
    fresh.use_prepared(data.state)
    for split, epoch, expected in (("train", 0, task.train_dataset_fn(0)),
                                   ("train", 1, task.train_dataset_fn(1)),
                                   ("validation", None, task.validation_data()),
                                   ("test", None, task.test_data())):
        stored = data.batches(split, epoch, fresh.finish_prepared)
        count = 0
        for want, got in zip(expected, stored, strict=True):
            if split == "train":
                assert sorted(got[0]) == ["feature_length", "features", "positions",
                                          "segment_ids"]
            want, got = keras.tree.flatten(tuple(want)), keras.tree.flatten(tuple(got))
            assert len(want) == len(got)
            for a, b in zip(want, got):
                a = np.asarray(a)
                assert a.dtype == b.dtype and a.shape == b.shape, (split, epoch)
                np.testing.assert_array_equal(b, a, err_msg=f"{split} {epoch}")
            count += 1
        assert count == len(stored)
    assert len(data.batches("train", 0)) == task.batches_per_epoch
    data.check(fresh.build_model(), fresh)


@RUN_GROUP
def test_training_from_prepared_files_is_training_from_tf_data(run, prepared, tmp_path):
    """On TensorFlow the stored batches are the pipeline's: the run from
    them trains the twin to the tf.data run's weights and losses, and keeps
    and scores the waveform model as it does."""
    output, reference = run
    from_files = runs.train(recipe_path(NAME), RUN, output=str(tmp_path / "files"),
                            export=False, verbose=0, data=prepared)
    assert from_files["data"].startswith("prepared: ")
    assert from_files["metrics"] == reference["metrics"]
    assert from_files["steps"] == reference["steps"]
    histories = []
    for run_directory in (output, from_files["output"]):
        with open(os.path.join(run_directory, "checkpoints", "history.json")) as handle:
            histories.append(json.load(handle))
    assert histories[1] == histories[0]
    models = [keras.saving.load_model(os.path.join(directory, "model.keras"), compile=False)
              for directory in (output, from_files["output"])]
    assert models[1].conformer_config.input_type == "waveform"
    for a, b in zip(models[0].weights, models[1].weights, strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(b),
                                      keras.ops.convert_to_numpy(a), err_msg=a.path)


def _weights(run_directory):
    """The newest checkpoint's arrays (the twin's weights and the optimizer)."""
    newest = sorted(glob.glob(os.path.join(run_directory, "checkpoints", "ckpt-*.npz")))[-1]
    with np.load(newest) as checkpoint:
        return {key: checkpoint[key] for key in checkpoint.files}


@RUN_GROUP
def test_a_packed_speech_run_resumes_exactly(run, tmp_path):
    """Cut back to the checkpoint of step 4 (inside the second epoch, as a
    kill right after it leaves the run), the run ends with the
    uninterrupted run's weights and optimizer."""
    whole, cut = run[0], str(tmp_path / "cut")
    kept = "ckpt-00000004."
    shutil.copytree(whole, cut, ignore=lambda _, names: [
        name for name in names if name in ("model.keras", "kept.keras", "results.json")
        or (name.startswith("ckpt-") and not name.startswith(kept))])
    assert sorted(os.listdir(os.path.join(cut, "checkpoints"))) == [
        kept + "json", kept + "npz", "history.json"]
    results = runs.train(recipe_path(NAME), RUN, output=cut, export=False, verbose=0)
    assert results["metrics"] == run[1]["metrics"]
    expected, resumed = _weights(whole), _weights(cut)
    assert sorted(resumed) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(resumed[key], expected[key], err_msg=key)


def test_packed_and_unpacked_prepared_data_are_refused_for_each_other(prepared, tmp_path):
    packed = load_recipe(recipe_path(NAME), RUN)
    unpacked = load_recipe(recipe_path(NAME), [item for item in RUN if item != "data.packing=true"])
    with pytest.raises(ValueError, match="prepared for another recipe: `data.packing` is True "
                                         "there and None here"):
        prepared_module.PreparedData(prepared, unpacked)
    # A directory prepared unpacked: its manifest holds the unpacked recipe's keys.
    directory = str(tmp_path / "unpacked")
    shutil.copytree(prepared, directory)
    _edit_manifest(directory, lambda manifest: manifest.update(
        recipe=prepared_module._data_keys(unpacked)))
    with pytest.raises(ValueError, match="prepared for another recipe: `data.packing` is None "
                                         "there and True here"):
        prepared_module.PreparedData(directory, packed)


def _two_utterance_row(arrays):
    """A row of the stored packed rows with two utterances or more, the end
    of its first utterance."""
    ids = arrays["x/segment_ids"]
    row = int(np.flatnonzero(ids.max(axis=1) > 1)[0])
    return row, int(np.flatnonzero(ids[row] == 1)[-1]) + 1


def _broken_segment_id(arrays):
    arrays["x/segment_ids"] = arrays["x/segment_ids"].astype("int32")
    row, _ = _two_utterance_row(arrays)
    arrays["x/segment_ids"][row, 5] = 2  # inside its first utterance: 1 2 1 breaks at 6


def _short_first_utterance(arrays):
    # Its first utterance cut to 4 frames: no frame left after the
    # subsampling for its transcript (the frames after it become a gap).
    arrays["x/segment_ids"] = arrays["x/segment_ids"].astype("int32")
    row, end = _two_utterance_row(arrays)
    arrays["x/segment_ids"][row, 4:end] = 0


def _row_past_the_table(arrays):
    arrays["row"] = arrays["row"].astype("int32") + 100


@pytest.mark.parametrize("name, change, message", [
    ("tables", _broken_segment_id, r"tables.npz: Invalid value for argument `segment_ids`: "
                                   r"the frames of a row's k utterances .* breaks it at frame 6"),
    ("tables", _short_first_utterance, r"tables.npz: a CTC label sequence is longer than its "
                                       r"utterance can emit .* 0 frames for utterance 1 of row"),
    ("train-0001", _row_past_the_table, r"train-0001.npz: `row` must lie in \[0, 9\)"),
], ids=["segment id", "label too long for its utterance", "row"])
def test_tampered_packed_rows_are_refused_naming_the_file(prepared, tmp_path, name, change,
                                                          message):
    """Rows edited and every digest computed again (as a forger could): the
    checks of the rows refuse them before the first step, naming the file."""
    directory = str(tmp_path / "tampered")
    shutil.copytree(prepared, directory)
    _rewrite(directory, name, change)
    output = str(tmp_path / "run")
    with pytest.raises(ValueError, match=message):
        runs.train(recipe_path(NAME), RUN, output=output, export=False, verbose=0,
                   data=directory)
    assert not glob.glob(os.path.join(output, "checkpoints", "ckpt-*"))  # no step was taken


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


@RUN_GROUP
def test_a_packed_lora_run_serves_its_adapters(run, task):
    """With `training.lora`, the twin that trains carries the adapters: the
    waveform model made from it (what a run evaluates from a checkpoint and
    saves) computes the adapted twin, not the base it started from (the
    adapters were dropped when copied by path)."""
    output, _ = run
    lora = make_task(load_recipe(recipe_path(NAME), PACKED + [
        f"training.lora.base={output}", "training.lora.rank=2"]))
    twin = lora.build_model()
    from keras_attn.models.lora import lora_layers

    adapted = lora_layers(twin)
    assert adapted  # the default targets, query and value, of every block
    rng = np.random.default_rng(0)
    for layer in adapted:  # as if fine-tuned: B is zero at the start
        layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape).astype("float32"))
    served = lora.served_model(twin)
    assert served.conformer_config.input_type == "waveform" and not lora_layers(served)
    waveform = task.test_split[0][0]
    features = task._features([waveform])[0][None]
    from_waveform = served({"waveform": waveform[None],
                            "waveform_length": np.array([len(waveform)], "int32")})
    from_features = twin({"features": features,
                          "feature_length": np.array([features.shape[1]], "int32")})
    base = keras.saving.load_model(os.path.join(output, "model.keras"), compile=False)
    from_base = base({"waveform": waveform[None],
                      "waveform_length": np.array([len(waveform)], "int32")})
    np.testing.assert_allclose(keras.ops.convert_to_numpy(from_waveform["logits"]),
                               keras.ops.convert_to_numpy(from_features["logits"]), atol=1e-4)
    assert np.abs(keras.ops.convert_to_numpy(from_waveform["logits"])
                  - keras.ops.convert_to_numpy(from_base["logits"])).max() > 1e-2


@RUN_GROUP
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


@RUN_GROUP
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
