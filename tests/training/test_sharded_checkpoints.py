"""Sharded (orbax) checkpoints on one JAX process: what `CheckpointManager`
and `restore_latest` do with them. Written by every process of a
model-parallel job in `tests/zoo/test_multiprocess_parallel.py`; here one
process writes them, which orbax allows, to check the reading side: the
restore, a model of another shape refused by name, an uncommitted directory
skipped, the pruning and the temporary directories."""

import os
import shutil

import keras
import numpy as np
import pytest

from keras_attn.training.checkpoints import CheckpointManager
from keras_attn.training.checkpoints import ShardedCheckpoint
from keras_attn.training.resumable import restore_latest

pytestmark = pytest.mark.jax_only  # the arrays saved are jax.Arrays
import orbax.checkpoint  # noqa: E402,F401  (the dev extra: missing, this fails, never skips)


def _model(units=4, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, name="dense"),
                              keras.layers.Dense(2, name="head")])
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
    manager.save(8, {"model": [(v.path, np.asarray(v)) for v in model.variables]})
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt-00000006.json", "ckpt-00000006.orbax", "ckpt-00000008.json", "ckpt-00000008.npz"]
