"""Data-parallel training on the TensorFlow and JAX backends (`--distribute`).

```python
from keras_attn.training.distribute import data_parallel, describe_replicas
with data_parallel(enabled=True) as replicas:
    print(describe_replicas(replicas, batch_size=64))
    model = build(...)          # built and compiled inside the block
    model.compile(...)
    model.fit(dataset)          # dataset batches are *global* batches
    model.save("model.keras")
```

| backend | one host | several hosts |
|---|---|---|
| tensorflow | `tf.distribute.MirroredStrategy` over the local GPUs, else over the logical CPU devices when there are several | `tf.distribute.MultiWorkerMirroredStrategy` when `TF_CONFIG` is set |
| jax | `keras.distribution.DataParallel` over `keras.distribution.list_devices()` | the same, after `keras.distribution.initialize()` when `KERAS_DISTRIBUTION_*` is set |

The batch size is global on both engines, checked by
`tests/training/test_distribute.py` (an epoch of 4 batches of 8 takes 4 steps on
2 replicas, with the per-step losses of one device):

- TensorFlow: Keras hands the dataset to `experimental_distribute_dataset`,
  which splits each batch of B into R per-replica batches of B / R; each
  replica's loss is scaled by 1 / R (Keras does it in the loss reduction) and
  the gradients are summed across replicas, so one step applies the gradient
  of the mean loss over the B examples.
- JAX: each batch of B is one array sharded on its first axis over the R
  devices (a multi-process job first gives each process its B / processes
  rows); the step is compiled for the global array, so the loss and its
  gradient are computed over all B examples exactly as on one device.

Where a loss is normalised by something other than the batch size the two
engines differ: under `tf.distribute` a mean over a count that varies per
example (the masked-LM loss over real predictions of `BertPretrainer`,
`LabelSmoothedCrossEntropy` over real tokens) is taken per replica and the
replicas' means are averaged (the original BERT did the same per TPU core),
and BatchNorm (the Conformer's convolution module) normalises with each
replica's own statistics; JAX computes both over the global batch. With the
batch sizes used for training the difference is small, but per-step losses
then match one device only on JAX.

TensorFlow is imported only in the TensorFlow branch, JAX only in the JAX one.
"""

import contextlib
import functools
import os
import re
import warnings

import keras

from keras_attn import _keras_compat
from keras_attn._base.quiet_tensorflow import traced_as_written

# Read by `keras.distribution.initialize()` (keras/src/distribution/distribution_lib.py).
JAX_PROCESS_ENV = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)

# Seconds after which JAX's distributed runtime declares a process that sent
# no heartbeat lost and ends the others (`jax.distributed.initialize`'s
# `heartbeat_timeout_seconds`, 100 by default, which
# `keras.distribution.initialize` keeps): read by `_jax_initialize` when set.
HEARTBEAT_TIMEOUT_ENV = "KERAS_ATTN_HEARTBEAT_TIMEOUT"

# A TensorFlow process can hold one MultiWorkerMirroredStrategy only (its
# collectives are configured when it is created): later `data_parallel`
# blocks reuse the strategy made for the same devices.
_TF_STRATEGIES = {}


def _check_devices(devices):
    if devices is None:
        return None
    if (
        isinstance(devices, str)
        or not isinstance(devices, (list, tuple))
        or not devices
        or not all(isinstance(device, str) and device for device in devices)
    ):
        raise ValueError(
            "`devices` must be a non-empty list of device names "
            "(`['/gpu:0', '/gpu:1']` on TensorFlow, `['gpu:0', 'gpu:1']` on JAX). "
            f"Received: devices={devices!r}"
        )
    return tuple(devices)


def _warn_single_device(found):
    warnings.warn(
        "Data parallel training was asked for but only one device was found "
        f"({found}); training on it alone: 1 replica, the same global batch."
    )


def _tf_process_of(strategy):
    """`(index, count)` of this worker in `strategy`'s job, as TensorFlow
    numbers the workers: it gives the replicas of worker k the ids k * L to
    k * L + L - 1 (L local devices), worker 0 being the chief (TF_CONFIG's
    `chief` task, else its `worker` 0: `strategy.extended.should_checkpoint`
    there). `(0, 1)` for a strategy of one host."""
    local = len(strategy.extended.worker_devices)
    ids = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(
            lambda context: context.replica_id_in_sync_group))
    return ids[0] // local, strategy.num_replicas_in_sync // local


def _tf_process():
    """`(index, count)` of this process in the TensorFlow multi-worker job it
    joined (the MultiWorkerMirroredStrategy `data_parallel` or
    `initialize_processes` made from TF_CONFIG); `(0, 1)` when it joined
    none."""
    strategy = _TF_STRATEGIES.get("multi_worker")
    return (0, 1) if strategy is None else _tf_process_of(strategy)


def _tf_strategy(devices):
    """The strategy for `devices` (None: detect them), or None for one device."""
    import tensorflow as tf

    if "TF_CONFIG" in os.environ:
        if devices is not None:
            raise ValueError(
                "`devices` cannot be chosen when TF_CONFIG is set: "
                "MultiWorkerMirroredStrategy uses every local GPU (else the CPU) "
                f"of each worker. Received: devices={list(devices)!r}"
            )
        if "multi_worker" not in _TF_STRATEGIES:
            _TF_STRATEGIES["multi_worker"] = tf.distribute.MultiWorkerMirroredStrategy()
        return _TF_STRATEGIES["multi_worker"]
    if devices is None:
        # MirroredStrategy() alone takes the GPUs only; logical CPU devices
        # (tf.config.set_logical_device_configuration) must be named.
        found = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices(
            "CPU"
        )
        if len(found) < 2:
            _warn_single_device(", ".join(device.name for device in found))
            return None
        devices = tuple(device.name for device in found)
    if devices not in _TF_STRATEGIES:
        _TF_STRATEGIES[devices] = tf.distribute.MirroredStrategy(devices=list(devices))
    return _TF_STRATEGIES[devices]


@contextlib.contextmanager
def _tf_data_parallel(devices):
    strategy = _tf_strategy(devices)
    if strategy is None:
        yield 1
        return
    several = _tf_process_of(strategy)[1] > 1
    patch = _keras_compat.tensorflow_multi_worker_fit if several else contextlib.nullcontext
    with strategy.scope(), patch():
        yield strategy.num_replicas_in_sync


@contextlib.contextmanager
def _jax_heartbeat_timeout():
    """Within the block, `jax.distributed.initialize` takes
    `heartbeat_timeout_seconds` from `KERAS_ATTN_HEARTBEAT_TIMEOUT` (a
    positive integer) when it is set: `keras.distribution.initialize` passes
    JAX the job's addresses and ids only. Unset: JAX's default (100 s)."""
    import jax

    from keras_attn.training.cluster import env_integer

    if HEARTBEAT_TIMEOUT_ENV not in os.environ:
        yield
        return
    seconds = env_integer(os.environ, HEARTBEAT_TIMEOUT_ENV, 1)
    initialize = jax.distributed.initialize
    jax.distributed.initialize = functools.partial(initialize,
                                                   heartbeat_timeout_seconds=seconds)
    try:
        yield
    finally:
        jax.distributed.initialize = initialize


def _jax_initialize():
    """`keras.distribution.initialize(...)`, once, when `KERAS_DISTRIBUTION_*`
    or a scheduler's variables describe several processes
    (`keras_attn.training.cluster`; a second `jax.distributed.initialize`
    is an error), with the heartbeat timeout of `KERAS_ATTN_HEARTBEAT_TIMEOUT`
    when it is set."""
    import jax

    from keras_attn.training.cluster import process_environment

    found = process_environment()
    if found is not None and not jax.distributed.is_initialized():
        with _jax_heartbeat_timeout():
            keras.distribution.initialize(found.coordinator, found.num_processes,
                                          found.process_id)


def initialize_processes():
    """Joins the other processes of a multi-process job: on JAX (see
    `_jax_initialize`), and on TensorFlow when TF_CONFIG is set (the
    MultiWorkerMirroredStrategy `data_parallel` uses, made now); returns
    `(process_index, process_count)`, `(0, 1)` for one process (a TF_CONFIG
    of one worker and no chief included) or on torch."""
    backend = keras.backend.backend()
    if backend == "tensorflow" and "TF_CONFIG" in os.environ:
        _tf_strategy(None)
    elif backend == "jax":
        _jax_initialize()
    return _process()


def _process():
    """`(index, count)` of this process in the job it joined, `(0, 1)`
    when it joined none (`initialize_processes` joins without asking)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return _tf_process()
    if backend != "jax":
        return 0, 1
    import jax

    if not jax.distributed.is_initialized():
        return 0, 1
    return jax.process_index(), jax.process_count()


def process_index():
    """This process's index in a joined JAX job or TensorFlow multi-worker
    job (0 otherwise): process 0 (on TensorFlow the chief) writes a run's
    files, the others only compute."""
    return _process()[0]


def _joined():
    return _process()[1] > 1


def _tf_sum(array):
    """The sum over the workers of a joined TensorFlow job of each worker's
    int32 NumPy `array` (one collective all-reduce: every worker must call
    it, in the same order). Each worker's first replica holds its `array`,
    its other replicas zeros."""
    import numpy as np
    import tensorflow as tf

    strategy = _TF_STRATEGIES["multi_worker"]
    local = len(strategy.extended.worker_devices)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(array if context.replica_id_in_sync_group % local == 0
                                    else np.zeros_like(array)))
    return strategy.reduce("SUM", values, axis=None).numpy()


def _all_gather(array):
    """Every process's int32 `array`, stacked in process order, on every
    process of a joined job."""
    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(array)
    import numpy as np

    index, count = _tf_process()
    rows = np.zeros((count,) + array.shape, array.dtype)
    rows[index] = array
    return _tf_sum(rows)


def _from_process_0(array):
    """Process 0's int32 `array` (or, on JAX, list of arrays) on every
    process of a joined job; the others pass the same shapes."""
    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils

        return multihost_utils.broadcast_one_to_all(array)
    import numpy as np

    return _tf_sum(array if process_index() == 0 else np.zeros_like(array))


def reads_take_every_process():
    """True where reading a model's state is a collective that every process
    of the job must take part in: under a TensorFlow MultiWorkerMirroredStrategy
    of several workers, where a compiled metric's total (a SyncOnReadVariable)
    is summed over the workers when read. Then every worker reads a
    checkpoint's state and the chief alone writes it."""
    return keras.backend.backend() == "tensorflow" and _joined()


def _digest_words(value):
    """Two non-negative int32 words of the sha256 of `value` as JSON."""
    import hashlib
    import json

    text = json.dumps(value, sort_keys=True, default=str).encode("utf-8")
    digest = hashlib.sha256(text).digest()
    return [int.from_bytes(digest[i:i + 4], "little") >> 1 for i in (0, 4)]


def check_processes_agree(fields):
    """Refuses a job whose processes were started differently, before any
    step: each process's sha256 of every `fields` value (name -> JSON-able
    value) is gathered on every process through JAX's collectives
    (`multihost_utils.process_allgather`), and a `ValueError` names the
    first field and the processes whose value differs from process 0's.
    Nothing to do in a single process.

    Example: `check_processes_agree({"recipe": recipe, "seed": 0,
    "keras_attn version": __version__})`.
    """
    if not _joined():
        return
    import numpy as np

    names = list(fields)
    mine = np.array([_digest_words(fields[name]) for name in names], dtype="int32")
    gathered = np.asarray(_all_gather(mine))  # (processes, fields, 2)
    for column, name in enumerate(names):
        differ = [p for p in range(gathered.shape[0])
                  if not np.array_equal(gathered[p, column], gathered[0, column])]
        if differ:
            which = ", ".join(str(p) for p in differ)
            raise ValueError(
                f"The processes of this job were started with another {name}: process "
                f"{which} differ{'s' if len(differ) == 1 else ''} from process 0 (this is "
                f"process {process_index()} of {gathered.shape[0]}). Start every process "
                f"with the same command, recipe, overrides, data and keras_attn. "
                f"Received: {name} differing on process {which}")


def broadcast_json(value):
    """Process 0's JSON-able `value`, on every process of a joined JAX or
    TensorFlow multi-worker job (`multihost_utils.broadcast_one_to_all`; on
    TensorFlow a sum over the workers, the others giving zeros); `value`
    itself otherwise. The other processes' `value` is ignored."""
    if not _joined():
        return value
    import json

    import numpy as np

    data = np.frombuffer(json.dumps(value).encode("utf-8"), dtype="uint8").astype("int32")
    size = int(_from_process_0(np.array(len(data), dtype="int32")))
    padded = np.zeros(size, dtype="int32")
    padded[:min(size, len(data))] = data[:size]
    data = np.asarray(_from_process_0(padded)).astype("uint8")
    return json.loads(data.tobytes().decode("utf-8"))


def _tf_broadcast_arrays(arrays):
    """Process 0's `arrays` bit for bit, whatever their dtypes: their bytes
    as int32 words summed over the workers, the others' words zeros."""
    import numpy as np

    data = b"".join(np.ascontiguousarray(array).tobytes() for array in arrays)
    words = np.frombuffer(data + bytes(-len(data) % 4), dtype="int32")
    data = _from_process_0(words).tobytes()
    received, start = [], 0
    for array in arrays:
        received.append(
            np.frombuffer(data, array.dtype, array.size, start).reshape(array.shape).copy())
        start += array.nbytes
    return received


def broadcast_arrays(arrays):
    """Process 0's NumPy arrays (a list; the other processes pass arrays of
    the same shapes and dtypes, e.g. zeros), on every process of a joined
    JAX or TensorFlow multi-worker job; `arrays` itself otherwise. Exact:
    the others' zeros are added (on TensorFlow to the arrays' bytes)."""
    if not _joined() or not arrays:
        return arrays
    if keras.backend.backend() == "tensorflow":
        return _tf_broadcast_arrays(arrays)
    import numpy as np

    received = _from_process_0(list(arrays))
    return [np.asarray(new).astype(old.dtype) for new, old in zip(received, arrays)]


def process_rows(dataset, process, processes):
    """`dataset` (tf.data batches) with each batch cut into `processes`
    equal slices of rows, slice `process` kept: what each process of a
    multi-process JAX job feeds under `data_parallel(auto_shard_dataset=
    False)`, so that the global batch is the dataset's batch even where its
    size varies (a short last batch made even by `even_batches`; Keras's own
    sharding needs one known size). Every batch size must divide by
    `processes`."""
    import tensorflow as tf

    def rows(*batch):
        structure = batch[0] if len(batch) == 1 else batch
        size = tf.shape(tf.nest.flatten(structure)[0])[0] // processes
        return tf.nest.map_structure(
            lambda tensor: tensor[process * size:(process + 1) * size], structure)

    return dataset.map(traced_as_written(rows))


# A task as TensorFlow's errors name it: `/job:worker/replica:0/task:1`
# (or `/job:worker/task:1`).
_TF_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def _jax_lost_process(error):
    """The `RuntimeError` to raise for `error`, a JAX collective that failed
    in a joined job (`Gloo AllReduce failed ... Connection reset by peer`);
    None for any other error."""
    import jax

    if not isinstance(error, (RuntimeError, ValueError)):
        return None
    collective = isinstance(error, jax.errors.JaxRuntimeError) or "Gloo" in str(error)
    if not _joined() or not collective:
        return None
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return RuntimeError(
        f"Process {jax.process_index()} of {jax.process_count()}: a collective of this "
        f"job failed ({first}): another process stopped or lost its connection. JAX's "
        "distributed runtime names the lost process ('Task N heartbeat timeout') and "
        "ends this one within its heartbeat timeout (100 s by default, else "
        f"{HEARTBEAT_TIMEOUT_ENV}). The "
        "checkpoints written so far are complete: run the same commands again to "
        "resume.")


def _tf_tasks(strategy):
    """The cluster's `(job, task)` pairs in process order (the chief, then
    the workers, as `_tf_process_of` numbers them), the address of each,
    and this worker's pair: TensorFlow's reading of TF_CONFIG
    (`strategy.cluster_resolver`)."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec()
    tasks = [(job, task) for job in ("chief", "worker") if job in spec.jobs
             for task in spec.task_indices(job)]
    addresses = {(job, task): spec.task_address(job, task) for job, task in tasks}
    return tasks, addresses, (resolver.task_type, resolver.task_id)


def _tf_lost_process(error):
    """The `RuntimeError` to raise for `error`, a TensorFlow collective
    aborted in a joined MultiWorkerMirroredStrategy job because a worker was
    lost; None for any other error. TensorFlow detects the loss itself: its
    coordination service (which the strategy starts on the chief) aborts the
    collectives of every worker once one stops sending heartbeats
    (`UnavailableError: ... The following tasks are unhealthy (stopped
    sending heartbeats): /job:worker/replica:0/task:1`), and a collective
    whose peer's connection is reset fails at once (`... from remote target
    /job:worker/replica:0/task:0 ...`). The lost worker is the task TensorFlow
    names other than this one, its address taken from the cluster; where
    TensorFlow names none, every other worker is listed."""
    import tensorflow as tf

    strategy = _TF_STRATEGIES.get("multi_worker")
    message = str(error)
    aborted = isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                                 tf.errors.DeadlineExceededError))
    if (strategy is None or not isinstance(error, tf.errors.OpError)
            or not (aborted or "Collective ops is aborted" in message)):
        return None
    tasks, addresses, me = _tf_tasks(strategy)
    if len(tasks) < 2:
        return None
    named = {(job, int(task)) for job, task in _TF_TASK.findall(message)}
    lost = [task for task in tasks if task in named and task != me]
    others = [task for task in tasks if task != me]

    def describe(task):
        return (f"process {tasks.index(task)} (TF_CONFIG's {task[0]} {task[1]}, "
                f"{addresses[task]})")

    if lost:
        who = " and ".join(describe(task) for task in lost) + (
            " was" if len(lost) == 1 else " were") + " lost"
    elif len(others) == 1:
        who = f"{describe(others[0])}, the only other worker, was lost"
    else:
        who = ("a worker was lost (TensorFlow's error names none), one of "
               + ", ".join(describe(task) for task in others))
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    says = next((line for line in lines if "aborted by" in line or _TF_TASK.search(line)),
                lines[0] if lines else "")
    return RuntimeError(
        f"Process {tasks.index(me)} of {len(tasks)} (TF_CONFIG's {me[0]} {me[1]}): a "
        f"collective of this job failed: {who} ({type(error).__name__}: {says[:300]}). "
        "TensorFlow's coordination service aborts every worker's collectives once one "
        "stops sending heartbeats (after about 10 s), at once where a peer's connection "
        "is reset. The checkpoints written so far are complete: run the same commands "
        "again to resume.")


@contextlib.contextmanager
def naming_lost_processes():
    """In a joined JAX job or TensorFlow multi-worker job, turns the failure
    of a collective because a process was lost (killed, or its host lost)
    into a `RuntimeError` that names it where the engine does, says what
    happened and what follows (`_jax_lost_process`, `_tf_lost_process`);
    other errors, and errors in a single process, pass unchanged."""
    try:
        yield
    except Exception as error:
        backend = keras.backend.backend()
        lost = (_jax_lost_process(error) if backend == "jax" else
                _tf_lost_process(error) if backend == "tensorflow" else None)
        if lost is None:
            raise
        raise lost from error


def end_processes():
    """Waits for every process of a joined JAX job at a barrier, then leaves
    the job (`jax.distributed.shutdown`): process 0 then evaluates and
    exports on its own, and the others end without waiting for it. Nothing
    to do on TensorFlow: the chief's saving of the model, a collective
    (`keras_attn.zoo.runs`), was the workers' last meeting."""
    if keras.backend.backend() != "jax" or not _joined():
        return
    import jax
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("keras_attn: training done")
    jax.distributed.shutdown()


@contextlib.contextmanager
def _jax_data_parallel(devices, auto_shard_dataset=True):
    _jax_initialize()
    if devices is None:
        devices = tuple(keras.distribution.list_devices())
        if len(devices) < 2:
            _warn_single_device(", ".join(devices))
            yield 1
            return
    distribution = keras.distribution.DataParallel(
        devices=list(devices), auto_shard_dataset=auto_shard_dataset
    )
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield distribution.num_model_replicas
    finally:
        keras.distribution.set_distribution(previous)


@contextlib.contextmanager
def data_parallel(enabled=True, devices=None, auto_shard_dataset=True):
    """Runs the block data parallel; yields the number of replicas.

    Build, compile, train and save the model inside the block. The variables
    are replicated on every device; each optimizer step splits one global
    batch across the replicas and applies the gradient of its mean loss.

    - TensorFlow: `tf.distribute.MultiWorkerMirroredStrategy` when the
      `TF_CONFIG` environment variable is set (with several workers, the
      block also works around the two places where Keras 3 `fit` and
      `evaluate` fail under it:
      `keras_attn._keras_compat.tensorflow_multi_worker_fit`); else
      `MirroredStrategy` over `devices`, or over the local
      GPUs, or, without GPUs, over the logical CPU devices when there are
      several (MirroredStrategy alone would ignore them). One strategy per
      device set and process, reused by later blocks.
    - JAX: `keras.distribution.DataParallel` over `devices` or
      `keras.distribution.list_devices()` (GPUs, else TPUs, else CPUs; the
      devices of every process once initialised), set as the global
      distribution for the block, the previous one put back after it. When a
      launcher set `KERAS_DISTRIBUTION_JOB_ADDRESSES`,
      `KERAS_DISTRIBUTION_NUM_PROCESSES` or `KERAS_DISTRIBUTION_PROCESS_ID`,
      `keras.distribution.initialize()` runs first, once per process: enter
      the block before any JAX computation. Each process then keeps its share
      of every `tf.data` batch, so all must build the same pipeline (seeded).
    - torch: not supported, a `ValueError`.

    The batch size is global: a dataset batch of B examples is one optimizer
    step on B examples whatever the number of replicas R, each replica
    computing B / R of them (the module docstring says how each engine does
    it), so a recipe's batch size and learning rate mean the same on 1 or R
    devices. Keep every batch a multiple of R (`describe_replicas` checks the
    batch size; drop or avoid a smaller last batch): JAX cannot shard an
    uneven batch, TensorFlow would give the replicas unequal shares.

    Only one device found (none named in `devices`): a warning, and the block
    runs undistributed with 1 replica. Failing instead would make
    `--distribute` recipes and scripts break on a laptop or a one-GPU
    runner, while one device with the same global batch is the same
    computation, only slower; the warning explains the slowness.

    Args:
        enabled: False makes the block a no-op that yields 1 (so callers can
            write `data_parallel(enabled=args.distribute)`).
        devices: device names to replicate over instead of the detected ones:
            TensorFlow names (`"/gpu:0"`, `"/cpu:1"`) or Keras JAX names
            (`"gpu:0"`, as `keras.distribution.list_devices()` gives them).
            Not allowed with `TF_CONFIG`.
        auto_shard_dataset: JAX, several processes: True lets Keras give
            each process its share of every `tf.data` batch (batches of one
            known size: `rebatch` then `shard`); False when the caller
            feeds each process its own rows (`process_rows`).

    Yields:
        The number of replicas in sync (1 when disabled or on one device).

    Raises:
        ValueError: on the torch backend (or any but tensorflow and jax) when
            enabled, for a malformed `devices`, or for `devices` with
            `TF_CONFIG`.
    """
    devices = _check_devices(devices)
    if not enabled:
        yield 1
        return
    backend = keras.backend.backend()
    if backend == "tensorflow":
        manager = _tf_data_parallel(devices)
    elif backend == "jax":
        manager = _jax_data_parallel(devices, auto_shard_dataset)
    else:
        raise ValueError(
            "Data parallel training (`--distribute`) runs on the tensorflow and "
            f"jax backends, not on {backend}. Received: backend={backend!r}"
        )
    with manager as replicas:
        yield replicas


MODEL_PARALLEL = "model_parallel"


def parse_distribute(value):
    """Reads a `--distribute` value: `None` or `False` (one device), `True`
    or `"data_parallel"` (data parallel), `"model_parallel:MxN"` (M data
    replicas times N model shards).

    Returns:
        None, `"data_parallel"`, or `(M, N)` for model parallel.

    Raises:
        ValueError: for any other value, naming it.

    Example:

    >>> parse_distribute("model_parallel:2x4")
    (2, 4)
    >>> parse_distribute(True)
    'data_parallel'
    """
    if value is None or value is False:
        return None
    if value is True or value == "data_parallel":
        return "data_parallel"
    match = isinstance(value, str) and re.fullmatch(
        MODEL_PARALLEL + r":([1-9][0-9]*)x([1-9][0-9]*)", value
    )
    if not match:
        raise ValueError(
            "`distribute` must be `data_parallel` or "
            "`model_parallel:MxN` (M data replicas x N model shards, e.g. "
            f"model_parallel:2x4). Received: distribute={value!r}"
        )
    return int(match.group(1)), int(match.group(2))


@contextlib.contextmanager
def model_parallel(mesh_shape, layout_map, devices=None):
    """Runs the block model parallel (JAX); yields the number of data
    replicas.

    A `(data, model)` device mesh over `devices` (default: every device,
    `keras.distribution.list_devices()`, after `keras.distribution.initialize()`
    when a multi-process launcher set its variables, as in `data_parallel`),
    with the `keras.distribution.LayoutMap` that `layout_map` makes for it
    (the family's `keras_attn.models.layout_map`: each attention layer
    sharded over its heads, each feed-forward over its inner width, token
    embeddings over the vocabulary, the rest replicated). Each batch is split
    over the `data` axis (keep it a multiple of M). Build, compile, train and
    save the model inside the block; the previous distribution is put back
    after it.

    Args:
        mesh_shape: `(M, N)`: M data replicas times N model shards; M x N
            must be the number of devices.
        layout_map: `layout_map(device_mesh, model_axis)` -> the layout of
            the model's weights, e.g. `functools.partial(
            keras_attn.models.layout_map, config)` for the family config the
            model will be built from (the caller names the model: training
            sits below the models and imports none).
        devices: Keras JAX device names instead of every device.

    Raises:
        ValueError: on a backend other than JAX, when M x N is not the
            number of devices, or what `layout_map` raises (the models' own:
            heads or an inner width that do not divide over N).
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise ValueError(
            "Model parallel training (`--distribute model_parallel:MxN`) runs on "
            "the jax backend (Keras's distribution API); use data parallel "
            f"(`--distribute`) on {backend}. Received: backend={backend!r}"
        )
    devices = _check_devices(devices)
    _jax_initialize()
    devices = list(devices or keras.distribution.list_devices())
    data, shards = mesh_shape
    if data * shards != len(devices):
        raise ValueError(
            f"The mesh {data}x{shards} needs {data * shards} devices and there are "
            f"{len(devices)} ({', '.join(devices)}). Received: mesh_shape={tuple(mesh_shape)}"
        )
    mesh = keras.distribution.DeviceMesh((data, shards), ("batch", "model"), devices)
    distribution = keras.distribution.ModelParallel(
        layout_map=layout_map(mesh, "model"), batch_dim_name="batch"
    )
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield data
    finally:
        keras.distribution.set_distribution(previous)


def describe_replicas(replicas, batch_size):
    """A one-line report of the replica count and what the batch size means.

    Args:
        replicas: what `data_parallel` yielded.
        batch_size: the recipe's batch size, the global batch.

    Returns:
        e.g. `"2 replicas: global batch 64 = 32 examples per replica per step"`.

    Raises:
        ValueError: when `batch_size` is not a multiple of `replicas` (JAX
            cannot shard such a batch; TensorFlow would give the replicas
            unequal shares), or either is not a positive integer.

    Example:

    >>> describe_replicas(1, batch_size=64)
    '1 replica: global batch 64 per step'
    >>> describe_replicas(2, batch_size=64)
    '2 replicas: global batch 64 = 32 examples per replica per step'
    """
    for name, value in (("replicas", replicas), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"`{name}` must be a positive integer. Received: {name}={value!r}"
            )
    if batch_size % replicas:
        raise ValueError(
            f"The global batch size must be a multiple of the {replicas} replicas "
            f"(each takes an equal share of every batch). Received: "
            f"batch_size={batch_size}"
        )
    if replicas == 1:
        return f"1 replica: global batch {batch_size} per step"
    return (
        f"{replicas} replicas: global batch {batch_size} = "
        f"{batch_size // replicas} examples per replica per step"
    )
