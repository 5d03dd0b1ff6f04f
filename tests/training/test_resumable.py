"""ResumableTrainer and its checkpoints: a SIGKILLed run resumes exactly,
corrupt files are skipped, mismatched checkpoints are refused."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_attn._keras_compat import global_state

from keras_attn.errors import CorruptCheckpointError
from keras_attn.training import ResumableTrainer
from keras_attn.training import checkpoints
from keras_attn.training import restore_latest

pytestmark = pytest.mark.tf_only

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "_resumable_worker.py")
STEPS = 6  # batches per epoch of `_data`


# --- a tiny in-process model ---------------------------------------------


def _model(width=8, seed=0, optimizer="adam", extra_layer=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((4,)), keras.layers.Dense(width, activation="relu")]
    layers += [keras.layers.Dense(width)] if extra_layer else []
    layers += [keras.layers.Dropout(0.5), keras.layers.Dense(2)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01) if optimizer == "adam" else keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data(epoch):
    """6 batches of 4, shuffled by a function of the epoch only."""
    x = np.random.default_rng(3).standard_normal((24, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    order = np.random.default_rng([1, epoch]).permutation(len(x))
    return tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(4)


def _values(variables):
    return [keras.ops.convert_to_numpy(v).copy() for v in variables]


def _assert_all_equal(got, expected, atol=0.0):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def _files(directory):
    return sorted(os.listdir(directory))


def _npz_group(path, group):
    with np.load(path) as npz:
        count = sum(name.startswith(group + ".") for name in npz.files)
        return [npz[f"{group}.{index}"] for index in range(count)]


def _train(directory, model=None, epochs=1, every=2, fit_kwargs=None, **kwargs):
    model = model or _model()
    trainer = ResumableTrainer(directory, checkpoint_every=every, max_to_keep=3, **kwargs)
    history = trainer.fit(
        model, _data, epochs=epochs, steps_per_epoch=STEPS, verbose=0, **(fit_kwargs or {})
    )
    return model, history


class _Crash(keras.callbacks.Callback):
    """Raises after global step `at` (before that step's checkpoint) and
    records what a caller's callback sees."""

    def __init__(self, at=None):
        super().__init__()
        self.at, self.epoch, self.events = at, 0, []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", self.params["epochs"], self.params["steps"]))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.events.append((self.epoch, batch))
        if self.epoch * STEPS + batch + 1 == self.at:
            raise RuntimeError("crash")


# --- checkpoint contents, retention, history -------------------------------


def test_checkpoints_hold_all_state_and_keep_the_newest(tmp_path):
    directory = str(tmp_path / "ckpt")
    model, history = _train(directory, epochs=2, every=4)
    # Saved at steps 4, 6 (epoch end), 8, 12 (epoch end); max_to_keep=3.
    assert _files(directory) == [
        "ckpt-00000006.json", "ckpt-00000006.npz", "ckpt-00000008.json",
        "ckpt-00000008.npz", "ckpt-00000012.json", "ckpt-00000012.npz", "history.json",
    ]
    with open(os.path.join(directory, "ckpt-00000012.json")) as f:
        manifest = json.load(f)
    assert (manifest["step"], manifest["epoch"], manifest["step_in_epoch"]) == (12, 2, 0)
    assert manifest["steps_per_epoch"] == STEPS and manifest["fingerprint"] == {}
    npz = os.path.join(directory, "ckpt-00000012.npz")
    assert manifest["sha256"] == checkpoints._sha256_of_file(npz)
    assert manifest["versions"]["keras"] == keras.__version__
    specs = manifest["variables"]["model"]
    assert [s["path"] for s in specs] == [v.path for v in model.variables]
    assert [tuple(s["shape"]) for s in specs] == [tuple(v.shape) for v in model.variables]
    # The dropout seed state is a model variable; it advanced and was saved.
    seed_index = [i for i, v in enumerate(model.variables) if "seed_generator_state" in v.path]
    assert len(seed_index) == 1
    saved = _npz_group(npz, "model")
    _assert_all_equal(saved, _values(model.variables))
    assert saved[seed_index[0]][1] == 12  # one draw per step
    _assert_all_equal(_npz_group(npz, "optimizer"), _values(model.optimizer.variables))
    assert int(_npz_group(npz, "optimizer")[0]) == 12  # iterations
    assert "global_seed_generator" not in manifest["variables"]  # never created
    # History: one value per epoch, also on disk and in the manifest.
    assert sorted(history) == ["accuracy", "loss"] and len(history["loss"]) == 2
    with open(os.path.join(directory, "history.json")) as f:
        assert json.load(f) == history == manifest["history"]


def test_crash_mid_epoch_then_resume_is_exact_and_callbacks_see_one_run(tmp_path):
    validation = {"validation_data": _data(99).take(2)}
    reference, reference_history = _train(str(tmp_path / "a"), epochs=2, fit_kwargs=validation)
    directory = str(tmp_path / "b")
    crash = _Crash(at=9)  # epoch 1, after its 3rd batch; newest checkpoint: step 8
    with pytest.raises(RuntimeError, match="crash"):
        _train(directory, epochs=2, fit_kwargs=dict(validation, callbacks=[crash]))
    assert crash.events[0] == ("train_begin", 2, STEPS)
    assert checkpoints.CheckpointManager(directory).steps() == [4, 6, 8]

    model = _model(seed=7)  # other initial weights and dropout seeds: all restored
    watcher = _Crash()
    _, history = _train(
        directory, model=model, epochs=2, fit_kwargs=dict(validation, callbacks=[watcher])
    )
    _assert_all_equal(_values(model.variables), _values(reference.variables), atol=1e-6)
    _assert_all_equal(
        _values(model.optimizer.variables), _values(reference.optimizer.variables), atol=1e-6
    )
    # The interrupted epoch's metrics were restored: the history is the same.
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert history.keys() == reference_history.keys()
    for name in history:
        np.testing.assert_allclose(history[name], reference_history[name], atol=1e-6)
    # One run for the callbacks: begin / end once, batches counted from the
    # epoch's start (the resumed epoch 1 starts after its batch 1).
    assert watcher.events == [("train_begin", 2, STEPS)] + [(1, b) for b in range(2, STEPS)] + [
        ("train_end",)
    ]


class _Stop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            self.model.stop_training = True


def test_a_run_stopped_by_a_callback_saves_and_continues_when_called_again(tmp_path):
    reference, reference_history = _train(str(tmp_path / "a"), epochs=2)
    directory = str(tmp_path / "b")
    _, history = _train(directory, epochs=2, fit_kwargs={"callbacks": [_Stop()]})
    assert history == {}  # stopped inside epoch 0: no finished epoch
    assert checkpoints.CheckpointManager(directory).steps() == [2, 3]
    model, history = _train(directory, model=_model(seed=4), epochs=2)
    _assert_all_equal(_values(model.variables), _values(reference.variables), atol=1e-6)
    np.testing.assert_allclose(history["loss"], reference_history["loss"], atol=1e-6)


def test_a_finished_run_restores_and_returns_its_history(tmp_path, capsys):
    directory = str(tmp_path / "ckpt")
    reference, history = _train(directory)
    model = _model(seed=3)
    again = ResumableTrainer(directory, checkpoint_every=2).fit(
        model, _data, epochs=1, steps_per_epoch=STEPS, verbose=1
    )
    assert again == history
    assert "ckpt-00000006.npz: all 1 epochs are done" in capsys.readouterr().out
    _assert_all_equal(_values(model.variables), _values(reference.variables))
    _train(directory, epochs=2)  # a finished run can be extended
    with pytest.raises(ValueError, match="past the end of this run. Received: epochs=1"):
        _train(directory, epochs=1)


def test_the_global_seed_generator_is_saved_and_recreated(tmp_path):
    directory = str(tmp_path / "ckpt")
    model = _model()  # `keras.utils.set_random_seed` removes the generator
    keras.random.normal((2,))  # creates it (Keras makes it lazily)
    _train(directory, model=model)
    state = keras.ops.convert_to_numpy(
        global_state.get_global_attribute("global_seed_generator").state
    ).copy()
    np.testing.assert_array_equal(
        _npz_group(os.path.join(directory, "ckpt-00000006.npz"), "global_seed_generator")[0],
        state,
    )
    keras.utils.set_random_seed(5)  # removes it
    assert global_state.get_global_attribute("global_seed_generator") is None
    _train(directory, model=_model(seed=5))
    restored = global_state.get_global_attribute("global_seed_generator")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored.state), state)


# --- corrupt files ------------------------------------------------------------


def _truncate(path):
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_byte(path):
    with open(path, "rb+") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _bad_json(path):
    with open(path, "w") as f:
        f.write('{"step": 6, ')


def _edited_manifest(path):
    with open(path) as f:
        manifest = json.load(f)
    manifest["epoch"] = 0  # valid JSON, but the checksum no longer matches
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize(
    "corrupt, suffix",
    [(_truncate, "npz"), (_flip_byte, "npz"), (_bad_json, "json"), (_edited_manifest, "json")],
)
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, corrupt, suffix):
    directory = str(tmp_path / "ckpt")
    reference, _ = _train(directory)  # checkpoints 2, 4, 6
    corrupt(os.path.join(directory, f"ckpt-00000006.{suffix}"))
    model = _model(seed=1)
    with pytest.warns(UserWarning, match=rf"ckpt-00000006\.{suffix} is corrupt"):
        assert restore_latest(model, directory) == 4
    _assert_all_equal(
        _values(model.variables), _npz_group(os.path.join(directory, "ckpt-00000004.npz"), "model")
    )
    if corrupt is _truncate:
        # fit resumes from step 4, writes step 6 again and ends where the
        # uninterrupted run ended.
        with pytest.warns(UserWarning, match="ckpt-00000006.npz is corrupt"):
            _train(directory, model=model)
        _assert_all_equal(_values(model.variables), _values(reference.variables), atol=1e-6)
        assert restore_latest(_model(seed=2), directory) == 6  # intact again


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    directory = str(tmp_path / "ckpt")
    _train(directory)
    for name in glob.glob(os.path.join(directory, "ckpt-*.npz")):
        _flip_byte(name)
    model = _model(seed=1)
    before = _values(model.variables)
    with pytest.warns(UserWarning) as caught:
        with pytest.raises(CorruptCheckpointError, match="No intact checkpoint in `directory`="):
            restore_latest(model, directory)
    assert [re.search(r"ckpt-\d+\.npz", str(w.message)).group() for w in caught] == [
        "ckpt-00000006.npz", "ckpt-00000004.npz", "ckpt-00000002.npz"
    ]
    with pytest.warns(UserWarning), pytest.raises(CorruptCheckpointError, match="No intact checkpoint"):
        _train(directory, model=model)
    _assert_all_equal(_values(model.variables), before)


def test_interrupted_writes_leave_nothing_that_counts(tmp_path):
    directory = str(tmp_path / "ckpt")
    _train(directory)
    # A write killed before its rename, and one killed before its manifest.
    stale = os.path.join(directory, ".ckpt-00000008.npz.x1y2.tmp")
    with open(stale, "wb") as f:
        f.write(b"PK\x03\x04 partial")
    shutil.copy(
        os.path.join(directory, "ckpt-00000006.npz"), os.path.join(directory, "ckpt-00000008.npz")
    )
    with pytest.warns(UserWarning, match=r"ckpt-00000008\.npz has no manifest"):
        assert restore_latest(_model(), directory) == 6
    assert os.path.exists(stale)  # readers delete nothing
    with pytest.warns(UserWarning, match="has no manifest"):
        _train(directory, epochs=2)
    assert _files(directory) == [
        "ckpt-00000008.json", "ckpt-00000008.npz", "ckpt-00000010.json",
        "ckpt-00000010.npz", "ckpt-00000012.json", "ckpt-00000012.npz", "history.json",
    ]
    assert restore_latest(_model(), str(tmp_path / "missing")) is None


# --- mismatches ---------------------------------------------------------------


def test_a_checkpoint_of_another_architecture_is_refused_unassigned(tmp_path):
    directory = str(tmp_path / "ckpt")
    _train(directory)
    wider = _model(width=16, seed=1)
    before = _values(wider.variables)
    with pytest.raises(
        ValueError,
        match=r"ckpt-00000006\.npz does not match the model: model variable 0 is "
        r"'sequential/dense/kernel' \(4, 8\) float32 in the checkpoint and "
        r"'sequential\w*/dense\w*/kernel' \(4, 16\) float32 in the model; model variable 1",
    ):
        restore_latest(wider, directory)
    deeper = _model(extra_layer=True, seed=1)
    with pytest.raises(ValueError, match="holds 5 model variables, the model has 7"):
        _train(directory, model=deeper)
    _assert_all_equal(_values(wider.variables), before)
    # Same weights, another optimizer: refused before the weights are touched.
    sgd = _model(optimizer="sgd", seed=1)
    before = _values(sgd.variables)
    with pytest.raises(ValueError, match=r"holds \d+ optimizer variables, the model has \d+"):
        _train(directory, model=sgd)
    _assert_all_equal(_values(sgd.variables), before)


def test_a_checkpoint_with_another_fingerprint_is_refused_unassigned(tmp_path):
    directory = str(tmp_path / "ckpt")
    _train(directory, fingerprint={"data": {"seed": 1}, "model": "tiny"})
    model = _model(seed=1)
    before = _values(model.variables)
    with pytest.raises(
        ValueError,
        match=r"ckpt-00000006\.npz was written with another `fingerprint`: "
        r"data\.seed: checkpoint 1, now 2; extra: checkpoint '<absent>', now 1\.",
    ):
        _train(
            directory, model=model, fingerprint={"data": {"seed": 2}, "model": "tiny", "extra": 1}
        )
    _assert_all_equal(_values(model.variables), before)
    assert int(model.optimizer.iterations) == 0
    with pytest.raises(ValueError, match="data.seed: checkpoint 1, now 3"):
        restore_latest(model, directory, fingerprint={"data": {"seed": 3}, "model": "tiny"})
    assert restore_latest(model, directory, fingerprint={"model": "tiny", "data": {"seed": 1}}) == 6
    with pytest.raises(ValueError, match="steps_per_epoch=6.*Received: steps_per_epoch=3"):
        ResumableTrainer(directory).fit(_model(), _data, epochs=2, steps_per_epoch=3, verbose=0)


# --- arguments --------------------------------------------------------------


def test_arguments_are_checked(tmp_path):
    directory = str(tmp_path / "ckpt")
    for kwargs, message in [
        ({"checkpoint_every": 0}, "Received: checkpoint_every=0"),
        ({"max_to_keep": 0}, "Received: max_to_keep=0"),
        ({"fingerprint": ["a"]}, r"Received: fingerprint=\['a'\]"),
        ({"fingerprint": {"a": object()}}, "JSON-able dict or None .*not JSON serializable"),
    ]:
        with pytest.raises(ValueError, match=message):
            ResumableTrainer(directory, **kwargs)
    with pytest.raises(ValueError, match="Received: directory=''"):
        ResumableTrainer("")
    trainer = ResumableTrainer(directory)
    model = _model()
    for kwargs, message in [
        ({"epochs": 0}, "Received: epochs=0"),
        ({"steps_per_epoch": 0}, "Received: steps_per_epoch=0"),
        ({"train_dataset_fn": None}, "Received: train_dataset_fn=None"),
        ({"train_dataset_fn": lambda e: np.zeros(3)}, r"train_dataset_fn\(0\) -> ndarray"),
        ({"verbose": 3}, "Received: verbose=3"),
        ({"steps_per_epoch": 7}, r"`train_dataset_fn\(0\)` yields 6 batches, fewer than "),
    ]:
        arguments = dict(train_dataset_fn=_data, epochs=1, steps_per_epoch=STEPS, verbose=0)
        arguments.update(kwargs)
        with pytest.raises(ValueError, match=message):
            trainer.fit(model, **arguments)
    # A length tf.data cannot tell in advance: found out at the epoch end.
    unknown = lambda epoch: _data(epoch).filter(lambda x, y: True)  # noqa: E731
    with pytest.warns(UserWarning, match="ran out of data"), pytest.raises(
        ValueError, match=r"`train_dataset_fn\(0\)` ran out after 6 batches, fewer than "
        "steps_per_epoch=7"
    ):
        trainer.fit(model, unknown, epochs=1, steps_per_epoch=7, verbose=0)
    assert _files(directory) == ["history.json"]  # the epoch end that failed saved nothing
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="`model` must be compiled"):
        trainer.fit(uncompiled, _data, epochs=1, steps_per_epoch=STEPS)


# --- SIGKILL in a separate process: the headline --------------------------------


def _command(directory, result, *flags):
    return [sys.executable, WORKER, str(directory), str(result), *flags]


def _env(backend):
    return dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")


def _run(command, backend="tensorflow"):
    result = subprocess.run(
        command, capture_output=True, text=True, env=_env(backend), timeout=300
    )
    return result


def _assert_same_run(result, reference):
    with np.load(result) as got, np.load(reference) as expected:
        assert got.files == expected.files
        arrays = [k for k in got.files if k != "history"]
        difference = max(float(np.max(np.abs(got[k] - expected[k]), initial=0)) for k in arrays)
        assert difference <= 1e-6, difference
        got_history = json.loads(str(got["history"]))
        expected_history = json.loads(str(expected["history"]))
        assert len(got_history["loss"]) == 3
        for name in expected_history:
            np.testing.assert_allclose(got_history[name], expected_history[name], atol=1e-6)
    return difference


def _resume_position(stdout):
    match = re.search(r"resuming from ckpt-(\d+)\.npz at epoch (\d)/3 step (\d+)/10", stdout)
    assert match, stdout
    return tuple(int(g) for g in match.groups())


def _reference_flags(tmp_path):
    """The killed process trains the uninterrupted run first (in its own
    directory): the reference, written to the returned path."""
    reference = tmp_path / "reference.npz"
    return reference, ["--reference", str(tmp_path / "reference"), str(reference)]


@pytest.mark.large
def test_sigkill_mid_epoch_then_rerun_ends_with_the_uninterrupted_weights(tmp_path):
    directory, result = tmp_path / "ckpt", tmp_path / "result.npz"
    reference, flags = _reference_flags(tmp_path)
    process = subprocess.Popen(
        _command(directory, result, "--hang-after-step", "13", *flags), env=_env("tensorflow"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    manager = checkpoints.CheckpointManager(directory)
    deadline = time.monotonic() + 300
    try:  # kill it once the checkpoint of step 12 (epoch 2 is steps 11-20) is there
        while not any(step >= 12 for step in manager.steps()):
            assert process.poll() is None, "the worker ended before it was killed"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL and not result.exists()

    resumed = _run(_command(directory, result))  # at full speed: nothing to kill
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    step, epoch, step_in_epoch = _resume_position(resumed.stdout)
    assert epoch == 2 and 0 < step_in_epoch < 10 and step == 10 + step_in_epoch
    _assert_same_run(result, reference)
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
    assert len(manager.steps()) == 3


@pytest.mark.large
def test_sigkill_at_an_epoch_boundary_then_rerun_is_exact(tmp_path):
    directory, result = tmp_path / "ckpt", tmp_path / "result.npz"
    reference, flags = _reference_flags(tmp_path)
    killed = _run(_command(directory, result, "--die-at-epoch-begin", "2", *flags))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run(_command(directory, result))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _resume_position(resumed.stdout) == (20, 3, 0)
    _assert_same_run(result, reference)
    with open(directory / "history.json") as f:
        assert len(json.load(f)["loss"]) == 3


@pytest.mark.large
def test_sigkill_mid_epoch_on_jax_then_rerun_is_exact_and_restores_on_tensorflow(tmp_path):
    directory, result = tmp_path / "b", tmp_path / "result.npz"
    reference, flags = _reference_flags(tmp_path)
    killed = _run(_command(directory, result, "--die-at-step", "17", *flags), backend="jax")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run(_command(directory, result), backend="jax")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _resume_position(resumed.stdout) == (15, 2, 5)
    _assert_same_run(result, reference)

    # The same weights on TensorFlow (the seed states are uint32 on JAX,
    # int64 here): what `keras-attn export` does after a JAX run.
    sys.path.insert(0, HERE)
    try:
        import _resumable_worker as worker
    finally:
        sys.path.remove(HERE)
    model = worker.build_model()
    assert restore_latest(model, directory) == 30
    with np.load(result) as trained:
        for index, variable in enumerate(model.variables):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(variable), trained[f"model.{index}"]
            )


# --- non-finite state is never checkpointed ------------------------------


def _data_with_nan_at_batch(bad_batch):
    def fn(epoch):
        x = np.random.default_rng(3).standard_normal((24, 4)).astype("float32")
        x[bad_batch * 4] = np.nan  # the first example of that batch
        y = (np.nan_to_num(x[:, 0]) > 0).astype("int32")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)

    return fn


def test_a_nan_step_ends_the_run_and_the_last_good_checkpoint_stays(tmp_path):
    directory = str(tmp_path / "run")
    # A plain Keras model (no keras_attn guard on its optimizer): the NaN
    # batch reaches its weights, not its loss, and the trainer must not save
    # them. The NaN is hidden from the loss by an explicit where() after the
    # first layer (its gradient, NaN input times 0, is still NaN); a ReLU hid
    # it on some CPUs only (relu(NaN) is NaN on others).
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(8),
        keras.layers.Lambda(lambda h: keras.ops.where(keras.ops.isnan(h), 0.0, h)),
        keras.layers.ReLU(), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = ResumableTrainer(directory, checkpoint_every=1, max_to_keep=2)
    with pytest.raises(ValueError, match="Not writing checkpoint 4: model variable"):
        trainer.fit(model, _data_with_nan_at_batch(3), epochs=1, steps_per_epoch=STEPS,
                    verbose=0)
    manager = checkpoints.CheckpointManager(directory)
    assert manager.steps() == [2, 3]  # written after steps 2 and 3; none after the bad one
    latest = manager.latest()
    assert latest.step == 3
    for group in ("model", "optimizer"):
        for array in latest.arrays[group]:
            assert array.dtype.kind != "f" or np.all(np.isfinite(array))


def test_checkpoints_of_non_finite_weights_are_refused(tmp_path):
    directory = str(tmp_path / "run")
    model = _model()
    _train(directory, model=model, every=3)
    steps = checkpoints.CheckpointManager(directory).steps()
    model.layers[0].kernel.assign(np.full(model.layers[0].kernel.shape, np.nan, "float32"))
    trainer = ResumableTrainer(directory, checkpoint_every=3, max_to_keep=1)
    with pytest.raises(ValueError, match="Not writing checkpoint 99: model variable .*kernel.* non-finite"):
        trainer._write_checkpoint(model, 16, 3, STEPS, {})
    # Nothing written, nothing pruned (max_to_keep=1 would have pruned).
    assert checkpoints.CheckpointManager(directory).steps() == steps
