"""A run of a zoo recipe, from the recipe to its results, for Python users and
for the `keras-attn` command line (which only parses arguments and prints).

```python
from keras_attn import zoo
results = zoo.train("vit_tiny_digits", overrides=["training.epochs=2"], output="runs/vit")
results["value"]                      # the test metric, also in runs/vit/results.json
recipe, metrics, source = zoo.evaluate("runs/vit")
zoo.export("runs/vit")                # the serving SavedModel (on TensorFlow)
```

A run directory holds:

```
recipe.json           the resolved recipe, written once it builds and compiles
checkpoints/          ResumableTrainer checkpoints and history.json
tensorboard/          TensorBoard logs
model.keras           the trained model (written atomically); with `training.lora`
                      the merged model (adapters folded into the kernels)
adapters.npz          with `training.lora`: the adapters and fully trained layers
                      alone (`keras_attn.models.load_lora_weights` onto the base)
saved_model/          the task's serving SavedModel (atomically); its run.json (and
                      an ONNX / LiteRT export's serving.json, key "run") names the
                      run it came from, which `evaluate --exported` checks
vocab.txt             the vocabulary, for the text tasks
learning_curves.png   loss and metrics per epoch, training and validation
results.json          the test metrics, time, hardware, versions
```

Training again in the same directory after a kill resumes from the newest
checkpoint (weights, optimizer, seeds, the position in the epoch); after the
run finished (results.json exists) it trains nothing and returns the results.
A directory that holds a run of another recipe is refused, and one process
at a time trains a directory (`RunLock`). The SavedModel exporters trace
TensorFlow graphs: on JAX or PyTorch the export runs in a TensorFlow
subprocess, from model.keras.
"""

import datetime
import functools
import glob
import json
import math
import os
import platform
import sys
import time

from keras_attn._version import __version__
from keras_attn.errors import RunDirectoryError
from keras_attn._base.quiet_tensorflow import tensorflow_installed
from keras_attn._base.zoo_files import ADAPTERS
from keras_attn._base.zoo_files import CHECKPOINTS
from keras_attn._base.zoo_files import CURVES
from keras_attn._base.zoo_files import EXPORT_RUN
from keras_attn._base.zoo_files import MODEL
from keras_attn._base.zoo_files import RECIPE
from keras_attn._base.zoo_files import RESULTS
from keras_attn._base.zoo_files import SAVED_MODEL
from keras_attn._base.zoo_files import TIMES
from keras_attn._base.zoo_files import locate_recipe
from keras_attn._base.zoo_files import models_directory  # noqa: F401  (zoo.reference reads it here)
from keras_attn._base.zoo_files import read_json


# === Files ===


def write_text(path, text):
    """Writes `path` atomically (temporary file, fsync, rename), making its
    directory first."""
    from keras_attn.training.checkpoints import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, lambda stream: stream.write(text.encode("utf-8")))


def write_json(path, value):
    write_text(path, json.dumps(value, indent=2) + "\n")


def save_model(model, path):
    """`model.save` to a temporary `.keras` name, then renamed into place."""
    staging = os.path.join(os.path.dirname(os.path.abspath(path)), ".partial-" + os.path.basename(path))
    try:
        model.save(staging)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)


# === Environment ===


def describe_hardware(replicas=1):
    """"1 x NVIDIA H100 80GB HBM3", "2 CPU cores (Intel(R) Xeon(R) ...)"."""
    import keras

    backend = keras.backend.backend()
    gpus = []
    if backend == "jax":
        import jax

        gpus = [d.device_kind for d in jax.devices() if d.platform == "gpu"]
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = [tf.config.experimental.get_device_details(d).get("device_name", "GPU")
                for d in tf.config.list_physical_devices("GPU")]
    elif backend == "torch":
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if gpus:
        used = min(len(gpus), replicas) if replicas > 1 else 1
        return f"{used} x {gpus[0]}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            model = next(line.split(":", 1)[1].strip() for line in stream
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cores} CPU cores" + (f" ({model})" if model else "")


# === train ===


def _check_output_path(output):
    """`ValueError` (exit status 2) for an `output` that cannot be a run
    directory: an existing file, or a place where no directory can be made
    or written to. Nothing is created here."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise RunDirectoryError(f"`output` must be a directory; {output} is a file. "
                         f"Received: output={output!r}")
    existing = output
    while not os.path.exists(existing):
        parent = os.path.dirname(os.path.abspath(existing))
        if parent == os.path.abspath(existing):
            break
        existing = parent
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirectoryError(f"`output` is not writable: {existing} does not accept "
                         f"new files. Received: output={output!r}")


def _has_progress(output):
    """Whether a run in `output` got past its start: a checkpoint, the model
    or the results exist (a run whose build failed left none of them)."""
    checkpoints_dir = os.path.join(output, CHECKPOINTS)
    return (os.path.exists(os.path.join(output, MODEL))
            or os.path.exists(os.path.join(output, RESULTS))
            or (os.path.isdir(checkpoints_dir) and bool(os.listdir(checkpoints_dir))))


def _remove_staging(output):
    """Deletes what a process killed while writing left in `output`: a
    SavedModel staging directory (`.export-*`), a model being saved
    (`.partial-*`), an atomic write's temporary file (`.*.tmp`)."""
    import shutil

    for path in glob.glob(os.path.join(output, ".export-*")):
        shutil.rmtree(path, ignore_errors=True)
    for pattern in (".partial-*", ".*.tmp"):
        for path in glob.glob(os.path.join(output, pattern)):
            if os.path.isfile(path):
                os.remove(path)


class RunLock:
    """One `keras-attn train` per run directory: an exclusive `flock` on
    `<output>/.lock` (which holds the owner's process id), released when the
    process ends, however it ends. A second process is refused at once with
    the first one's id. Where `fcntl` is missing (Windows) there is no lock.
    """

    def __init__(self, output):
        self.output = output
        self.path = os.path.join(output, ".lock")
        self.file = None
        self.created = False

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        self.created = not os.path.isdir(self.output)
        os.makedirs(self.output, exist_ok=True)
        self.file = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            owner = self.file.read().strip() or "unknown"
            self.file.close()
            self.file = None
            raise RunDirectoryError(
                f"{self.output} is being trained by another process (pid {owner}); "
                "wait for it to end or use another `output`. "
                f"Received: output={self.output!r}"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc_info):
        if self.file is None:
            return False
        try:
            os.remove(self.path)
        except OSError:
            pass
        self.file.close()  # releases the flock
        self.file = None
        if self.created:
            try:
                os.rmdir(self.output)  # only when nothing else was written
            except OSError:
                pass
        return False


def _check_output(output, recipe):
    """Refuses a directory that holds a run of another recipe (one that made
    progress: a run that failed before its first checkpoint is replaced)."""
    from keras_attn.training.checkpoints import differences
    from keras_attn.zoo.recipe import fingerprint

    path = os.path.join(output, RECIPE)
    if not os.path.exists(path):
        return False
    if not _has_progress(output):
        return False
    found = differences(fingerprint(read_json(path)), fingerprint(recipe))
    if found:
        key, there, here = found[0]
        raise ValueError(
            f"{output} holds a run of another recipe: `{key}` is {there!r} there and "
            f"{here!r} here. Use another `output`, or delete the directory. "
            f"Received: output={output!r}"
        )
    return True


def time_left(epochs_left, times, first, first_steady=None):
    """Seconds left for `epochs_left` epochs at the mean of `times` (epoch ->
    seconds), leaving out epoch `first` (this process's first: it includes
    tracing and compilation) once another epoch has been timed. Until then,
    `first_steady` (the first epoch's seconds at the pace of its steps after
    the first, i.e. without the compilation), where known, stands for it."""
    steady = [seconds for epoch, seconds in times.items() if epoch != first]
    if not steady:
        steady = [first_steady] if first_steady is not None else list(times.values())
    return epochs_left * sum(steady) / len(steady)


def _epoch_logger(epochs, steps, times_path, verbose):
    import keras

    # A ProgbarLogger subclass, so that the trainer adds no Keras progress bar
    # of its own: Keras's bar ends each epoch with a line of the metrics,
    # which the epoch line would repeat.
    class EpochLog(keras.callbacks.ProgbarLogger):
        """One line per epoch (its seconds, the time left, the metrics), the
        epoch's seconds kept in `times_path`; with `verbose=1` on a terminal,
        a progress line while the epoch runs, replaced by the epoch line."""

        def __init__(self):
            super().__init__()
            self.first = None
            self.live = verbose == 1 and sys.stdout.isatty()

        def set_params(self, params):
            keras.callbacks.Callback.set_params(self, params)

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.time()
            self.first = str(epoch) if self.first is None else self.first
            self.epoch = epoch
            self.step_ends = []  # the first and the last step's end

        def on_train_batch_end(self, batch, logs=None):
            self.step_ends[1:] = [time.time()]
            if self.live:
                values = " - ".join(f"{k} {v:.4g}" for k, v in (logs or {}).items())
                sys.stdout.write(f"\r\033[Kepoch {self.epoch + 1}/{epochs}: step "
                                 f"{batch + 1}/{steps} - {values}")
                sys.stdout.flush()

        def on_test_batch_end(self, batch, logs=None):
            pass

        def on_predict_batch_end(self, batch, logs=None):
            pass

        def on_test_end(self, logs=None):
            pass

        def on_predict_end(self, logs=None):
            pass

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.time() - self.start
            times = read_json(times_path) if os.path.exists(times_path) else {}
            times[str(epoch)] = seconds
            write_json(times_path, times)
            values = " - ".join(f"{k} {v:.4g}" for k, v in (logs or {}).items())
            left = ""
            if epoch + 1 < epochs:
                left = time_left(epochs - epoch - 1, times, self.first, self._steady(seconds))
                left = f", about {left / 60:.1f} min left"
            if self.live:
                sys.stdout.write("\r\033[K")
            print(f"epoch {epoch + 1}/{epochs} ({seconds:.1f} s{left}): {values}", flush=True)

        def _steady(self, seconds):
            # The epoch's seconds had its first step (tracing, compilation)
            # taken the mean time of the others; None with a single step.
            if len(self.step_ends) < 2 or steps is None or steps < 2:
                return None
            first_end, last_end = self.step_ends
            per_step = (last_end - first_end) / (steps - 1)
            return per_step * steps + (self.start + seconds - last_end)

    return EpochLog()


def train(recipe, overrides=(), output=None, distribute=False, export=True, verbose=1,
          data=None):
    """Trains a recipe (or resumes its interrupted run), evaluates it on the
    test set and writes the run directory; returns the results.

    Args:
        recipe: a recipe file, or the name of one in the zoo (`list_recipes`).
        overrides: `"dotted.key=value"` strings or `(key, value)` pairs.
        output: the run directory; None for `runs/<recipe name>`.
        distribute: False for one device; True or `"data_parallel"`:
            data parallel over every local accelerator (or the workers of
            TF_CONFIG / the JAX multi-process environment);
            `"model_parallel:MxN"` (JAX): M data replicas x N model shards,
            laid out by `keras_attn.models.layout_map`.
        export: write the serving SavedModel (on JAX and PyTorch through a
            TensorFlow subprocess); `export(run_dir)` can write it later.
        verbose: a line per epoch is printed in every case (its time, the
            time left, the metrics); 1 adds a progress line while an epoch
            runs, on a terminal (replaced by the epoch's line); 0 and 2
            print the epoch lines only.
        data: a directory written by `keras_attn.zoo.prepared.prepare`
            (`keras-attn prepare`) for this recipe: train and evaluate from
            its batches instead of the tf.data pipelines, with no TensorFlow
            needed (without it, no SavedModel is written and no TensorBoard
            logs; `export(run_dir)` writes the SavedModel where TensorFlow
            is). Every file is checked before the first step.

    Returns:
        The dict written to `<output>/results.json`: `name`, `metric`,
        `value`, `metrics`, `train_seconds`, `steps`, `parameters`,
        `backend`, `hardware`, ... and `output`, the run directory.

    Raises:
        ValueError: a bad recipe or override (naming the dotted key), an
            output that is a file, not writable, being trained by another
            process or holding a run of another recipe; prepared `data`
            that is missing, of another recipe, truncated or edited, or
            with values the model does not accept.
    """
    from keras_attn.training.distribute import parse_distribute
    from keras_attn.zoo.recipe import load_recipe

    from keras_attn.training.distribute import initialize_processes

    distribute = parse_distribute(distribute)
    recipe = load_recipe(locate_recipe(recipe), overrides)
    output = output or os.path.join("runs", recipe["name"])
    # Several JAX processes (KERAS_DISTRIBUTION_*, SLURM, ...) train one run:
    # process 0 takes the directory's lock and writes every file; the others
    # compute and write nothing (docs/distributed.md).
    # Model parallel across processes: each writes its shards of every
    # checkpoint (orbax-checkpoint) into `output`, which they must all see.
    process, processes = initialize_processes() if distribute else (0, 1)
    if process == 0:
        _check_output_path(output)
    prepared = None
    if data is not None:
        from keras_attn.zoo.prepared import PreparedData

        if isinstance(distribute, tuple):
            raise ValueError(
                f"Model parallel does not take prepared `data` yet: train data parallel or "
                f"on one device. Received: distribute='model_parallel:{distribute[0]}x"
                f"{distribute[1]}', data={data!r}"
            )
        import keras

        if processes > 1 and keras.backend.backend() != "jax":
            # Prepared data serves machines without TensorFlow; how the
            # multi-worker strategy would share out its batches is untested.
            raise ValueError(
                f"Prepared `data` trains across processes on JAX only: across "
                f"{processes} TensorFlow workers, train from the recipe's own tf.data "
                f"pipeline (leave `data` out). Received: data={data!r} with {processes} "
                f"{keras.backend.backend()} processes")
        # On JAX each process reads and checks only its rows of the batches.
        prepared = PreparedData(data, recipe, (process, processes))
    if process:
        return _train_locked(recipe, output, distribute, export, verbose, prepared)
    with RunLock(output):
        try:
            results = _train_locked(recipe, output, distribute, export, verbose, prepared)
        except BaseException:
            _remove_unstarted_run(output)
            raise
    return dict(results, output=output)


def _remove_unstarted_run(output):
    """After a failed `train`: removes what the run wrote in `output` when
    it never got past its start (no checkpoint, model or results), so
    that a recipe failing in its first steps leaves no run directory holding
    only its `recipe.json` (`RunLock` then removes the directory it made).
    Only the run's own file names are removed; a run with progress is kept
    to resume."""
    import shutil

    if _has_progress(output):
        return
    for name in (RECIPE, TIMES):
        try:
            os.remove(os.path.join(output, name))
        except OSError:
            pass
    for name in (CHECKPOINTS, "tensorboard"):
        shutil.rmtree(os.path.join(output, name), ignore_errors=True)


def _agree_on_start(recipe, output, distribute, prepared=None):
    """Process 0's decision on `output` (the results of a finished run, or
    None to train), after checking that every process of a multi-process
    job runs the same recipe, overrides, seed, data and versions (a
    `ValueError` naming what differs, before any step); with `prepared`
    data, the same prepared files (their manifest's digest: each host may
    read its own copy)."""
    import keras

    from keras_attn.training.distribute import broadcast_json
    from keras_attn.training.distribute import check_processes_agree
    from keras_attn.training.distribute import process_index
    from keras_attn.zoo.recipe import fingerprint

    found = fingerprint(recipe)
    training = dict(found.get("training", {}))
    seed = training.pop("seed", None)
    check_processes_agree({
        "recipe": {k: v for k, v in dict(found, training=training).items() if k != "data"},
        "seed": seed, "data": found.get("data"), "keras_attn version": __version__,
        "Keras version": keras.__version__, "distribute": distribute,
        "prepared data": prepared and prepared.manifest["manifest_sha256"],
    })
    state = None
    if process_index() == 0:
        try:
            done = _check_output(output, recipe) and os.path.exists(os.path.join(output, RESULTS))
            state = {"results": read_json(os.path.join(output, RESULTS)) if done else None}
        except ValueError as error:  # raised on every process
            state = {"error": str(error)}
    state = broadcast_json(state)
    if "error" in state:
        raise ValueError(state["error"])
    return state["results"]


def _other_process(recipe, output, process, sharded=False):
    """What `train` returns on a process other than 0 of a multi-process
    job (`process`: its index and the number of processes; `sharded`: it
    wrote its shards of every checkpoint into `output`, model parallel):
    `process`, `processes`, `name`, `output` (where process 0 writes),
    `message`."""
    message = (f"process {process[0]} of {process[1]}: trained {recipe['name']}; "
               f"process 0 writes the run (model, checkpoints, results) to its {output}")
    if sharded:
        message += " (this process wrote its shards of every checkpoint there)"
    print(message, flush=True)
    return {"name": recipe["name"], "process": process[0], "processes": process[1],
            "output": output, "message": message}


def _sharded_state(model):
    """Whether `model`'s weights are split over several processes' devices
    (model parallel across processes: sharded checkpoints)."""
    from keras_attn.training import sharded

    return sharded.spans_processes(model.variables)


def _train_locked(recipe, output, distribute, export, verbose, prepared=None):
    from keras_attn.zoo.recipe import fingerprint

    from keras_attn.training.distribute import end_processes
    from keras_attn.training.distribute import initialize_processes
    from keras_attn.training.distribute import naming_lost_processes

    process = initialize_processes() if distribute else (0, 1)
    writer = process[0] == 0
    # The start-of-run checks are collectives too: a process lost there is
    # named as during training.
    with naming_lost_processes():
        finished = _agree_on_start(recipe, output, distribute, prepared)
    if finished is not None:
        print(f"{output}: this run is already complete; nothing to train. "
              "`evaluate(output)` / `export(output)` evaluate or export it again.")
        return finished if writer else _other_process(recipe, output, process)
    if writer:
        _remove_staging(output)

    import keras

    from keras_attn.training.distribute import data_parallel
    from keras_attn.training.distribute import describe_replicas
    from keras_attn.models import layout_map
    from keras_attn.training.distribute import model_parallel
    from keras_attn.training.resumable import ResumableTrainer
    from keras_attn.data.checks import data_check_errors
    from keras_attn.zoo.tasks import make_task

    task = make_task(recipe)
    if prepared is not None:
        task.use_prepared(prepared.state)
    training = recipe["training"]
    if isinstance(distribute, tuple):
        # The layout follows the model's sizes, which the data can set (the
        # vocabulary, the classes): the data is loaded first.
        task.prepare()
        distribution = model_parallel(
            distribute, functools.partial(layout_map, task.model_config))
    else:
        # Each process is fed its rows of every batch (`process_rows`).
        distribution = data_parallel(distribute == "data_parallel", auto_shard_dataset=False)
    with distribution as replicas:
        # The batch is global: it must split evenly over the replicas.
        layout = describe_replicas(replicas, training["batch_size"])
        if isinstance(distribute, tuple):
            layout += f", each model split over {distribute[1]} devices"
        task.prepare()
        model = task.build_model()
        task.compile(model)
        # Written once the recipe has built and compiled: a recipe that fails
        # there leaves no recipe.json to refuse its corrected command.
        if writer:
            write_json(os.path.join(output, RECIPE), recipe)
        parameters = model.count_params()
        steps = task.steps_per_epoch
        _announce(recipe, model, parameters, steps, layout, output if writer else None)
        note = task.model_note()
        if note and writer:
            print(note, flush=True)
        trainer = ResumableTrainer(
            os.path.join(output, CHECKPOINTS),
            checkpoint_every=training["checkpoint_every"],
            fingerprint=fingerprint(recipe),
        )
        times_path = os.path.join(output, TIMES)
        callbacks = [_epoch_logger(training["epochs"], steps, times_path, verbose)]
        if not writer:  # process 0 logs the epochs and writes their times
            callbacks, verbose = [], 0
        elif tensorflow_installed():  # Keras writes TensorBoard logs with tf.summary
            callbacks.insert(0, keras.callbacks.TensorBoard(os.path.join(output, "tensorboard")))
        # TensorFlow's MultiWorkerMirroredStrategy gives each worker its share
        # of every batch itself: each worker reads the whole batch.
        rows = process if distribute == "data_parallel" and keras.backend.backend() == "jax" \
            else (0, 1)
        if isinstance(distribute, tuple) and process[1] > 1:
            from keras_attn.training.sharded import batch_rows

            # Each process fed its rows here, as for data parallel: Keras's
            # own sharding needs batches of one known size.
            keras.distribution.distribution().auto_shard_dataset = False
            rows = batch_rows(distribute, *process)
        train_dataset_fn, validation = _training_data(task, model, prepared, replicas, rows)
        if validation is None and writer:
            print(task.no_validation_note(), flush=True)
        with data_check_errors(), naming_lost_processes():  # DataCheckError; a lost process
            history = trainer.fit(model, train_dataset_fn, training["epochs"], steps,
                                  validation_data=validation, callbacks=callbacks,
                                  verbose=verbose)
        # Saving is collective too (TensorFlow's model.save, the gathered
        # shards of model parallel, the barrier): a process lost there is
        # named as during training.
        with naming_lost_processes():
            sharded = _sharded_state(model)
            model_path = _save_trained(task, model, output, writer)
            # The others leave the job here, without waiting for the test set.
            end_processes()
    if not writer:
        return _other_process(recipe, output, process, sharded)
    del model
    summary = {"parameters": parameters, "steps": training["epochs"] * steps,
               "hardware": describe_hardware(replicas)}
    return _finish_run(recipe, task, output, model_path, prepared, export, history, summary)


def _announce(recipe, model, parameters, steps, layout, output):
    """Prints the run's size and layout (and the LoRA share that trains);
    `output` None on the processes that do not write."""
    training = recipe["training"]
    if training.get("lora"):
        trainable = sum(int(math.prod(v.shape)) for v in model.trainable_weights)
        print(f"LoRA on {training['lora']['base']}: {trainable:,} of {parameters:,} "
              "parameters train", flush=True)
    print(f"{recipe['name']}: {parameters:,} parameters, {training['epochs']} epochs of "
          f"{steps} steps, {layout}; "
          + (f"writing to {output}" if output else "process 0 writes the run"), flush=True)


def _training_data(task, model, prepared, replicas, process):
    """`(train_dataset_fn, validation)` for the trainer: the task's pipeline
    with every batch checked (`check_batches`), or the prepared batches
    checked now, before the first step; evened for the replicas (the
    filler rows weightless: `task.weightless_rows`) and cut to
    this process's rows (`process` = (index, count); (0, 1) for one process
    or model parallel, where every process reads the whole batch)."""
    from keras_attn.data.checks import check_batches
    from keras_attn.zoo.tasks.base import even_batches

    if prepared is not None:
        # Every prepared batch this process reads checked now, before the
        # first step: evened for the replicas, cut to this process's rows
        # (`prepared.process`), and read so.
        prepared.check(model, task, replicas)
        finish, weightless = task.finish_prepared, task.weightless_rows
        train_dataset_fn = lambda epoch: prepared.batches(  # noqa: E731
            "train", epoch, finish, replicas, weightless).for_backend()
        validation = prepared.batches("validation", finish=finish, replicas=replicas,
                                      weightless=weightless)
        return train_dataset_fn, validation and validation.for_backend()
    # Every batch checked in the pipeline (ids, labels, lengths), before a
    # compiled step could see it.
    train_dataset_fn = lambda epoch: check_batches(task.train_dataset_fn(epoch), model)  # noqa: E731
    validation = task.validation_data()
    validation = validation and check_batches(validation, model)
    if replicas > 1:  # JAX shards a batch only when the replicas divide it
        # Filler rows then count for nothing (`task.weightless_rows`).
        checked_fn = train_dataset_fn
        train_dataset_fn = lambda epoch: even_batches(  # noqa: E731
            checked_fn(epoch), replicas, task)
        validation = validation and even_batches(validation, replicas, task)
    if process[1] > 1:
        from keras_attn.training.distribute import process_rows

        evened_fn = train_dataset_fn
        train_dataset_fn = lambda epoch: process_rows(evened_fn(epoch), *process)  # noqa: E731
        # A task that makes its rows one by one makes only this process's.
        own_rows = task.process_train_dataset_fn(replicas, *process)
        if own_rows is not None:
            train_dataset_fn = lambda epoch: check_batches(own_rows(epoch), model)  # noqa: E731
        validation = validation and process_rows(validation, *process)
    return train_dataset_fn, validation


def _save_trained(task, model, output, writer):
    """Saves the trained model (LoRA: the adapters, then the merged model;
    `task.served_model` of it) as the run's model.keras, from process 0.
    Returns its path."""
    from keras_attn.training import sharded

    model_path = os.path.join(output, MODEL)
    if sharded.spans_processes(model.variables):
        # Model parallel across processes: the weights gathered whole, saved
        # by process 0 from a copy on its own device (loads on one process).
        copy = sharded.one_process_copy(model, lambda: task.compile(task.build_model()))
        if copy is None:
            return model_path
        with sharded.no_distribution():  # nothing made for the job's devices now
            return _save_trained(task, copy, output, writer)
    if task.training.get("lora"):
        from keras_attn.models import merge_lora
        from keras_attn.models import save_lora_weights

        if writer:
            save_lora_weights(model, os.path.join(output, ADAPTERS))
        model = merge_lora(model)
    model = task.served_model(model)
    if writer:
        save_model(model, model_path)
    else:  # Keras's save runs collectives in a job: every process saves
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            model.save(os.path.join(scratch, MODEL))
    return model_path


def _finish_run(recipe, task, output, model_path, prepared, export, history, summary):
    """Process 0, after training: the test metrics, the assets, the export,
    the learning curves and results.json. Returns the results.

    The test set is evaluated and exported from model.keras on one device,
    as `keras-attn evaluate` / `export` do (a test batch need not split
    evenly over replicas)."""
    import keras

    from keras_attn.viz import plot_learning_curves

    print("evaluating on the test set", flush=True)
    model = task.load_model(model_path)
    if prepared is None:
        metrics = task.evaluate(model)
    else:
        metrics = task.evaluate_prepared(model, prepared)
    for name, text in task.assets().items():
        write_text(os.path.join(output, name), text)
    if export and not tensorflow_installed():
        print("TensorFlow is not installed here: no SavedModel written; `export("
              f"{output!r})` writes it where TensorFlow is", flush=True)
    elif export:
        if keras.backend.backend() == "tensorflow":
            _export_task(task, model, output, os.path.join(output, SAVED_MODEL),
                         source=model_path)
        else:
            export_on_tensorflow(output, os.path.join(output, SAVED_MODEL))
    plot_learning_curves(history, os.path.join(output, CURVES), title=recipe["name"])
    times_path = os.path.join(output, TIMES)
    times = read_json(times_path) if os.path.exists(times_path) else {}
    metric = recipe["evaluation"]["metric"]
    results = {
        "name": recipe["name"],
        "metric": metric,
        "value": metrics[metric],
        "metrics": metrics,
        "train_seconds": round(sum(times.values()), 1),
        "epochs": recipe["training"]["epochs"],
        "steps": summary["steps"],
        "parameters": summary["parameters"],
        "backend": keras.backend.backend(),
        "hardware": summary["hardware"],
        "date": datetime.date.today().isoformat(),
        "keras_attn_version": __version__,
        "data": "tf.data" if prepared is None else f"prepared: {os.path.abspath(prepared.directory)}",
    }
    write_json(os.path.join(output, RESULTS), results)
    return results


# === evaluate / export ===


def load_run(run_dir):
    """`(recipe, task, model, source)` of a run directory: model.keras, or
    the newest checkpoint when the run has not finished."""
    from keras_attn.zoo.recipe import validate_recipe
    from keras_attn.zoo.tasks import make_task

    path = os.path.join(run_dir, RECIPE)
    if not os.path.exists(path):
        raise ValueError(f"{run_dir} is not a run directory: it has no {RECIPE}. "
                         f"Received: run_dir={run_dir!r}")
    recipe = validate_recipe(read_json(path))
    task = make_task(recipe)
    model_path = os.path.join(run_dir, MODEL)
    if os.path.exists(model_path):
        return recipe, task, task.load_model(model_path), model_path
    from keras_attn.training.resumable import restore_latest

    model = task.compile(task.build_model())
    step = restore_latest(model, os.path.join(run_dir, CHECKPOINTS))
    if step is None:
        raise ValueError(f"{run_dir} has neither {MODEL} nor a checkpoint to evaluate. "
                         f"Received: run_dir={run_dir!r}")
    served = task.served_model(model)
    if served is not model:
        model = task.compile(served)
    return recipe, task, model, f"checkpoint at step {step} (the run has not finished)"


def evaluate(run_dir, exported=None):
    """`(recipe, metrics, source)`: a run's test metrics, from model.keras or
    (for a run that has not finished) its newest checkpoint, named by
    `source`.

    With `exported`, a directory `export` wrote from this run (a SavedModel,
    or ONNX / LiteRT with serving.json), the metrics of that model in its
    own runtime (onnxruntime, LiteRT, TensorFlow) on the same test set
    (`Task.evaluate_served`); `source` is then that directory. An export
    that names another run (or none: `check_export_origin`), a damaged one
    (a file whose sha256 is not serving.json's) or one that does not load
    is refused with a `ValueError` naming the file.
    """
    if exported is None:
        recipe, task, model, source = load_run(run_dir)
        return recipe, task.evaluate(model), source
    from keras_attn.export.portable import CONTRACT
    from keras_attn.export.portable import Artifact
    from keras_attn.zoo.tasks import make_task

    portable = os.path.isfile(os.path.join(exported, CONTRACT))
    if not portable and not os.path.isfile(os.path.join(exported, "saved_model.pb")):
        raise ValueError(f"{exported} holds neither {CONTRACT} (ONNX, LiteRT) nor a SavedModel. "
                         f"Received: exported={exported!r}")
    if portable and _is_streaming_export(exported):
        raise ValueError(
            f"{exported} is an export of the streaming step (its {CONTRACT} records "
            f"\"streaming\"): it reads audio chunk by chunk with its state, not the test set "
            f"in one call. Score the run with `evaluate` without an export, and hear it "
            f"stream with `transcribe RUN_DIR AUDIO.wav --streaming`. Received: "
            f"exported={exported!r}")
    check_export_origin(run_dir, exported)
    recipe = read_json(os.path.join(run_dir, RECIPE))
    task = make_task(recipe)
    if portable:
        artifact = Artifact(exported)

        def serve(inputs):
            return artifact(**inputs)
    else:
        import tensorflow as tf

        try:  # the ops of a BPE / SentencePiece tokenizer inside the graph (keras-hub's)
            import tensorflow_text  # noqa: F401
        except ImportError:
            pass
        try:
            loaded = tf.saved_model.load(exported)
        except Exception as error:  # TensorFlow's own types (a damaged protobuf, ...)
            raise ValueError(f"{exported} does not load as a SavedModel ({type(error).__name__}"
                             f": {error}). Received: exported={exported!r}") from None

        def serve(inputs):
            return task.served_outputs(loaded, inputs)
    return recipe, task.evaluate_served(serve), exported


def _is_streaming_export(exported):
    """Whether the portable export `exported` is a streaming step (its
    serving.json has "streaming"; a file that does not read is reported by
    the checks after)."""
    from keras_attn.export.portable import CONTRACT

    try:
        contract = read_json(os.path.join(exported, CONTRACT))
    except (ValueError, OSError, RecursionError):
        return False
    return isinstance(contract, dict) and "streaming" in contract


def _export_hf(run_dir, path):
    from keras_attn.convert import save_hf_bert
    from keras_attn.convert import save_hf_vit

    recipe = read_json(os.path.join(run_dir, RECIPE)) if os.path.isdir(run_dir) else {}
    family = recipe.get("family")
    if family is not None and family not in ("bert", "vit"):
        raise ValueError(
            "Hugging Face directories are written for BERT and ViT runs; this run's family "
            f"is {family!r}. Received: run_dir={run_dir!r}, format='hf'"
        )
    # Before the run is read: an existing `path` must be empty or a Hugging
    # Face directory written by keras_attn (replaced); any other is refused
    # and kept (checked again by the writer before it replaces).
    from keras_attn.convert import hf_directory_kind
    from keras_attn._directories import check_replaceable

    check_replaceable(path, hf_directory_kind(), "output")
    _, task, model, source = load_run(run_dir)
    # A classifier's class names (the data's, as in labels.txt) as id2label;
    # None for a run without (a masked LM, or images prepared before the
    # names were kept): the model's own, else LABEL_i.
    class_names = getattr(task, "class_names", None)
    if family == "bert":
        save_hf_bert(model, path, tokenizer=getattr(task, "tokenizer", None), overwrite=True,
                     class_names=class_names)
    else:
        save_hf_vit(model, path, overwrite=True, class_names=class_names)
    return path, source


# The child of `export_on_tensorflow`: TensorFlow imported quietly before Keras
# (which imports it on its TensorFlow backend), then `export` on that backend.
_EXPORT_CHILD = """import sys
from keras_attn._base.quiet_tensorflow import import_tensorflow_quietly
import_tensorflow_quietly()
from keras_attn.zoo.runs import _export_in_child
sys.exit(_export_in_child(*sys.argv[1:]))
"""


def export_on_tensorflow(run_dir, path, format="saved_model", precision="float32",
                         streaming=False):
    """`export` in a subprocess on the TensorFlow backend: the SavedModel
    exporters trace TensorFlow graphs, and model.keras loads on any backend
    (train on JAX, export on TensorFlow)."""
    import subprocess

    print(f"exporting {os.path.join(run_dir, MODEL)} on the TensorFlow backend", flush=True)
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, "-c", _EXPORT_CHILD, run_dir, path, format, precision,
                             "streaming" if streaming else ""], env=environment)
    if result.returncode:
        raise RuntimeError(f"export({run_dir!r}, {path!r}, format={format!r}, "
                           f"precision={precision!r}) on the TensorFlow backend failed with "
                           f"status {result.returncode} (its error is printed above)")


def _export_in_child(run_dir, path, format, precision, streaming=""):
    """`export_on_tensorflow`'s child: a refusal (bad input, a full disk) is
    printed without a traceback and ends it with status 2."""
    try:
        export(run_dir, path, format, precision, streaming=streaming == "streaming")
    except (ValueError, OSError) as error:
        print(f"export on the TensorFlow backend: error: {error}", file=sys.stderr)
        return 2
    return 0


EXPORT_FORMATS = ("saved_model", "onnx", "litert", "hf")


def export(run_dir, output=None, format="saved_model", precision="float32", streaming=False):
    """Writes a run's model (model.keras, or the newest checkpoint) for
    serving or sharing; returns `(path, source)`.

    `format="saved_model"`: the task's serving SavedModel, to `output`
    (default `<run_dir>/saved_model`), on the TensorFlow backend (a
    subprocess when this one is another). `"onnx"`, `"litert"`: the same
    serving model as `model.onnx` / `model.tflite` with `serving.json`
    (`keras_attn.export.portable`), to `<run_dir>/onnx` or `<run_dir>/litert`.
    `precision`: `"float16"` weights (ONNX, LiteRT) or dynamic-range
    `"int8"` (LiteRT; ONNX for the classifiers) (default `"float32"`).
    `format="hf"`: a Hugging Face directory of a BERT or ViT run
    (`keras_attn.convert.save_hf_bert` with the run's tokenizer,
    `save_hf_vit`; a classifier's `id2label` the names of its classes, as
    in labels.txt), to `output` (default `<run_dir>/hf`), on any backend.
    `streaming=True` (a streaming Conformer run; `"onnx"` or `"litert"`):
    the streaming step with its state tensors, chunk by chunk
    (`keras_attn.export.streaming`), to `<run_dir>/<format>_streaming`.
    """
    import keras

    if format not in EXPORT_FORMATS:
        raise ValueError(f"`format` must be one of {EXPORT_FORMATS}. Received: format={format!r}")
    if format == "hf":
        if precision != "float32":
            raise ValueError("Hugging Face directories are written in float32. "
                             f"Received: precision={precision!r}, format='hf'")
        return _export_hf(run_dir, output or os.path.join(run_dir, "hf"))
    from keras_attn.export.portable import check_format

    check_format(format, precision)
    if streaming:
        return _export_streaming(run_dir, output, format, precision)
    path = output or os.path.join(run_dir, SAVED_MODEL if format == "saved_model" else format)
    if os.path.isfile(os.path.join(run_dir, RECIPE)):  # refused before loading anything
        from keras_attn.zoo.tasks import make_task

        make_task(read_json(os.path.join(run_dir, RECIPE))).check_export_format(
            format, precision)
    if keras.backend.backend() != "tensorflow":
        export_on_tensorflow(run_dir, path, format, precision)
        return path, os.path.join(run_dir, MODEL)
    _, task, model, source = load_run(run_dir)
    _export_task(task, model, run_dir, path, format=format, precision=precision, source=source)
    return path, source


def _export_streaming(run_dir, output, format, precision):
    import keras

    from keras_attn.export.portable import PORTABLE_FORMATS

    family = read_json(os.path.join(run_dir, RECIPE)).get("family") \
        if os.path.isfile(os.path.join(run_dir, RECIPE)) else None
    if format not in PORTABLE_FORMATS or family != "conformer":
        raise ValueError(
            f"The streaming step is exported from a Conformer run as {PORTABLE_FORMATS}. "
            f"Received: format={format!r}, a run of family {family!r}, streaming=True")
    path = output or os.path.join(run_dir, f"{format}_streaming")
    if keras.backend.backend() != "tensorflow":
        export_on_tensorflow(run_dir, path, format, precision, streaming=True)
        return path, os.path.join(run_dir, MODEL)
    from keras_attn.export.streaming import export_streaming

    _, task, model, source = load_run(run_dir)
    export_streaming(model, path, format, precision,
                     vocabulary=getattr(task, "vocabulary", None))
    stamp_export(run_dir, path, source)
    return path, source


def _export_task(task, model, run_dir, path, format="saved_model", precision="float32",
                 source=None):
    """`task.export`, then the run it came from written into the export
    (serving.json's "run", or run.json beside a SavedModel)."""
    task.export(model, path, format=format, precision=precision)
    stamp_export(run_dir, path, source)


def stamp_export(run_dir, path, source=None):
    """Writes into the export directory `path` the run it came from
    (`run_identity`): serving.json's "run" for ONNX and LiteRT, run.json
    beside a SavedModel."""
    from keras_attn.export.portable import CONTRACT
    from keras_attn.export.portable import read_contract

    origin = run_identity(run_dir, source)
    if os.path.isfile(os.path.join(path, CONTRACT)):
        contract = read_contract(path)
        contract["run"] = origin
        write_json(os.path.join(path, CONTRACT), contract)
    else:
        write_json(os.path.join(path, EXPORT_RUN), origin)


def _sha256_json(value):
    import hashlib

    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_identity(run_dir, source=None):
    """What names a run in its exports: the recipe's name, the sha256 of
    its recipe.json (as JSON: key order and spacing aside), the directory,
    and with `source` model.keras, that file's sha256 (two runs of one
    recipe differ there)."""
    from keras_attn.export.portable import sha256_file

    recipe = read_json(os.path.join(run_dir, RECIPE))
    identity = {"recipe": recipe.get("name") if isinstance(recipe, dict) else None,
                "recipe_sha256": _sha256_json(recipe),
                "directory": os.path.abspath(run_dir)}
    model_path = os.path.join(run_dir, MODEL)
    if source is not None and os.path.abspath(source) == os.path.abspath(model_path):
        identity["model_sha256"] = sha256_file(model_path)
    return identity


def _describe_run(origin):
    return (f"{origin.get('directory')} (recipe {origin.get('recipe')!r}, recipe.json sha256 "
            f"{str(origin.get('recipe_sha256'))[:12]}...)")


def check_export_origin(run_dir, exported):
    """`ValueError` unless the export directory `exported` names the run
    `run_dir` as the one it came from (`_export_task` wrote it): metrics of
    one run's export under another run's recipe and test set mean nothing."""
    from keras_attn.export.portable import CONTRACT
    from keras_attn.export.portable import read_contract
    from keras_attn.export.portable import sha256_file

    if os.path.isfile(os.path.join(exported, CONTRACT)):
        where = os.path.join(exported, CONTRACT)
        origin = read_contract(exported).get("run")
    else:
        where = os.path.join(exported, EXPORT_RUN)
        origin = None
        if os.path.isfile(where):
            try:
                origin = read_json(where)
            except (ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"{where} is not valid JSON ({error}). "
                                 f"Received: exported={exported!r}") from None
    if not isinstance(origin, dict) or not isinstance(origin.get("recipe_sha256"), str):
        raise ValueError(
            f"{where} does not name the run {exported} was exported from (exported by "
            f"another program or an older keras_attn): `export({run_dir!r})` writes "
            f"an export of this run that does. Received: exported={exported!r}")
    if not os.path.isfile(os.path.join(run_dir, RECIPE)):
        raise ValueError(f"{run_dir} is not a run directory: it has no {RECIPE}. "
                         f"Received: run_dir={run_dir!r}")
    mine = run_identity(run_dir)
    if (origin.get("recipe"), origin["recipe_sha256"]) != (mine["recipe"], mine["recipe_sha256"]):
        raise ValueError(
            f"{exported} is an export of the run {_describe_run(origin)}, not of "
            f"{_describe_run(mine)}: evaluate it with the run it came from. "
            f"Received: run_dir={run_dir!r}, exported={exported!r}")
    model_path = os.path.join(run_dir, MODEL)
    if origin.get("model_sha256") and os.path.isfile(model_path):
        digest = sha256_file(model_path)
        if digest != origin["model_sha256"]:
            raise ValueError(
                f"{exported} is an export of the model.keras of {_describe_run(origin)} "
                f"(sha256 {origin['model_sha256'][:12]}...), not of {model_path} (sha256 "
                f"{digest[:12]}...): the same recipe, another run or a model trained "
                "again; export this one. "
                f"Received: run_dir={run_dir!r}, exported={exported!r}")
