"""Sharded (orbax) checkpoints on one JAX process: what `CheckpointManager`
and `restore_latest` do with them. Written by every process of a
model-parallel job in `tests/zoo/test_multiprocess_parallel.py`; here one
process writes them, which orbax allows, to check the reading side: the
restore, a model of another shape refused by name, an uncommitted directory
skipped, the pruning and the temporary directories; and the attacks on it: a
byte flipped, a file removed or added (the digests), a manifest of wrong
field types (both formats), arrays that are not what the manifest says
(no cast, no padding), a manifest of another writer's progress."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

from keras_attn.errors import CorruptCheckpointError
from keras_attn.training.checkpoints import CheckpointManager
from keras_attn.training.checkpoints import ShardedCheckpoint
from keras_attn.training.checkpoints import _canonical_checksum
from keras_attn.training.checkpoints import directory_digests
from keras_attn.training.resumable import ResumableTrainer
from keras_attn.training.resumable import restore_latest

pytestmark = pytest.mark.jax_only  # the arrays saved are jax.Arrays
import orbax.checkpoint  # noqa: E402,F401  (the dev extra: missing, this fails, never skips)


def _model(units=4, seed=0, dtype=None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, name="dense",
                                                                    dtype=dtype),
                              keras.layers.Dense(2, name="head", dtype=dtype)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _save(manager, model, step):
    return manager.save_sharded(step, {"model": model.variables,
                                       "optimizer": model.optimizer.variables},
                                metadata={"epoch": 0})


def test_a_sharded_checkpoint_restores_and_another_shape_is_refused_by_name(tmp_path):
    saved = _model(seed=0)
    manager = CheckpointManager(tmp_path)
    assert _save(manager, saved, 3) == "ckpt-00000003"
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000003.json", "ckpt-00000003.orbax"]
    checkpoint = manager.latest()
    assert isinstance(checkpoint, ShardedCheckpoint) and checkpoint.step == 3
    assert checkpoint.manifest["format"] == "keras_attn.checkpoint.orbax/1"

    other = _model(seed=1)
    assert restore_latest(other, tmp_path) == 3
    for a, b in zip(saved.variables, other.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)

    wider = _model(units=5, seed=2)
    before = [np.asarray(v) for v in wider.variables]
    with pytest.raises(ValueError, match=r"ckpt-00000003\.orbax does not match the model: "
                       r"model variable 0 is 'sequential.*/dense/kernel' \(3, 4\) float32 "
                       r"in the checkpoint and '.*dense/kernel' \(3, 5\)"):
        restore_latest(wider, tmp_path)
    for value, variable in zip(before, wider.variables):  # nothing assigned
        np.testing.assert_array_equal(value, np.asarray(variable))


def test_uncommitted_arrays_are_skipped_and_temporary_directories_removed(tmp_path):
    model = _model()
    manager = CheckpointManager(tmp_path)
    _save(manager, model, 2)
    _save(manager, model, 4)
    # Step 4's arrays without orbax's commit (its metadata, written last).
    os.remove(tmp_path / "ckpt-00000004.orbax" / "_CHECKPOINT_METADATA")
    with pytest.warns(UserWarning, match=r"ckpt-00000004\.orbax is corrupt \(missing, or "
                      r"not committed by orbax\)\. Skipping it\."):
        assert manager.latest().step == 2
    # An orbax write killed midway leaves its temporary directory.
    os.makedirs(tmp_path / "ckpt-00000006.orbax.orbax-checkpoint-tmp-12" / "d")
    assert manager.remove_temporary_files() == ["ckpt-00000006.orbax.orbax-checkpoint-tmp-12"]
    assert not os.path.exists(tmp_path / "ckpt-00000006.orbax.orbax-checkpoint-tmp-12")


def test_pruning_removes_orbax_directories_and_the_other_format(tmp_path):
    model = _model()
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (2, 4, 6):
        _save(manager, model, step)
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000004.json", "ckpt-00000004.orbax", "ckpt-00000006.json", "ckpt-00000006.orbax"]
    # Committed arrays of step 8 whose manifest was never written (a kill
    # in between): written again over them.
    shutil.copytree(tmp_path / "ckpt-00000006.orbax", tmp_path / "ckpt-00000008.orbax")
    _save(manager, model, 8)
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000006.json", "ckpt-00000006.orbax", "ckpt-00000008.json", "ckpt-00000008.orbax"]
    # Step 8 written again as npz (a run resumed on one process): the orbax
    # arrays of that step go.
    _save_as("npz", manager, model, 8)
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000006.json", "ckpt-00000006.orbax", "ckpt-00000008.json", "ckpt-00000008.npz"]


def _save_as(fmt, manager, model, step):
    """Checkpoint `step` of `model` as an orbax directory or an npz file."""
    if fmt == "orbax":
        return _save(manager, model, step)
    return manager.save(step, {"model": [(v.path, np.asarray(v)) for v in model.variables]})


def _values(model):
    return [np.asarray(v) for v in model.variables]


def _edit_manifest(path, edit):
    """Rewrites the manifest `path` through `edit(dict)` with a valid checksum
    (as a person or another writer would: only its fields can refuse it)."""
    with open(path, encoding="utf-8") as stream:
        manifest = json.load(stream)
    edit(manifest)
    manifest["checksum"] = _canonical_checksum(manifest)
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(manifest, stream)


def _damage_largest(directory):
    """Flips one byte in the middle of the largest file under `directory`:
    a chunk of the widest array (orbax's OCDBT store checks its index's
    CRC-32C but not these; before the digests it restored another weight)."""
    files = [os.path.join(root, name) for root, _, names in os.walk(directory)
             for name in names]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as stream:
        stream.seek(os.path.getsize(largest) // 2)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0x10]))
    return os.path.relpath(largest, directory).replace(os.sep, "/")


@pytest.mark.parametrize("damage", ["flip", "remove", "add"])
def test_a_damaged_orbax_directory_is_skipped_for_the_older_npz_checkpoint(tmp_path, damage):
    # Wide enough (3 x 300) that the kernel is a chunk file of its own.
    older, newer = _model(units=300, seed=0), _model(units=300, seed=1)
    manager = CheckpointManager(tmp_path)
    _save_as("npz", manager, older, 2)
    _save(manager, newer, 4)
    directory = tmp_path / "ckpt-00000004.orbax"
    if damage == "flip":
        name = _damage_largest(directory)
        reason = f"the sha256 of {name} differs from the manifest's"
    elif damage == "remove":
        name = sorted(manager.latest().manifest["files"])[-1]
        os.remove(directory / name)
        reason = rf"1 file\(s\) of its manifest missing: \['{name}'\]"
    else:
        (directory / "d" / "stray").write_bytes(b"x")
        reason = r"1 file\(s\) its manifest does not list: \['d/stray'\]"
    model = _model(units=300, seed=2)
    with pytest.warns(UserWarning, match=rf"ckpt-00000004\.orbax is corrupt \({reason}\)\. "
                      r"Skipping it\."):
        assert restore_latest(model, tmp_path) == 2
    for expected, value in zip(_values(older), _values(model)):
        np.testing.assert_array_equal(expected, value)


def test_the_digests_cover_every_file_and_survive_a_restore(tmp_path):
    model = _model()
    manager = CheckpointManager(tmp_path)
    _save(manager, model, 3)
    files = manager.latest().manifest["files"]
    assert files == directory_digests(tmp_path / "ckpt-00000003.orbax")
    assert {"_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt"} <= set(files)
    for _ in range(2):  # orbax's reading leaves the directory as it was
        assert restore_latest(_model(seed=1), tmp_path) == 3


_EDITS = {
    "another step's arrays": (lambda m: m.update(file=m["file"].replace("3.", "2.")),
                              r"it describes 'ckpt-00000002\.(orbax|npz)'"),
    "another format": (lambda m: m.update(format="keras_attn.checkpoint.orbax/9"),
                       r"unknown format 'keras_attn\.checkpoint\.orbax/9'"),
    "no format": (lambda m: m.pop("format"), r"unknown format None"),
    "variables are str": (lambda m: m.update(variables="model"),
                          r"its variables are str, not a JSON object"),
    "a group is str": (lambda m: m["variables"].update(model="dense"),
                       r"its variables\.model is str, not a list"),
    "a shape is str": (lambda m: m["variables"]["model"][0].update(shape="3,4"),
                       r"its variables\.model\[0\] is not a path, shape and dtype"),
    "a negative dimension": (lambda m: m["variables"]["model"][0].update(shape=[3, -4]),
                             r"its variables\.model\[0\] is not a path, shape and dtype"),
    "no path": (lambda m: m["variables"]["model"][0].pop("path"),
                r"its variables\.model\[0\] is not a path, shape and dtype"),
    "an unknown dtype": (lambda m: m["variables"]["model"][0].update(dtype="float99"),
                         r"its variables\.model\[0\] has an unknown dtype 'float99'"),
    "a negative step": (lambda m: m.update(step=-3),
                        r"its step is -3, its name 'ckpt-00000003'"),
    "another step": (lambda m: m.update(step=5), r"its step is 5, its name 'ckpt-00000003'"),
    "a step as str": (lambda m: m.update(step="3"),
                      r"its step is '3', its name 'ckpt-00000003'"),
    "no digests": (lambda m: m.pop("files"),
                   r"its files are not \{path: \{size, sha256\}\} \(no digests"),
}


# Both formats share the checks; an npz manifest has no `files` (one sha256).
@pytest.mark.parametrize("fmt, edit", [(fmt, edit) for edit in sorted(_EDITS)
                                       for fmt in ("orbax", "npz")
                                       if (fmt, edit) != ("npz", "no digests")])
def test_a_manifest_of_wrong_field_types_is_corrupt_by_name(tmp_path, fmt, edit):
    change, reason = _EDITS[edit]
    model = _model()
    _save_as(fmt, CheckpointManager(tmp_path), model, 3)
    _edit_manifest(tmp_path / "ckpt-00000003.json", change)
    before = _values(model)
    with pytest.warns(UserWarning, match=r"Skipping it"):
        with pytest.raises(CorruptCheckpointError, match=r"No intact checkpoint in `directory`=.*"
                           r"ckpt-00000003\.json is corrupt \(" + reason):
            restore_latest(model, tmp_path)
    for value, after in zip(before, _values(model)):
        np.testing.assert_array_equal(value, after)


def _swap_arrays(tmp_path, other):
    """Step 3's orbax directory replaced by `other`'s (another model), its
    digests recomputed: the manifest and the arrays disagree, all else
    intact (a bug, or a person)."""
    elsewhere = tmp_path / "other"
    _save(CheckpointManager(elsewhere), other, 3)
    shutil.rmtree(tmp_path / "ckpt-00000003.orbax")
    shutil.copytree(elsewhere / "ckpt-00000003.orbax", tmp_path / "ckpt-00000003.orbax")
    files = directory_digests(tmp_path / "ckpt-00000003.orbax")
    _edit_manifest(tmp_path / "ckpt-00000003.json", lambda m: m.update(files=files))


def test_arrays_of_another_dtype_than_the_manifest_are_refused_not_cast(tmp_path):
    _save(CheckpointManager(tmp_path), _model(), 3)
    _swap_arrays(tmp_path, _model(seed=1, dtype="float16"))
    model = _model(seed=2)
    before = _values(model)
    with pytest.raises(CorruptCheckpointError, match=r"ckpt-00000003\.orbax does not hold what its "
                       r"manifest says: model array 0 \('.*dense/kernel'\) is \(3, 4\) "
                       r"float16, the manifest says \(3, 4\) float32"):
        restore_latest(model, tmp_path)
    for value, after in zip(before, _values(model)):
        np.testing.assert_array_equal(value, after)


def test_arrays_of_another_shape_than_the_manifest_are_refused_by_file(tmp_path):
    _save(CheckpointManager(tmp_path), _model(), 3)
    _swap_arrays(tmp_path, _model(units=5, seed=1))
    with pytest.raises(CorruptCheckpointError, match=r"Checkpoint .*ckpt-00000003\.orbax could not be "
                       r"read by orbax \(.*stored shape"):
        restore_latest(_model(seed=2), tmp_path)


def test_pruning_keeps_the_newest_checkpoints_whatever_their_format(tmp_path):
    model = _model()
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (2, 4, 6, 8):
        _save_as("npz" if step in (2, 6) else "orbax", manager, model, step)
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000006.json", "ckpt-00000006.npz", "ckpt-00000008.json", "ckpt-00000008.orbax"]
    _save_as("npz", manager, model, 10)
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000008.json", "ckpt-00000008.orbax", "ckpt-00000010.json", "ckpt-00000010.npz"]


@pytest.mark.parametrize("edit, received", [
    (lambda m: m.pop("epoch"), r"epoch=None, step_in_epoch=0, steps_per_epoch=3"),
    (lambda m: m.update(step_in_epoch=2), r"epoch=1, step_in_epoch=2, steps_per_epoch=3"),
    (lambda m: m.update(history=[]), r"epoch=1, .*, history=list"),
], ids=["no epoch", "step_in_epoch off its step", "history a list"])
def test_a_manifest_without_a_resumable_runs_progress_is_refused_by_name(tmp_path, edit,
                                                                         received):
    model = _model()
    CheckpointManager(tmp_path).save_sharded(
        3, {"model": model.variables, "optimizer": model.optimizer.variables},
        metadata={"epoch": 1, "step_in_epoch": 0, "steps_per_epoch": 3, "history": {},
                  "fingerprint": {}})
    _edit_manifest(tmp_path / "ckpt-00000003.json", edit)
    dataset = lambda epoch: None  # noqa: E731  (refused before any batch)
    with pytest.raises(ValueError, match=r"Checkpoint ckpt-00000003\.orbax does not hold a "
                       r"resumable run's progress at its step 3 .*Received: " + received):
        ResumableTrainer(tmp_path).fit(model, dataset, epochs=2, steps_per_epoch=3,
                                       verbose=0)


def test_a_sharded_checkpoint_of_another_recipe_is_refused_by_its_fingerprint(tmp_path):
    model = _model()
    groups = {"model": model.variables, "optimizer": model.optimizer.variables}
    CheckpointManager(tmp_path).save_sharded(3, groups, metadata={
        "fingerprint": {"recipe": {"name": "vit_tiny_digits", "training": {"epochs": 2}}}})
    other = _model(seed=1)
    before = _values(other)
    with pytest.raises(ValueError, match=r"Checkpoint ckpt-00000003\.orbax was written with "
                       r"another `fingerprint`: recipe\.training\.epochs: checkpoint 2, now 3"):
        restore_latest(other, tmp_path, fingerprint={
            "recipe": {"name": "vit_tiny_digits", "training": {"epochs": 3}}})
    for value, after in zip(before, _values(other)):
        np.testing.assert_array_equal(value, after)


def test_a_sharded_checkpoint_resumes_a_run_on_one_process_read_whole(tmp_path):
    # The state a model-parallel job saved at the end of epoch 1 of 2,
    # optimizer moments and the global seed state included; resumed here,
    # where nothing is split over processes: process 0 reads it whole.
    from keras_attn.training.resumable import _state

    saved = _model(seed=0)
    for variable in saved.optimizer.variables:
        variable.assign(np.full(variable.shape, 3, keras.backend.standardize_dtype(
            variable.dtype)))
    keras.random.uniform(())  # creates the global SeedGenerator
    state = _state(saved)
    assert "global_seed_generator" in state
    CheckpointManager(tmp_path).save_sharded(2, state, metadata={
        "epoch": 1, "step_in_epoch": 0, "steps_per_epoch": 2, "fingerprint": {},
        "history": {"loss": [0.5]}})
    seed_state = np.asarray(state["global_seed_generator"][0])

    resumed = _model(seed=1)
    keras.random.uniform(())  # moves the global seed state on
    history = ResumableTrainer(tmp_path).fit(resumed, lambda epoch: None, epochs=1,
                                             steps_per_epoch=2, verbose=0)
    assert history == {"loss": [0.5]}
    for a, b in zip(saved.variables + saved.optimizer.variables,
                    resumed.variables + resumed.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    from keras_attn._keras_compat import get_global_seed_generator

    np.testing.assert_array_equal(np.asarray(get_global_seed_generator().state), seed_state)


@pytest.mark.parametrize("fmt", ["orbax", "npz"])
def test_a_checkpoint_of_another_layer_count_names_its_first_real_difference(tmp_path, fmt):
    # A model of one more layer, built in the same session (another name:
    # `sequential_<n>`, which the hint does not count as a difference).
    model = _model()
    _save_as(fmt, CheckpointManager(tmp_path), model, 3)
    deeper = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="dense"),
                               keras.layers.Dense(4, name="middle"),
                               keras.layers.Dense(2, name="head")])
    with pytest.raises(ValueError, match=rf"ckpt-00000003\.{fmt} does not match the model: "
                       r"it holds 4 model variables, the model has 6\. The first difference "
                       r"is model variable 2: '.*/head/kernel' \(4, 2\) in the checkpoint, "
                       r"'.*/middle/kernel' \(4, 4\) in the model\."):
        restore_latest(deeper, tmp_path)
    shallower = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="dense")])
    with pytest.raises(ValueError, match=r"it holds 4 model variables, the model has 2\. The "
                       r"first 2 match; the first model variable of the checkpoint beyond "
                       r"them is '.*/head/kernel'\."):
        restore_latest(shallower, tmp_path)
