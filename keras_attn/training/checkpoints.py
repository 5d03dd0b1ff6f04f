"""Atomic, verified checkpoints of variables: `ckpt-<step:08d>.npz` + manifest.

A checkpoint is two files in one directory:

- `ckpt-00000012.npz`: the arrays, grouped (`model`, `optimizer`, ...), stored
  under the keys `<group>.<index>`; uncompressed, read without pickle.
- `ckpt-00000012.json`: the manifest: the sha256 and size of the npz, the
  step, the path / shape / dtype of every array, the caller's metadata (epoch,
  fingerprint, history, ...), the keras_attn / keras versions and backend, and
  a checksum of the manifest itself.

Both are written atomically (a temporary file in the same directory, flush,
fsync, `os.replace`, fsync of the directory), the npz first and the manifest
last: a checkpoint counts only once its manifest exists, so a process killed
at any instant leaves either the previous set of checkpoints or the new one,
never a half-written file that would be read.

Under model parallel across JAX processes no process holds the whole state:
`save_sharded` writes the arrays as `ckpt-00000012.orbax/`, an orbax-checkpoint
directory to which every process writes its own shards (orbax's own atomic
commit: a temporary directory renamed once every process is done), and
process 0 writes the manifest after it (format `keras_attn.checkpoint.orbax/1`:
the same fields, and instead of one file's sha256 and size those of every file
of the directory, `files`, which process 0 reads whole once orbax committed
it). The arrays are read when the caller knows where they go
(`ShardedCheckpoint.load`: each process its own slices, whatever the layout or
the process count), and each is checked against its manifest entry.

Why the digests: orbax's OCDBT store checks its own index (CRC-32C) but not
the array chunks it points to; a flipped byte there restored silently as
another weight. Hashing costs what the npz path's sha256 costs (one read of
the whole state by process 0 at each save and each resume: 0.07 s for a
59 MB directory on a CPU test machine, against 1.1 s for orbax's save), and
the state of a model-parallel run fits one host's disk and memory anyway
(its model.keras is gathered on one process).

Reading goes newest first. A manifest that does not parse, whose checksum
fails or whose fields are not of their types (the step of its name, a path,
shape and dtype per variable), an npz whose sha256 or size differs from its
manifest, or that does not unzip, an orbax directory not committed or with a
file missing, added or differing from its digest: each is skipped with a
`warnings.warn` naming the file, and the next older checkpoint is tried. Matching a checkpoint to a model (`check_compatible`) is
separate and strict: a valid checkpoint for another model is a `ValueError`,
never a fallback and never a partial load.

Variables are matched by position (`model.variables` order): paths are not
unique in Keras 3 (two `Dropout` layers both own `.../seed_generator_state`),
so they are recorded only to write errors that say which variable differs.
"""

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
import zipfile

import keras
import numpy as np

from keras_attn._version import __version__
from keras_attn.errors import CorruptCheckpointError  # raised here (and its old home)

FORMAT = "keras_attn.checkpoint/1"
FORMAT_SHARDED = "keras_attn.checkpoint.orbax/1"
_NAME = re.compile(r"^ckpt-(\d{8,})\.(npz|json|orbax)$")
# `.ckpt-00000012.npz.<random>.tmp`, `.history.json.<random>.tmp`, and orbax's
# `ckpt-00000012.orbax.orbax-checkpoint-tmp-<n>` directories
_TEMPORARY = re.compile(r"^\.(ckpt-\d{8,}\.(npz|json)|history\.json)\.[^.]+\.tmp$"
                        r"|^ckpt-\d{8,}\.orbax\.orbax-checkpoint-tmp")
_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)
_HASH_CHUNK = 1 << 20


def checkpoint_name(step):
    return f"ckpt-{step:08d}"


def atomic_write(path, write):
    """Writes `path` through `write(binary_file)` so that readers see either
    the old file or the complete new one: a temporary file in the same
    directory (same file system, so `os.replace` is atomic), flushed and
    fsynced before the rename, the directory fsynced after it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)  # mkstemp creates 0o600
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    _fsync_directory(directory)


def atomic_write_json(path, value):
    text = json.dumps(value, indent=1, sort_keys=True) + "\n"
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _fsync_directory(directory):
    # Makes the rename itself durable; not possible on every platform.
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path):
    """Deletes a file, or an orbax checkpoint's directory; gone already is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical_checksum(manifest):
    body = {key: value for key, value in manifest.items() if key != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def directory_digests(directory):
    """`{relative path: {"size": bytes, "sha256": hex}}` of every file under
    `directory` (an orbax checkpoint's), "/"-separated paths."""
    return {relative: {"size": os.path.getsize(os.path.join(directory, relative)),
                       "sha256": _sha256_of_file(os.path.join(directory, relative))}
            for relative in _files_under(directory)}


def _files_under(directory):
    found = []
    for root, _, names in os.walk(directory):
        found += [os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
                  for name in names]
    return sorted(found)


def _check_digests(directory, files):
    """Raises `ValueError` saying which file of `directory` is missing, not
    listed in `files` (the manifest's digests) or differs from its digest."""
    found = _files_under(directory)
    missing = sorted(set(files) - set(found))
    if missing:
        raise ValueError(f"{len(missing)} file(s) of its manifest missing: {missing[:3]}")
    extra = sorted(set(found) - set(files))
    if extra:
        raise ValueError(f"{len(extra)} file(s) its manifest does not list: {extra[:3]}")
    for relative in found:
        path = os.path.join(directory, relative)
        size = os.path.getsize(path)
        if size != files[relative]["size"]:
            raise ValueError(f"{relative} is {size} bytes, the manifest says "
                             f"{files[relative]['size']}")
        if _sha256_of_file(path) != files[relative]["sha256"]:
            raise ValueError(f"the sha256 of {relative} differs from the manifest's")


def _check_fields(manifest, name):
    """Raises `ValueError` naming the first field of a manifest (checksum
    valid, so written or edited on purpose) that is not what `read` and the
    checks after it rely on: the step of its name, `{group: [{path, shape,
    dtype}]}`, and for an orbax directory its files' digests."""
    step = manifest.get("step")
    if type(step) is not int or checkpoint_name(step) != name:
        raise ValueError(f"its step is {step!r}, its name {name!r}")
    variables = manifest.get("variables")
    if not isinstance(variables, dict):
        raise ValueError(f"its variables are {type(variables).__name__}, not a JSON object")
    for group, specs in variables.items():
        if not isinstance(specs, list):
            raise ValueError(f"its variables.{group} is {type(specs).__name__}, not a list")
        for index, spec in enumerate(specs):
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if (not isinstance(spec, dict) or set(spec) != {"path", "shape", "dtype"}
                    or not isinstance(spec["path"], str) or not isinstance(shape, list)
                    or any(type(n) is not int or n < 0 for n in shape)
                    or not isinstance(spec["dtype"], str)):
                raise ValueError(f"its variables.{group}[{index}] is not a path, shape "
                                 f"and dtype: {spec!r}")
            try:
                np.dtype(spec["dtype"])
            except TypeError:
                raise ValueError(f"its variables.{group}[{index}] has an unknown dtype "
                                 f"{spec['dtype']!r}") from None
    if manifest["format"] != FORMAT_SHARDED:
        return
    files = manifest.get("files")
    if not isinstance(files, dict) or not files or not all(
            isinstance(entry, dict) and type(entry.get("size")) is int
            and isinstance(entry.get("sha256"), str) for entry in files.values()):
        raise ValueError("its files are not {path: {size, sha256}} (no digests of the "
                         "orbax directory)")


def variable_spec(path, array):
    return {
        "path": path,
        "shape": list(np.shape(array)),
        "dtype": str(np.asarray(array).dtype),
    }


class Checkpoint:
    """One verified checkpoint: its manifest and its arrays by group."""

    def __init__(self, name, manifest, arrays):
        self.name = name
        self.manifest = manifest
        self.arrays = arrays  # {group: [np.ndarray, ...]}

    @property
    def step(self):
        return self.manifest["step"]

    @property
    def file(self):
        # The manifest's: an orbax directory's arrays read whole (`ResumableTrainer`)
        # are held here too.
        return self.manifest.get("file", self.name + ".npz")

    def specs(self, group):
        return self.manifest["variables"].get(group)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"


class ShardedCheckpoint(Checkpoint):
    """A checkpoint whose arrays are an orbax directory (`save_sharded`):
    verified manifest first, arrays read by `load` once the caller knows
    where each goes; `arrays` holds the groups loaded so far."""

    def __init__(self, name, manifest, directory):
        super().__init__(name, manifest, {})
        self.directory = directory

    @property
    def file(self):
        return self.name + ".orbax"

    def load(self, targets):
        """Reads the groups of `targets` (`{group: [variables] or None}`,
        see `sharded.restore`) into `arrays`. Every process of the job
        calls it. Call `check_group` first."""
        from keras_attn.training import sharded

        specs = {group: self.specs(group) or [] for group in targets}
        path = os.path.join(self.directory, self.file)
        self.arrays.update(sharded.restore(path, targets, specs))


class CheckpointManager:
    """Writes, lists, prunes and reads the checkpoints of one directory.

    One writer per directory: `save` deletes checkpoints beyond `max_to_keep`
    and `remove_temporary_files` deletes leftovers of interrupted writes.
    Readers (`latest`) never delete anything.

    Args:
        directory: where the checkpoints live (created by `save`).
        max_to_keep: how many of the newest checkpoints `save` keeps.
    """

    def __init__(self, directory, max_to_keep=3):
        self.directory = os.fspath(directory)
        self.max_to_keep = max_to_keep

    def _path(self, name):
        return os.path.join(self.directory, name)

    def _listing(self):
        """({step: manifest name}, {step: [npz file and / or orbax directory]})."""
        manifests, arrays = {}, {}
        if not os.path.isdir(self.directory):
            return manifests, arrays
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            if match and match.group(2) == "json":
                manifests[int(match.group(1))] = name
            elif match:  # both where a run resumed on another process count
                arrays.setdefault(int(match.group(1)), []).append(name)
        return manifests, arrays

    def steps(self):
        """Steps that have a manifest, oldest first (not verified)."""
        return sorted(self._listing()[0])

    def save(self, step, groups, metadata=None):
        """Writes checkpoint `step` and prunes old ones; returns its name.

        Args:
            step: a non-negative int, the file name's number.
            groups: `{group: [(path, array), ...]}`.
            metadata: JSON-able dict stored at the top of the manifest.
        """
        os.makedirs(self.directory, exist_ok=True)
        name = checkpoint_name(step)
        arrays = {}
        specs = {}
        for group, entries in groups.items():
            specs[group] = []
            for index, (path, array) in enumerate(entries):
                arrays[f"{group}.{index}"] = np.asarray(array)
                specs[group].append(variable_spec(path, array))
        npz_path = self._path(name + ".npz")
        atomic_write(npz_path, lambda f: np.savez(f, **arrays))
        self._write_manifest(name, FORMAT, specs, metadata, file=name + ".npz",
                             sha256=_sha256_of_file(npz_path), size=os.path.getsize(npz_path))
        self._prune(step, name + ".npz")
        return name

    def save_sharded(self, step, groups, metadata=None):
        """Writes checkpoint `step` of `{group: [variables]}` whose values are
        split over the devices of several JAX processes; every process of
        the job calls it. The arrays go to `ckpt-<step>.orbax/` (each process
        its shards, through orbax-checkpoint, committed when all are done);
        then process 0 writes the manifest and prunes. Returns the name."""
        from keras_attn.training import sharded

        import jax

        name = checkpoint_name(step)
        os.makedirs(self.directory, exist_ok=True)
        if jax.process_index() == 0:
            # A checkpoint of this step that a killed run left (committed
            # arrays without a manifest, or one that was skipped as corrupt):
            # orbax does not write over a directory. The manifest first, as
            # in `_prune`; the others write nowhere final before orbax's
            # barriers, which process 0 reaches after this.
            for stale in (name + ".json", name + ".orbax"):
                _remove(self._path(stale))
        sharded.save(self._path(name + ".orbax"), groups)
        if jax.process_index() != 0:
            return name
        specs = {group: [{"path": v.path, "shape": list(v.shape),
                          "dtype": keras.backend.standardize_dtype(v.dtype)}
                         for v in variables]
                 for group, variables in groups.items()}
        # Every process's files, committed: process 0 reads them all (the
        # directory is shared, `sharded.check_shared_directory`).
        files = directory_digests(self._path(name + ".orbax"))
        self._write_manifest(name, FORMAT_SHARDED, specs, metadata, file=name + ".orbax",
                             processes=jax.process_count(), files=files)
        self._prune(step, name + ".orbax")
        return name

    def _write_manifest(self, name, format, specs, metadata, **fields):
        """The manifest of checkpoint `name`, written atomically (last)."""
        manifest = dict(metadata or {})
        reserved = {"format", "file", "sha256", "size", "step", "variables",
                    "versions", "checksum", "processes", "files"}
        clash = sorted(reserved & set(manifest))
        if clash:
            raise ValueError(
                f"`metadata` may not set the manifest's own keys. Received: "
                f"metadata keys {clash}"
            )
        manifest.update(
            format=format,
            step=int(name.split("-")[1]),
            variables=specs,
            versions={
                "keras_attn": __version__,
                "keras": keras.__version__,
                "backend": keras.backend.backend(),
            },
            **fields,
        )
        manifest["checksum"] = _canonical_checksum(manifest)
        atomic_write_json(self._path(name + ".json"), manifest)

    def _prune(self, step, written):
        manifests, arrays = self._listing()
        # Newer than the one just written: the state this run did not continue
        # from (corrupt ones that `latest` skipped), so never its future.
        stale = [s for s in manifests if s > step]
        kept = sorted((s for s in manifests if s <= step), reverse=True)
        for old in stale + kept[self.max_to_keep:]:
            # The manifest first: a half-deleted checkpoint no longer counts.
            for name in [manifests[old]] + arrays.get(old, []):
                _remove(self._path(name))
        for orphan in set(arrays) - set(manifests):  # a write killed before its manifest
            for name in arrays[orphan]:
                _remove(self._path(name))
        # The other format's arrays beside the ones just written (the step
        # written again by a run resumed on another process count).
        for name in arrays.get(step, []):
            if name != written:
                _remove(self._path(name))

    def remove_temporary_files(self):
        """Deletes the temporary files of writes that were interrupted."""
        if not os.path.isdir(self.directory):
            return []
        removed = sorted(n for n in os.listdir(self.directory) if _TEMPORARY.match(n))
        for name in removed:
            _remove(self._path(name))
        return removed

    def latest(self):
        """The newest checkpoint that reads back intact, or None.

        Every newer one that does not is skipped with a warning naming its
        file. Raises `CorruptCheckpointError` (a `ValueError`) when
        manifests exist but none is intact
        (see `ResumableTrainer` for why that is not a silent fresh start).
        """
        manifests, arrays = self._listing()
        newest_valid = None
        problems = []
        for step in sorted(manifests, reverse=True):
            try:
                newest_valid = self.read(manifests[step][: -len(".json")])
                break
            except CorruptCheckpointError as error:
                problems.append(str(error))
                warnings.warn(f"{error} Skipping it.", stacklevel=2)
        if manifests and newest_valid is None:
            raise CorruptCheckpointError(
                f"No intact checkpoint in `directory`={self.directory!r}: "
                + " ".join(problems)
                + " Move the files away (or delete them) to start afresh."
            )
        floor = newest_valid.step if newest_valid else -1
        for step in sorted(set(arrays) - set(manifests)):
            if step > floor:
                warnings.warn(
                    f"{self._path(arrays[step][0])} has no manifest (its write was "
                    "interrupted); ignoring it.",
                    stacklevel=2,
                )
        return newest_valid

    def read(self, name):
        """Reads and verifies checkpoint `name` (e.g. `ckpt-00000012`).

        Raises `CorruptCheckpointError` naming the file that is not intact.
        """
        manifest_path = self._path(name + ".json")
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
            if not isinstance(manifest, dict):
                raise ValueError("not a JSON object")
            if manifest.get("checksum") != _canonical_checksum(manifest):
                raise ValueError("its checksum does not match its content")
            if manifest.get("format") not in (FORMAT, FORMAT_SHARDED):
                raise ValueError(f"unknown format {manifest.get('format')!r}")
            suffix = ".npz" if manifest["format"] == FORMAT else ".orbax"
            if manifest.get("file") != name + suffix:
                raise ValueError(f"it describes {manifest.get('file')!r}")
            _check_fields(manifest, name)
        except _READ_ERRORS as error:  # UnicodeDecodeError is a ValueError
            raise CorruptCheckpointError(
                f"Checkpoint manifest {manifest_path} is corrupt ({error})."
            ) from error
        if manifest["format"] == FORMAT_SHARDED:
            from keras_attn.training import sharded

            directory = self._path(manifest["file"])
            if not sharded.is_complete(directory):
                raise CorruptCheckpointError(
                    f"Checkpoint {directory} is corrupt (missing, or not committed by orbax).")
            try:
                _check_digests(directory, manifest["files"])
            except _READ_ERRORS as error:
                raise CorruptCheckpointError(
                    f"Checkpoint {directory} is corrupt ({error}).") from error
            return ShardedCheckpoint(name, manifest, self.directory)
        npz_path = self._path(name + ".npz")
        try:
            size = os.path.getsize(npz_path)
            if size != manifest["size"]:
                raise ValueError(f"{size} bytes, the manifest says {manifest['size']}")
            if _sha256_of_file(npz_path) != manifest["sha256"]:
                raise ValueError("its sha256 differs from the manifest's")
            arrays = {}
            with np.load(npz_path, allow_pickle=False) as npz:
                expected_keys = set()
                for group, specs in manifest["variables"].items():
                    arrays[group] = []
                    for index, spec in enumerate(specs):
                        key = f"{group}.{index}"
                        expected_keys.add(key)
                        array = npz[key]
                        if variable_spec(spec["path"], array) != spec:
                            raise ValueError(f"array {key} differs from its manifest entry")
                        arrays[group].append(array)
                if set(npz.files) != expected_keys:
                    raise ValueError("its arrays differ from the manifest's list")
        except _READ_ERRORS as error:
            raise CorruptCheckpointError(
                f"Checkpoint {npz_path} is corrupt ({error})."
            ) from error
        return Checkpoint(name, manifest, arrays)


def flatten(value, prefix=""):
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (the dotted keys errors name)."""
    if isinstance(value, dict) and value:
        flat = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value}


ABSENT = "<absent>"


def differences(a, b):
    """`[(dotted key, value in a, value in b)]` for every leaf that differs
    between two nested dicts (None is an empty dict), keys sorted; a key that
    one side lacks reads `ABSENT` there. Used for checkpoint fingerprints and
    for the recipe of a run directory (`keras-attn train`)."""
    a, b = flatten(a or {}), flatten(b or {})
    return [
        (key, a.get(key, ABSENT), b.get(key, ABSENT))
        for key in sorted(set(a) | set(b))
        if a.get(key, ABSENT) != b.get(key, ABSENT)
    ]


def fingerprint_differences(saved, current):
    """Dotted keys whose values differ, as `key: checkpoint X, now Y` lines."""
    return [f"{key}: checkpoint {there!r}, now {here!r}"
            for key, there, here in differences(saved, current)]


def _castable(array, dtype):
    """Integer variables may change integer dtype (the seed-generator state is
    int64 on TensorFlow and uint32 on JAX) when every value fits."""
    source, target = np.dtype(array.dtype), np.dtype(dtype)
    if source == target:
        return True
    if source.kind not in "iu" or target.kind not in "iu":
        return False
    info = np.iinfo(target)
    return array.size == 0 or (array.min() >= info.min and array.max() <= info.max)


def _within_model(path):
    """`'sequential_3/dense/kernel'` -> `'dense/kernel'`."""
    return path.split("/", 1)[-1]


def check_group(checkpoint, group, variables, label, limit=5):
    """Raises `ValueError` naming every variable of `group` whose count, shape
    or dtype differs between `checkpoint` and `variables` (by position)."""
    specs = checkpoint.specs(group) or []
    # A sharded checkpoint's arrays are read after the check: its manifest's
    # dtypes stand for them (empty, so an integer dtype's range passes).
    arrays = checkpoint.arrays.get(group) or [np.empty(0, spec["dtype"]) for spec in specs]
    source = f"Checkpoint {checkpoint.file}"
    if len(specs) != len(variables):
        common = min(len(specs), len(variables))
        hint = (f" The first {common} match; the first {label} of the "
                f"{'checkpoint' if len(specs) > common else 'model'} beyond them is "
                f"'{(specs[common]['path'] if len(specs) > common else variables[common].path)}'.")
        for index, (spec, variable) in enumerate(zip(specs, variables)):
            # The model's own name (`sequential_3/...`) is not compared: it
            # differs between two builds in one session.
            if (_within_model(spec["path"]) != _within_model(variable.path)
                    or tuple(spec["shape"]) != tuple(variable.shape)):
                hint = (
                    f" The first difference is {label} {index}: '{spec['path']}' "
                    f"{tuple(spec['shape'])} in the checkpoint, '{variable.path}' "
                    f"{tuple(variable.shape)} in the model."
                )
                break
        raise ValueError(
            f"{source} does not match the model: it holds {len(specs)} {label}s, "
            f"the model has {len(variables)}.{hint}"
        )
    problems = []
    for index, (spec, array, variable) in enumerate(zip(specs, arrays, variables)):
        dtype = keras.backend.standardize_dtype(variable.dtype)
        if tuple(spec["shape"]) != tuple(variable.shape) or not _castable(array, dtype):
            problems.append(
                f"{label} {index} is '{spec['path']}' {tuple(spec['shape'])} "
                f"{spec['dtype']} in the checkpoint and '{variable.path}' "
                f"{tuple(variable.shape)} {dtype} in the model"
            )
    if problems:
        more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
        raise ValueError(
            f"{source} does not match the model: " + "; ".join(problems[:limit]) + more + "."
        )


def check_fingerprint(checkpoint, fingerprint):
    differences = fingerprint_differences(checkpoint.manifest.get("fingerprint"), fingerprint)
    if differences:
        raise ValueError(
            f"Checkpoint {checkpoint.file} was written with another `fingerprint`: "
            + "; ".join(differences)
            + "."
        )


def assign_group(checkpoint, group, variables):
    """Assigns the arrays of `group` to `variables`; call `check_group` first."""
    for array, variable in zip(checkpoint.arrays[group], variables):
        variable.assign(array.astype(keras.backend.standardize_dtype(variable.dtype)))


def read_group(variables):
    """`[(path, np.ndarray), ...]` of the current values."""
    # `convert_to_numpy(v)`, not `(v.value)`: under tf.distribute a metric
    # total is a SyncOnReadVariable whose `.value` NumPy cannot read; read
    # through the Keras variable it is the sum over the replicas.
    return [(v.path, keras.ops.convert_to_numpy(v)) for v in variables]
