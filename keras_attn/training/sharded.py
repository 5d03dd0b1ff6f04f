"""Sharded state across JAX processes: orbax-checkpoint arrays, a shared
directory, a model gathered for one process.

Under `--distribute model_parallel:MxN` with the N model shards on devices of
several processes, no process holds a whole sharded weight (a `jax.Array`
that is not fully addressable): NumPy cannot read it, so neither an npz
checkpoint nor Keras's `model.save` can be written by one process. Here:

- `save` / `restore`: the state's arrays through orbax-checkpoint
  (`PyTreeCheckpointer`), the checkpoint library made for sharded JAX state.
  Every process writes the shards it holds (a replicated array once) into
  one directory; orbax writes to a temporary directory and renames it when
  every process has finished (its own atomic commit), and reads any layout
  back: a checkpoint of N processes restores on M processes or on one
  (orbax reads each process's slice of every array). The checkpoint's
  manifest (`keras_attn.training.checkpoints`) is written by process 0 after
  that commit, so a checkpoint counts only once both are complete.
- `check_shared_directory`: orbax needs every process to see the same
  directory; a directory per host is refused by name before any step.
- `gathered_values`: the whole arrays on every process
  (`multihost_utils.process_allgather`), for a model.keras that one process
  loads (the model must fit in one host's memory).

Why not Keras's own orbax integration (`Model.get_state_tree()`, which its
`OrbaxCheckpoint` callback saves, and `load_weights` of such a directory):
it holds the model, optimizer and metrics variables but not the global
`SeedGenerator`'s state, and keys them by path, while the npz checkpoints and
their checks (`checkpoints.check_group`) go by position. The groups here are
the npz checkpoint's groups, keyed by position, so both formats share one
manifest, one check and one resume. (The orbax calls are the same: a pytree
of `jax.Array`s saved, `jax.ShapeDtypeStruct`-like targets with the current
shardings to restore, as Keras's `build_orbax_abstract_pytree` builds them.)

orbax-checkpoint is imported here only, and only when such state is saved
or read (`pip install keras-attn[multihost]`).
"""

import contextlib
import os
import secrets

import keras
import numpy as np

from keras_attn.errors import CorruptCheckpointError

# Written by process 0 in a directory, read by the others (`check_shared_directory`).
TOKEN_FILE = ".shared-directory-check"


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(
            "Model parallel across processes checkpoints its sharded state with "
            "orbax-checkpoint: `pip install orbax-checkpoint` (or keras-attn[multihost])."
        ) from None
    return ocp


def spans_processes(variables):
    """True where some variable's value is a JAX array laid out over the
    devices of several processes and not replicated on all of them (split
    over the model axis): NumPy cannot read it on one process. False on the
    other backends, in a single process and for data parallel (replicated)
    state."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    if not jax.distributed.is_initialized() or jax.process_count() < 2:
        return False
    return any(not getattr(v.value, "is_fully_addressable", True)
               and not v.value.is_fully_replicated for v in variables)


def batch_rows(mesh_shape, process, processes):
    """`(index, count)`: the slice of every global batch that process
    `process` of `processes` feeds under a `(data, model)` mesh laid out
    process by process (`keras.distribution.list_devices()` order), as
    Keras's own dataset sharding gives it: the whole batch when there is
    one data replica or the replicas span processes, else its share of the
    replicas' rows.

    >>> batch_rows((1, 2), 1, 2)
    (0, 1)
    >>> batch_rows((2, 2), 1, 2)
    (1, 2)
    """
    data = mesh_shape[0]
    count = min(data, processes)
    return process * count // processes, count


def _key(index):
    return f"{index:06d}"


def save(path, groups):
    """Writes `{group: [variables]}` to the orbax directory `path` on every
    process of the job (each writes the shards it holds); returns once orbax
    has committed it (renamed from its temporary name on every process)."""
    ocp = _orbax()
    tree = {group: {_key(i): v.value for i, v in enumerate(variables)}
            for group, variables in groups.items()}
    ocp.PyTreeCheckpointer().save(os.path.abspath(path), tree)


def is_complete(path):
    """Whether orbax committed `path` (its metadata, written last, exists)."""
    return os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA"))


def restore(path, targets, specs):
    """Reads the groups of `targets` (`{group: [variables] or None}`) from the
    orbax directory `path`: a group with variables as JAX arrays laid out as
    those variables are (each process reads its own slices; any layout and
    process count), a group with None (or on another backend) as whole NumPy
    arrays. Returns `{group: [array, ...]}`. `specs[group]` is the manifest's
    list: each array read must have its shape and dtype (as stored, no cast
    by orbax), else a `CorruptCheckpointError` (a `ValueError`) names `path`
    and the array; so is an array orbax cannot read."""
    ocp = _orbax()
    restore_args, item = {}, {}
    for group, variables in targets.items():
        if not specs[group]:
            continue
        restore_args[group], item[group] = {}, {}
        for index, spec in enumerate(specs[group]):
            key = _key(index)
            item[group][key] = np.zeros((), spec["dtype"])
            if variables is None or keras.backend.backend() != "jax":
                restore_args[group][key] = ocp.RestoreArgs(restore_type=np.ndarray)
            else:
                # No dtype: one given, orbax would cast what it stored to it;
                # strict: a stored shape that differs is an error, not padded
                # or truncated to this one.
                restore_args[group][key] = ocp.ArrayRestoreArgs(
                    sharding=variables[index].value.sharding,
                    global_shape=tuple(spec["shape"]), strict=True)
    if not item:
        return {group: [] for group in targets}
    # A partial restore: the groups asked for only (the metrics' variables
    # may not exist yet when the weights are restored).
    try:
        restored = ocp.PyTreeCheckpointer().restore(
            os.path.abspath(path), args=ocp.args.PyTreeRestore(
                item=item, restore_args=restore_args, partial_restore=True))
        arrays = {group: [restored[group][_key(i)] for i in range(len(specs[group]))]
                  if specs[group] else [] for group in targets}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CorruptCheckpointError(
            f"Checkpoint {path} could not be read by orbax ({error}).") from error
    for group, values in arrays.items():
        for index, (spec, value) in enumerate(zip(specs[group], values)):
            found = (tuple(value.shape), str(np.dtype(value.dtype)))
            if found != (tuple(spec["shape"]), spec["dtype"]):
                raise CorruptCheckpointError(
                    f"Checkpoint {path} does not hold what its manifest says: {group} "
                    f"array {index} ('{spec['path']}') is {found[0]} {found[1]}, the "
                    f"manifest says {tuple(spec['shape'])} {spec['dtype']}.")
    return arrays


def finite_counts(variables):
    """The number of non-finite values of each variable, over the whole job:
    each process counts in the shards it holds (a replicated shard once)
    and the counts are summed across processes (one collective)."""
    from jax.experimental import multihost_utils

    local = np.zeros(len(variables), dtype="int32")
    for index, variable in enumerate(variables):
        for shard in variable.value.addressable_shards:
            if shard.replica_id == 0 and np.dtype(shard.data.dtype).kind in "fc":
                local[index] += int(np.sum(~np.isfinite(np.asarray(shard.data))))
    return np.asarray(multihost_utils.process_allgather(local)).sum(axis=0)


def gathered_values(variables):
    """Whole NumPy arrays of `variables` on every process (a collective:
    every process calls it); the model must fit one host's memory."""
    from jax.experimental import multihost_utils

    values = [v.value for v in variables]
    return [np.asarray(a) for a in multihost_utils.process_allgather(values, tiled=True)]


def one_process_copy(model, build):
    """The trained `model`, whose weights are split over several processes'
    devices, as a model on process 0's own device (None on the others), for
    a model.keras that loads on one process: every variable (and the
    optimizer's) gathered whole on every process (a collective), assigned
    on process 0 to `build()` (a compiled model of the same configuration,
    built here without the distribution)."""
    import jax

    values = gathered_values(model.variables)
    slots = gathered_values(model.optimizer.variables)
    if jax.process_index() != 0:
        return None
    with no_distribution():
        copy = build()
        copy.optimizer.build(copy.trainable_variables)
        for group, targets, arrays in (("model", copy.variables, values),
                                       ("optimizer", copy.optimizer.variables, slots)):
            shapes = [tuple(v.shape) for v in targets]
            if shapes != [a.shape for a in arrays]:
                raise ValueError(
                    f"The one-process copy of {model.name} does not match its {group} "
                    f"variables ({len(shapes)} against {len(arrays)}). Received: "
                    f"model={model.name!r}")
            for variable, array in zip(targets, arrays):
                variable.assign(array.astype(keras.backend.standardize_dtype(variable.dtype)))
    return copy


@contextlib.contextmanager
def no_distribution():
    """Within the block, no Keras distribution: a model built here lives on
    this process's own default device."""
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def check_shared_directory(directory, argument="output"):
    """Refuses, on every process of the job and before any step, a
    `directory` that is not one directory shared by every process (one per
    host, or a path that names another place on some host): process 0 writes
    a random token into it, the others read it back. A `ValueError` names
    the path and the processes that could not read it."""
    from jax.experimental import multihost_utils

    import jax

    from keras_attn.training.distribute import broadcast_json

    path = os.path.join(directory, TOKEN_FILE)
    token = None
    if jax.process_index() == 0:
        token = secrets.token_hex(16)
        os.makedirs(directory, exist_ok=True)
        # Closed before the broadcast below: on a network file system a
        # file closed on one host is seen whole by a later open on another.
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(token)
    token = broadcast_json(token)
    seen = None
    if jax.process_index() != 0:
        try:
            with open(path, encoding="utf-8") as stream:
                seen = stream.read()
        except (OSError, ValueError):
            seen = None
    ok = np.array([jax.process_index() == 0 or seen == token], dtype="int32")
    found = np.asarray(multihost_utils.process_allgather(ok)).reshape(-1)
    if jax.process_index() == 0:
        with contextlib.suppress(OSError):
            os.remove(path)
    missing = [str(p) for p in range(len(found)) if not found[p]]
    if missing:
        raise ValueError(
            f"Model parallel across processes needs a directory that every process sees "
            f"(a shared file system): each process writes its own shards of "
            f"every checkpoint into it. Process {', '.join(missing)} cannot read "
            f"{path}, which process 0 wrote (a directory per host?). Give every process "
            f"the same shared directory. Received: {argument}={directory!r} on process "
            f"{jax.process_index()} of {len(found)}")
