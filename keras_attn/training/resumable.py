"""Exact, resumable training: `ResumableTrainer` and `restore_latest`.

A run killed at any instant (SIGKILL, pre-emption, a power cut) and started
again with the same call continues where its newest checkpoint left off and
ends with the weights an uninterrupted run ends with (to float32 round-off
on CPU; bit-identical in the tests here), dropout included.

Why not `keras.callbacks.BackupAndRestore`: it restarts an interrupted epoch
from its first batch (it records the batch but does not skip to it), and its
weights file (`model.save_weights`) holds the optimizer but not the dropout
`SeedGenerator` states, so a resumed run sees other batches and draws other
dropout masks than the uninterrupted one. Its files carry no checksum either.

What a checkpoint holds (see `checkpoints.py` for the file format):
- `model.variables`: weights, and the state of every `SeedGenerator`
  (dropout masks, SpecAugment, ...), which Keras lists there;
- `model.optimizer.variables` (iterations, moments, ...; the optimizer is
  built first when it is not, so that it has them to restore into);
- the Keras global `SeedGenerator` (used by `keras.random.*` calls without a
  seed) when it exists at the time of saving: it is created lazily, so it is
  recorded only when present and re-created on restore when absent;
- on PyTorch, torch's global random states (CPU, and CUDA when in use):
  Keras's PyTorch dropout draws from them, not from the SeedGenerators;
- `model.metrics_variables`: the running means of the interrupted epoch, so
  that its logged loss / metrics equal those of the uninterrupted run;
- the epoch, the step in the epoch, `steps_per_epoch`, the caller's
  `fingerprint`, and the history of the finished epochs.

The design: one `model.fit` call per epoch (`initial_epoch=e, epochs=e+1`)
on `train_dataset_fn(e)`, `.skip(k)` with `steps_per_epoch - k` steps for an
epoch resumed after step k. The data position is thus a pure function of
(epoch, step), with no tf.data iterator state to checkpoint, and Keras keeps
the compiled train function across the calls (the same function object in
every epoch, checked on TensorFlow). A callback saves every
`checkpoint_every` steps and at each epoch end (after validation, so that
the history in the checkpoint covers that epoch). The caller's callbacks see
one run: `on_train_begin` / `on_train_end` once, the full `epochs` and
`steps_per_epoch` in their params, batch indices counted from the start of
the epoch. Their own state (e.g. `EarlyStopping`'s patience) is not
checkpointed. A callback that sets `model.stop_training` ends the run after
a checkpoint; calling `fit` again continues it.

The step is counted by the trainer (`epoch * steps_per_epoch + step in the
epoch`), not read from `optimizer.iterations`, which an optimizer used before
`fit` (fine-tuning) or gradient accumulation would offset.

On JAX the trainer holds the variables outside the model during an epoch; the
callbacks read them through `Callback.model`, which syncs them back first, so
a checkpoint holds the values of the step it is named after.

Under model parallel across JAX processes (a weight split over the devices
of several processes, which no process can read whole) every process writes
its shards of each checkpoint through orbax-checkpoint into the one
`directory` that all of them must see, and process 0 writes the manifest
last (`CheckpointManager.save_sharded`; a directory per host is refused
before any step, `sharded.check_shared_directory`). On resumption each
process reads its own slices, whatever layout or process count wrote them;
a job whose state is not split now (one process, data parallel) has process
0 read the arrays whole and send them, as it does an npz checkpoint's.
Everything else, one process or data parallel, writes the npz checkpoints
as before.

Checkpoints with a corrupt file are skipped with a warning (the previous one
is used). When checkpoints exist but none is intact, `fit` raises
`CorruptCheckpointError` (a `ValueError`) instead of training from scratch: atomic writes mean a kill
cannot cause that, so the disk or a person did, and a silent restart would
spend the whole run again and then prune the evidence.
"""

import collections
import copy
import json
import numbers
import os
import time
import warnings

import keras
import numpy as np
from keras_attn._keras_compat import get_global_seed_generator
from keras_attn._keras_compat import random_seed_dtype
from keras_attn._keras_compat import set_global_seed_generator

from keras_attn.training.nonfinite import StopOnNonFiniteLoss
from keras_attn._checks import check_positive_int
from keras_attn.training import checkpoints
from keras_attn.training import distribute
from keras_attn.training import sharded

HISTORY_FILE = "history.json"


# What `checkpoints.check_group` reads of a variable.
_Spec = collections.namedtuple("_Spec", ["path", "shape", "dtype"])


def _state(model):
    """`{group: [variables]}` saved in a checkpoint, in a fixed order."""
    groups = {
        "model": list(model.variables),
        "optimizer": list(model.optimizer.variables),
        "metrics": list(model.metrics_variables),
    }
    generator = get_global_seed_generator()
    if generator is not None:
        groups["global_seed_generator"] = [generator.state]
    return groups


def _check_model(checkpoint, model, fingerprint):
    """Raises `ValueError` unless `checkpoint` is one of `model` (and of
    `fingerprint`, unless that is None)."""
    if fingerprint is not None:
        checkpoints.check_fingerprint(checkpoint, fingerprint)
    checkpoints.check_group(checkpoint, "model", model.variables, "model variable")


def _check_progress(checkpoint):
    """Raises `ValueError` unless `checkpoint`'s manifest holds the progress a
    `ResumableTrainer` writes, consistent with its step: ints `epoch` >= 0,
    `steps_per_epoch` > 0, `step_in_epoch` in [0, steps_per_epoch), step =
    epoch * steps_per_epoch + step_in_epoch, and a `history` dict (not so:
    written by another writer, or edited)."""
    manifest = checkpoint.manifest
    epoch, step_in_epoch, steps = (manifest.get(key) for key in
                                   ("epoch", "step_in_epoch", "steps_per_epoch"))
    if not (all(type(value) is int for value in (epoch, step_in_epoch, steps))
            and epoch >= 0 and steps > 0 and 0 <= step_in_epoch < steps
            and epoch * steps + step_in_epoch == checkpoint.step
            and isinstance(manifest.get("history"), dict)):
        raise ValueError(
            f"Checkpoint {checkpoint.file} does not hold a resumable run's progress "
            f"at its step {checkpoint.step} (step = epoch * steps_per_epoch + "
            f"step_in_epoch, and a history). Received: epoch={epoch!r}, "
            f"step_in_epoch={step_in_epoch!r}, steps_per_epoch={steps!r}, "
            f"history={type(manifest.get('history')).__name__}")


def _global_seed_generator():
    generator = get_global_seed_generator()
    if generator is None:
        # What `keras.random` would create lazily; its seed is overwritten
        # at once, so do not consume Python's `random` for it.
        generator = keras.random.SeedGenerator(seed=0)
        set_global_seed_generator(generator)
    return generator


def restore_latest(model, directory, fingerprint=None):
    """Loads the newest intact checkpoint of `directory` into `model`.

    Restores `model.variables` only (weights and seed-generator states), for
    evaluation or export; `ResumableTrainer.fit` restores the rest. A corrupt
    newer checkpoint is skipped with a warning.

    Args:
        model: a built model with the architecture of the checkpoint.
        directory: a `ResumableTrainer` directory.
        fingerprint: when not None, also required to equal the checkpoint's.

    Returns:
        The step of the checkpoint, or None (and `model` untouched) when
        `directory` holds none.

    Raises:
        ValueError: the checkpoint's variables (count, shapes) or fingerprint
            differ from `model`'s (nothing is assigned).
        CorruptCheckpointError: checkpoints exist and none is intact (a
            `ValueError` too).
    """
    fingerprint = None if fingerprint is None else _as_json(fingerprint)
    checkpoint = checkpoints.CheckpointManager(directory).latest()
    if checkpoint is None:
        return None
    _check_model(checkpoint, model, fingerprint)
    if isinstance(checkpoint, checkpoints.ShardedCheckpoint):
        checkpoint.load({"model": model.variables})
    checkpoints.assign_group(checkpoint, "model", model.variables)
    return checkpoint.step


def _as_json(fingerprint):
    """The fingerprint as it reads back from a manifest (tuples -> lists)."""
    if not isinstance(fingerprint, dict):
        raise ValueError(
            f"`fingerprint` must be a JSON-able dict or None. "
            f"Received: fingerprint={fingerprint!r}"
        )
    try:
        return json.loads(json.dumps(fingerprint, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"`fingerprint` must be a JSON-able dict or None ({error}). "
            f"Received: fingerprint={fingerprint!r}"
        ) from None


def _build_metrics(model, dataset):
    """Creates the compiled metrics' variables so that the interrupted epoch's
    running values can be restored into them before its first step. Keras's
    own `fit` does this (symbolically, nothing computed) on JAX and torch and
    under a tf.distribute strategy; plain TensorFlow defers it to the tracing
    of the first step, too late."""
    symbolic_build = getattr(model, "_symbolic_build", None)
    if symbolic_build is None:
        return
    if isinstance(dataset, keras.utils.PyDataset):
        first = dataset[0]
    else:
        first = next(iter(dataset.take(1)))
    symbolic_build(data_batch=first)


def _cardinality(dataset):
    """The number of batches when tf.data knows it, else None."""
    cardinality = getattr(dataset, "cardinality", None)
    if cardinality is None:
        return None
    value = int(cardinality() if callable(cardinality) else cardinality)
    return value if value >= 0 else None


class ResumableTrainer:
    """Trains a compiled model so that a killed run resumes exactly.

    Re-running the same `fit` in the same `directory` restores the newest
    intact checkpoint (weights, dropout and global seed states, optimizer,
    the interrupted epoch's metrics), runs the rest of the interrupted epoch
    on `train_dataset_fn(epoch).skip(step_in_epoch)`, then the remaining
    epochs: the final weights equal an uninterrupted run's. See the module
    docstring for what is saved and why this is not `BackupAndRestore`.

    Args:
        directory: where `ckpt-<step:08d>.npz` / `.json` and `history.json`
            go. One trainer writes to a directory at a time. With a model
            split over several JAX processes' devices (model parallel), one
            directory that every process sees: each writes its shards there
            (`ckpt-<step:08d>.orbax/`); a directory per host is a
            `ValueError` before any step.
        checkpoint_every: save every this many training steps (batches), and
            always at the end of each epoch.
        max_to_keep: the number of newest checkpoints kept.
        fingerprint: a JSON-able dict describing the run (e.g. the resolved
            recipe). A checkpoint written with another fingerprint is a
            `ValueError`, not a resume; None is the empty fingerprint. Leave
            out of it what may change between a run and its resumption.

    Example:

    ```python
    trainer = ResumableTrainer("runs/vit/checkpoints", checkpoint_every=100)
    history = trainer.fit(model, lambda epoch: make_dataset(seed=0, epoch=epoch),
                          epochs=60, steps_per_epoch=200)
    ```
    """

    def __init__(self, directory, checkpoint_every=100, max_to_keep=3, fingerprint=None):
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ValueError(
                f"`directory` must be a non-empty path. Received: directory={directory!r}"
            )
        self.directory = os.fspath(directory)
        self.checkpoint_every = check_positive_int("checkpoint_every", checkpoint_every)
        self.max_to_keep = check_positive_int("max_to_keep", max_to_keep)
        self.fingerprint = {} if fingerprint is None else _as_json(fingerprint)
        self.manager = checkpoints.CheckpointManager(self.directory, self.max_to_keep)
        self.sharded_state = False  # set by `fit`

    def fit(
        self,
        model,
        train_dataset_fn,
        epochs,
        steps_per_epoch,
        validation_data=None,
        callbacks=(),
        verbose="auto",
    ):
        """Trains (or resumes training) for `epochs` x `steps_per_epoch` steps.

        Args:
            model: a built, compiled `keras.Model` (inside the distribution
                scope, if any).
            train_dataset_fn: `epoch -> tf.data.Dataset` (or a
                `keras.utils.PyDataset` with `skip(k)` and `cardinality()`,
                as `keras_attn.zoo.prepared.Batches`) yielding at least
                `steps_per_epoch` batches, the same ones on every call (random
                choices drawn from stateless ops keyed by seed and epoch).
            epochs: the total number of epochs, finished ones included.
            steps_per_epoch: training steps per epoch.
            validation_data: passed to `model.fit` (evaluated at epoch ends).
            callbacks: Keras callbacks; they see one run over all the epochs
                of this call.
            verbose: "auto", 0, 1 or 2, as in `model.fit`.

        Returns:
            The history: `{name: [value per epoch]}` over all the epochs,
            those before an interruption included (also in
            `<directory>/history.json`).
        """
        epochs = check_positive_int("epochs", epochs)
        steps_per_epoch = check_positive_int("steps_per_epoch", steps_per_epoch)
        if not callable(train_dataset_fn):
            raise ValueError(
                "`train_dataset_fn` must be a function of the epoch. "
                f"Received: train_dataset_fn={train_dataset_fn!r}"
            )
        if verbose not in ("auto", 0, 1, 2):
            raise ValueError(
                f"`verbose` must be 'auto', 0, 1 or 2. Received: verbose={verbose!r}"
            )
        verbose = 1 if verbose == "auto" else verbose
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                "`model` must be compiled (it has no optimizer). "
                f"Received: model={getattr(model, 'name', model)!r}"
            )
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)

        # In a multi-process job process 0 alone reads and writes the
        # directory; the others receive what it restored (`_latest`).
        writer = distribute.process_index() == 0
        if writer:
            self.manager.remove_temporary_files()
        # Split over several processes' devices: every process writes its
        # shards into the one directory, which they must all see.
        self.sharded_state = sharded.spans_processes(
            list(model.variables) + list(model.optimizer.variables))
        if self.sharded_state:
            sharded.check_shared_directory(self.directory, "directory")
        epoch, step_in_epoch, history, metrics_checkpoint = self._restore(
            model, epochs, steps_per_epoch, verbose
        )
        if writer:
            os.makedirs(self.directory, exist_ok=True)
            checkpoints.atomic_write_json(os.path.join(self.directory, HISTORY_FILE), history)

        run = _OneRun(list(callbacks), verbose, epochs, steps_per_epoch)
        saver = _Saver(self, history, steps_per_epoch, metrics_checkpoint)
        # Mid-epoch, torch's random states are set before the first step (see
        # `_Saver.on_train_batch_begin`).
        saver.random_states_checkpoint = metrics_checkpoint
        saver.torch_seed = self._torch_seed()
        # First: a step with a non-finite loss ends the run before the saver
        # or a caller's callback can record it.
        stop = StopOnNonFiniteLoss(getattr(model, "describe_inputs", lambda: None)())
        run.set_model(model)
        run.begin()
        while epoch < epochs:
            dataset = train_dataset_fn(epoch)
            self._check_dataset(dataset, epoch, steps_per_epoch)
            if step_in_epoch:
                if saver.metrics_checkpoint is not None:
                    _build_metrics(model, dataset)
                dataset = dataset.skip(step_in_epoch)
            run.offset = saver.offset = step_in_epoch
            saver.epoch = epoch
            model.fit(
                dataset,
                initial_epoch=epoch,
                epochs=epoch + 1,
                steps_per_epoch=steps_per_epoch - step_in_epoch,
                validation_data=validation_data,
                callbacks=[stop, run, saver],
                verbose=0,
                shuffle=False,  # the order is train_dataset_fn's
            )
            if model.stop_training:  # a callback stopped the run
                break
            epoch, step_in_epoch = epoch + 1, 0
        run.end(history)
        return copy.deepcopy(history)

    def _torch_seed(self):
        """On PyTorch, the seed torch's global generator is set from at each
        epoch's first step (with the epoch): the run's first seed, kept in
        its checkpoints. None on the other backends."""
        if keras.backend.backend() != "torch":
            return None
        if "torch_seed" in self._restored_manifest:
            return self._restored_manifest["torch_seed"]
        import torch

        return int(torch.initial_seed())

    def _restore(self, model, epochs, steps_per_epoch, verbose):
        """Loads the newest checkpoint; returns (epoch, step in epoch,
        history, metrics arrays or None). Everything is checked first."""
        checkpoint = self._latest()
        self._restored_manifest = {} if checkpoint is None else checkpoint.manifest
        if checkpoint is None:
            return 0, 0, {}, None
        manifest = checkpoint.manifest
        _check_progress(checkpoint)
        epoch, step_in_epoch = manifest["epoch"], manifest["step_in_epoch"]
        if manifest["steps_per_epoch"] != steps_per_epoch:
            raise ValueError(
                f"Checkpoint {checkpoint.file} was written with steps_per_epoch="
                f"{manifest['steps_per_epoch']}; resuming needs the same. "
                f"Received: steps_per_epoch={steps_per_epoch}"
            )
        if (epoch, step_in_epoch) > (epochs, 0):
            raise ValueError(
                f"Checkpoint {checkpoint.file} is at epoch {epoch} step "
                f"{step_in_epoch}, past the end of this run. Received: epochs={epochs}"
            )
        _check_model(checkpoint, model, self.fingerprint)
        checkpoints.check_group(
            checkpoint, "optimizer", model.optimizer.variables, "optimizer variable"
        )
        has_generator = checkpoint.specs("global_seed_generator") is not None
        if has_generator:
            stand_in = _Spec("seed_generator_state", (2,), random_seed_dtype())
            checkpoints.check_group(
                checkpoint, "global_seed_generator", [stand_in], "global seed generator state"
            )
        # Everything matches: assign.
        if isinstance(checkpoint, checkpoints.ShardedCheckpoint):
            # State split over processes now: each process reads its slices,
            # laid out as the variables are; the metrics and the global seed
            # state (replicated) whole. (Otherwise `_latest` read it whole.)
            checkpoint.load({"model": model.variables, "optimizer": model.optimizer.variables,
                             **{group: None for group in ("metrics", "global_seed_generator")
                                if checkpoint.specs(group) is not None}})
        checkpoints.assign_group(checkpoint, "model", model.variables)
        checkpoints.assign_group(checkpoint, "optimizer", model.optimizer.variables)
        if has_generator:
            checkpoints.assign_group(
                checkpoint, "global_seed_generator", [_global_seed_generator().state]
            )
        if verbose and epoch == epochs:
            print(f"{checkpoint.file}: all {epochs} epochs are done", flush=True)
        elif verbose:
            print(
                f"resuming from {checkpoint.file} at epoch {epoch + 1}/{epochs} "
                f"step {step_in_epoch}/{steps_per_epoch} (global step {checkpoint.step})",
                flush=True,
            )
        # The running metrics matter only inside an epoch.
        metrics_checkpoint = checkpoint if step_in_epoch else None
        return epoch, step_in_epoch, manifest["history"], metrics_checkpoint

    def _latest(self):
        """The newest intact checkpoint: read by process 0 and sent to the
        others of a multi-process job (whose own `directory`, on another
        host, may hold nothing), so that every process resumes from the
        same state."""
        writer = distribute.process_index() == 0
        checkpoint = self.manager.latest() if writer else None
        header = distribute.broadcast_json(
            None if checkpoint is None else [checkpoint.name, checkpoint.manifest])
        if header is None:
            return None
        name, manifest = header
        if manifest["format"] == checkpoints.FORMAT_SHARDED:
            if self.sharded_state:
                # Not sent: every process reads its own slices
                # (`ShardedCheckpoint.load`) from the one shared directory.
                return checkpoint if writer else checkpoints.ShardedCheckpoint(
                    name, manifest, self.directory)
            # Read on one process or resumed as data parallel: process 0 reads
            # the arrays whole and sends them, as an npz checkpoint's (the
            # others' directory, never checked to be shared, may hold none).
            if writer:
                checkpoint.load({group: None for group in manifest["variables"]})
                checkpoint = checkpoints.Checkpoint(name, manifest, checkpoint.arrays)
        if writer:
            arrays = checkpoint.arrays
        else:
            arrays = {group: [np.zeros(spec["shape"], spec["dtype"]) for spec in specs]
                      for group, specs in manifest["variables"].items()}
        groups = list(arrays)
        flat = distribute.broadcast_arrays([a for group in groups for a in arrays[group]])
        if writer:
            return checkpoint
        for group in groups:
            arrays[group], flat = flat[:len(arrays[group])], flat[len(arrays[group]):]
        return checkpoints.Checkpoint(name, manifest, arrays)

    def _check_dataset(self, dataset, epoch, steps_per_epoch):
        if not hasattr(dataset, "skip"):
            raise ValueError(
                "`train_dataset_fn` must return a tf.data.Dataset (or a PyDataset with "
                "`skip`). "
                f"Received: train_dataset_fn({epoch}) -> {type(dataset).__name__}"
            )
        batches = _cardinality(dataset)
        if batches is not None and batches < steps_per_epoch:
            raise ValueError(
                f"`train_dataset_fn({epoch})` yields {batches} batches, fewer than "
                f"steps_per_epoch={steps_per_epoch}."
            )

    def _write_checkpoint(self, model, epoch, step_in_epoch, steps_per_epoch, history,
                          torch_seed=None):
        """Writes the checkpoint of (epoch, step_in_epoch); `model` must be
        the synced one (`Callback.model` on JAX). Process 0 of a
        multi-process job writes; the others return None, on TensorFlow
        after reading the state with it (a metric's total is summed over the
        workers when read: every worker must read it)."""
        writer = distribute.process_index() == 0
        step = epoch * steps_per_epoch + step_in_epoch
        metadata = {
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "steps_per_epoch": steps_per_epoch,
            "fingerprint": self.fingerprint,
            "history": history,
            "time": time.time(),
        }
        if self.sharded_state:  # every process writes its shards
            state = _state(model)
            for group in ("model", "optimizer"):
                counts = sharded.finite_counts(state[group])
                _check_finite({group: [(v.path, count) for v, count in
                                       zip(state[group], counts)]}, step, counted=True)
            return self.manager.save_sharded(step, state, metadata)
        if not writer and not distribute.reads_take_every_process():
            return None
        groups = {
            group: checkpoints.read_group(variables)
            for group, variables in _state(model).items()
        }
        _check_finite(groups, step)
        if not writer:
            return None
        groups.update(_torch_random_states())
        if torch_seed is not None:
            metadata["torch_seed"] = torch_seed
        return self.manager.save(step, groups, metadata)


def _torch_random_states():
    """On PyTorch, `{group: [(path, array)]}` of torch's global random
    states: Keras's PyTorch dropout draws its masks from them (its fast path
    for layers built without a seed, as the models here are), not from the
    layers' SeedGenerators, so a resumed run needs them to draw the masks of
    the uninterrupted one."""
    if keras.backend.backend() != "torch":
        return {}
    import torch

    groups = {"torch_random_state": [("cpu", torch.get_rng_state().numpy())]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        groups["torch_cuda_random_states"] = [
            (f"cuda:{i}", state.numpy()) for i, state in enumerate(torch.cuda.get_rng_state_all())
        ]
    return groups


def _restore_torch_random_states(checkpoint):
    """Sets torch's global random states from a checkpoint written on
    PyTorch (a checkpoint of another backend has none: nothing to set)."""
    if keras.backend.backend() != "torch":
        return
    import torch

    if checkpoint.specs("torch_random_state") is not None:
        torch.set_rng_state(torch.from_numpy(checkpoint.arrays["torch_random_state"][0].copy()))
    cuda = checkpoint.specs("torch_cuda_random_states")
    if cuda is not None and torch.cuda.is_available():
        states = checkpoint.arrays["torch_cuda_random_states"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([torch.from_numpy(s.copy()) for s in states])


def _check_finite(groups, step, counted=False):
    """Refuses to save non-finite weights or optimizer state: nothing is
    written, so the last good checkpoint stays the newest and is never
    pruned because of a bad one. (The running metrics may be NaN: they are
    logs, not state that training continues from.) `counted`: the groups
    hold `(path, number of non-finite values)` instead of arrays (sharded
    state, counted across processes)."""
    for group in ("model", "optimizer"):
        for path, array in groups.get(group, ()):
            if counted:
                count = int(array)
            elif array.dtype.kind in "fc" and not np.all(np.isfinite(array)):
                count = int(np.sum(~np.isfinite(array)))
            else:
                count = 0
            if count:
                shape = "" if counted else f", shape {array.shape}"
                raise ValueError(
                    f"Not writing checkpoint {step}: {group} variable {path!r} has "
                    f"{count} non-finite value(s). Training diverged or bad data "
                    "reached the weights; the newest checkpoint on disk is the last "
                    "good state. Received: non-finite values in "
                    f"{path}{shape}"
                )


class _Saver(keras.callbacks.Callback):
    """Saves every `checkpoint_every` steps and at the epoch end; restores
    the interrupted epoch's metrics once `fit` has built and reset them."""

    def __init__(self, trainer, history, steps_per_epoch, metrics_checkpoint):
        super().__init__()
        self.trainer = trainer
        self.history = history
        self.steps_per_epoch = steps_per_epoch
        self.metrics_checkpoint = metrics_checkpoint
        self.epoch = 0
        self.offset = 0
        self.step_in_epoch = 0
        self.random_states_checkpoint = None
        self.torch_seed = None

    def _global_step(self):
        return self.epoch * self.steps_per_epoch + self.step_in_epoch

    def _save(self):
        self.trainer._write_checkpoint(
            self.model, self.epoch, self.step_in_epoch, self.steps_per_epoch, self.history,
            self.torch_seed,
        )

    def on_epoch_begin(self, epoch, logs=None):
        self.step_in_epoch = self.offset
        if self.metrics_checkpoint is None:
            return
        checkpoint, self.metrics_checkpoint = self.metrics_checkpoint, None
        variables = self.model.metrics_variables
        try:
            checkpoints.check_group(checkpoint, "metrics", variables, "metric variable")
        except ValueError as error:
            # Only the logs of this one epoch are affected, not the training.
            warnings.warn(
                f"The metrics of epoch {epoch + 1} restart at step {self.offset}: {error}",
                stacklevel=2,
            )
            return
        checkpoints.assign_group(checkpoint, "metrics", variables)

    def on_train_batch_begin(self, batch, logs=None):
        # Keras's PyTorch dropout draws from torch's global generator, and
        # Keras's PyTorch `fit` draws from it too as it starts (its
        # DataLoader's seed; more at a process's first `fit`), a number of
        # draws that differs between a run and its resumption. So the
        # generator is set right before the step: at an epoch's first step
        # from (run seed, epoch), inside an epoch from the checkpoint.
        if self.torch_seed is None:
            return
        import torch

        from keras_attn._epochs import epoch_seed

        if self.offset + batch == 0:
            torch.manual_seed(epoch_seed(self.torch_seed, self.epoch))
        elif self.random_states_checkpoint is not None:
            _restore_torch_random_states(self.random_states_checkpoint)
        self.random_states_checkpoint = None

    def on_train_batch_end(self, batch, logs=None):
        before = self._global_step()
        self.step_in_epoch = self.offset + batch + 1
        # `batch` is the last step of the execution (steps_per_execution).
        every = self.trainer.checkpoint_every
        if (
            self.step_in_epoch < self.steps_per_epoch  # the epoch end saves that one
            and self._global_step() // every > before // every
        ):
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self.step_in_epoch < self.steps_per_epoch:
            if self.model.stop_training:  # stopped inside the epoch by a callback
                self._save()
                return
            raise ValueError(
                f"`train_dataset_fn({epoch})` ran out after {self.step_in_epoch} "
                f"batches, fewer than steps_per_epoch={self.steps_per_epoch}."
            )
        for name, value in (logs or {}).items():
            self.history.setdefault(name, []).append(_to_float(value))
        self.epoch, self.step_in_epoch = epoch + 1, 0
        self._save()
        if distribute.process_index() == 0:
            checkpoints.atomic_write_json(
                os.path.join(self.trainer.directory, HISTORY_FILE), self.history
            )


def _to_float(value):
    if isinstance(value, numbers.Number):
        return float(value)
    return float(keras.ops.convert_to_numpy(value))


class _OneRun(keras.callbacks.Callback):
    """Shows the caller's callbacks the per-epoch `fit` calls as one run."""

    def __init__(self, callbacks, verbose, epochs, steps_per_epoch):
        super().__init__()
        if verbose and not any(
            isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks
        ):
            callbacks.append(keras.callbacks.ProgbarLogger())
        self.callbacks = callbacks
        self.run_params = {"verbose": verbose, "epochs": epochs, "steps": steps_per_epoch}
        self.offset = 0

    def set_model(self, model):
        super().set_model(model)
        for callback in self.callbacks:
            callback.set_model(model)

    def set_params(self, params):
        super().set_params(dict(params, **self.run_params))
        for callback in self.callbacks:
            callback.set_params(self.params)

    def begin(self):
        self.set_params({})
        for callback in self.callbacks:
            callback.on_train_begin()

    def end(self, history):
        logs = {name: values[-1] for name, values in history.items() if values}
        for callback in self.callbacks:
            callback.on_train_end(logs)

    def _forward(self, hook, *args):
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    # on_train_begin / on_train_end: once per run, from `begin` / `end`.
    def on_epoch_begin(self, epoch, logs=None):
        self._forward("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._forward("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._forward("on_train_batch_begin", batch + self.offset, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._forward("on_train_batch_end", batch + self.offset, logs)

    def on_test_begin(self, logs=None):
        self._forward("on_test_begin", logs)

    def on_test_end(self, logs=None):
        self._forward("on_test_end", logs)

    def on_test_batch_begin(self, batch, logs=None):
        self._forward("on_test_batch_begin", batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._forward("on_test_batch_end", batch, logs)
