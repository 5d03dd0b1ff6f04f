"""Prepared data: a recipe's batches made once where TensorFlow is installed,
then trained from where it is not (a GPU machine with JAX or PyTorch only).

```
keras-attn prepare vit_tiny_digits --out prepared/vit     # needs TensorFlow
keras-attn train vit_tiny_digits --data prepared/vit      # does not
```

What a directory holds:

```
prepared.json        the format, the recipe's data-defining keys, the task's
                     sizes (classes, vocabulary), every file's size and SHA-256
                     (a pass's: with its arrays' stored dtypes and the SHA-256
                     of its batch sizes, shapes and block digests, `meta_sha256`),
                     and its own SHA-256 (`manifest_sha256`)
train-0000.npz ...   epoch e's training batches, as the tf.data pipeline made them
validation.npz       the validation batches (when the recipe has them)
test.npz             the test batches (translation: its sources and references
                     are in tables.npz, decoded and scored with BLEU)
tables.npz           what a task stores once
```

Each pass's `.npz` holds the batches of one pass laid end to end (`sizes`:
the rows of each batch; batches of varying width, as a length bucket each,
are padded to the widest and cut back to their own `shape/<part>` when
read) in the narrowest integer type that holds their values; they are read
back in the pipeline's dtypes. A pass is stored as blocks of rows (format
3): each batch cut into blocks of `block_rows` rows (its last one shorter;
the fewest rows, a power of two, whose bytes reach `BLOCK_BYTES`, 4 KiB),
each block (its rows of every array) compressed with zlib on its own, the
blocks end to end in an uncompressed `.npz` member (`blocks`, at a fixed
offset in the file) beside the end (`block_ends`) and the SHA-256
(`block_sha256`) of each, so that a process can read some blocks of a pass
and check exactly those. Format 2 (still read) compressed each file whole
and is checked file by file. Blocks compress less than whole files: the
small recipes' directories are 1.0x to 1.6x their size in format 2 (listed
in docs/zoo.md), where the arrays stored uncompressed for the same purpose
made them up to 4.6x (bert_tiny_pydoc: 3.0 -> 14 MiB). `tables.npz` holds
what a task stores once (the digits the augmented batches index, the
translation test set, a packed speech run's rows, which each epoch's
batches list by `row`: the features float32, as the twin trains on them,
once rather than once an epoch). The
training batches of every epoch are stored (an epoch is a pure function of
the recipe and the epoch: `Task.train_dataset_fn`), so a run from prepared
files sees the batches of a run from tf.data, the masks and orders
included, and resumes exactly as it does (`ResumableTrainer`:
`Batches.skip`). What would make them large is stored compactly: image
augmentation as the source pixels (uint8) and one projective transform per
image (drawn by the same stateless TensorFlow ops), applied when the batch
is read with `keras.ops.image.affine_transform` (equal on TensorFlow;
within 1e-4 of 255 on JAX and PyTorch).

Several processes (a data-parallel JAX job, `train(..., distribute=True)`
as N processes): process k of N reads, of every training and validation
batch, only the rows it feeds, those that process k feeds from tf.data
(`batch_rows`: the batch filled up to a multiple of the job's devices with
its own first rows, as `even_batches`, then rows k/N to (k+1)/N, as
`process_rows`), so the global batch and the examples of each step are
those of one process with the job's devices (a batch they do not divide is
filled up, on one process as on several, and its filler rows made to count
for nothing: `batch_kept`, `Task.weightless_rows`). It reads the batch
sizes, shapes and block ends and digests whole and checks them against the manifest's `meta_sha256`, then
reads the blocks that hold its rows (each run of adjacent blocks at once,
no other block) and checks each against its SHA-256 before decompressing
it: a damaged block refuses the process that reads it, naming the file and
the rows, before the first step, and the others stop with it (`_agreed`:
whether any process refused its share is gathered on all). Where a
process's share of a batch is a multiple of the pass's `block_rows` it
reads its rows alone; otherwise also the other rows of the blocks its share
begins or ends in (small rows make blocks of a whole batch: every process
reads the batch). `tables.npz` (which the rows of every process index) is
read and checked whole by every process, `test.npz` by process 0 (which
alone evaluates). A directory of format 2 is read whole by every process,
each file checked whole, and each keeps its rows.

Why Keras's `PyDataset` and not grain with array_record: the prepared data
of the small recipes is a few MiB that fits in memory, read in order, batch
by batch; `PyDataset` is what `Model.fit` reads on every backend with no
dependency beyond Keras, and NumPy's `.npz` keeps the files readable
anywhere. grain's strengths (random access into large record files, worker
processes) are for data sets this path does not serve yet (tfds sets larger
than memory).

Nothing reaches a training step unchecked: opening a directory checks the
format, the manifest's own SHA-256 (`manifest_sha256`: of its canonical JSON,
every key but that one), that it was prepared for this recipe (the
data-defining keys, the epochs and steps, against the recipe and overrides
`train` was given), that every file is there with its size and SHA-256
(a process of several: of the files it reads whole; of the passes, the
blocks it reads, as above), then, as each file is read, that its arrays
are the ones the manifest lists in dtypes `prepare` could have written,
and every batch of every file (of those read: a process of several checks
its rows) and the batch rows stored once against what the model accepts
(`GuardedModel.check_inputs` / `check_labels`: ids, labels, masks,
lengths; `index` and `row` within what they point at; the task's own
checks: packed segment ids and positions, labels each utterance can
emit), all before the first step.

What the checksums protect against: a manifest or a data file damaged
(truncated, a flipped bit) or edited by hand (`num_classes`, a dtype, an
array) is refused, naming the file, never silently used. What they cannot:
the digests are unkeyed, so someone who edits the data deliberately and
computes every digest again (the files' and the manifest's) makes a
directory that passes them; what then still stands between such data and a
training step are the checks of the batches against the recipe's model
(ids, labels, masks, lengths, `index` rows) and the task's own (the speech
synthesised again must be the prepared speech). Prepared data from an
untrusted source is not made trustworthy by these checks: prepare it again.

`prepare` writes a new directory or replaces an empty one or an earlier
prepared directory (its manifest and only the files `prepare` writes); it
refuses any other directory, which it leaves as it is.
"""

import hashlib
import json
import os
import re
import struct
import zipfile
import zlib

import keras
import numpy as np

from keras_attn._directories import DirectoryKind
from keras_attn._directories import check_replaceable
from keras_attn._directories import replace_directory

MANIFEST = "prepared.json"
# 2: the manifest holds `manifest_sha256`, its own digest (format 1 had none).
# 3: the passes stored as compressed blocks of rows, each with its SHA-256,
# so that a process of a multi-process job reads and checks only its rows.
FORMAT = 3
# The formats `PreparedData` reads (2: every file read and checked whole).
READABLE_FORMATS = (2, 3)
# The formats of directories `prepare` may replace (earlier ones included).
REPLACEABLE_FORMATS = (1, 2, 3)
MANIFEST_DIGEST = "manifest_sha256"
# The bytes of a block of a pass (format 3), about: a batch is stored as
# blocks of rows (its last one shorter), each compressed on its own, of the
# fewest rows (a power of two) that hold this many bytes uncompressed
# (`_block_rows`): smaller blocks compress worse and cost a digest each.
BLOCK_BYTES = 4096
# The members of a pass file (format 3) besides `sizes` and `shape/<part>`:
# the compressed blocks end to end (uint8), the end of each in it, and the
# SHA-256 of each (its compressed bytes).
BLOCKS, BLOCK_ENDS, BLOCK_DIGESTS = "blocks", "block_ends", "block_sha256"
# The names of the files `prepare` writes into a directory.
_PREPARED_FILE = re.compile(r"(train-\d{4}|validation|test|tables)\.npz")
# The recipe keys that decide the batches (and the translation test set): a
# directory prepared with other values is refused. The rest (optimizer,
# schedule, precision, checkpoints, XLA, the search) may change between
# `prepare` and `train`.
# `data.packing` is part of `data`; named before it so that a directory
# prepared packed for an unpacked run (or the reverse) is refused by that name.
DATA_KEYS = ("family", "task", "model", "data.packing", "data", "training.seed",
             "training.batch_size", "training.epochs", "training.steps_per_epoch",
             "evaluation.max_examples")


def _data_keys(recipe):
    """`{dotted key: value}` of the recipe's DATA_KEYS."""
    from keras_attn.zoo.recipe import fingerprint

    found = fingerprint(recipe)
    values = {}
    for key in DATA_KEYS:
        value = found
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        values[key] = value
    return json.loads(json.dumps(values))


def _flatten(batch):
    """`{"x/token_ids": array, "x/0": array, "y": array, ...}` of an `(x, y[,
    sample_weight])` batch (each part an array, a dict or a tuple of arrays)
    or of a dict with those parts and extra ones."""
    names = ("x", "y", "sample_weight")
    parts = dict(zip(names, batch)) if isinstance(batch, (tuple, list)) else dict(batch)
    flat = {}
    for part, value in parts.items():
        if isinstance(value, dict):
            for key, leaf in value.items():
                flat[f"{part}/{key}"] = np.asarray(leaf)
        elif isinstance(value, (tuple, list)):
            for index, leaf in enumerate(value):
                flat[f"{part}/{index}"] = np.asarray(leaf)
        else:
            flat[part] = np.asarray(value)
    return flat


def _unflatten(flat):
    """The inverse of `_flatten` (parts whose leaves are 0, 1, ... are tuples)."""
    parts = {}
    for key, value in flat.items():
        part, _, leaf = key.partition("/")
        if leaf:
            parts.setdefault(part, {})[leaf] = value
        else:
            parts[part] = value
    for part, value in parts.items():
        if isinstance(value, dict) and all(key.isdigit() for key in value):
            parts[part] = tuple(value[str(i)] for i in range(len(value)))
    return parts


def _narrow(array):
    """The array in the narrowest integer type that holds its values (ids,
    masks, labels); other arrays as they are."""
    if array.dtype.kind not in "iu" or array.size == 0:
        return array
    low, high = int(array.min()), int(array.max())
    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return array.astype(dtype)
    return array


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sources(recipe):
    """`{relative name: SHA-256}` of every file a `files:` recipe reads (its
    folder walked, or the one file it names), or None for other datasets:
    what `prepare` made its batches from, so that a run can tell when those
    files changed since (it would otherwise train on the stale snapshot)."""
    from keras_attn.zoo import schema

    dataset = recipe["data"]["dataset"]
    if schema.dataset_kind(dataset) != "files":
        return None
    path = schema.files_path(dataset)
    if not os.path.isdir(path):
        return {os.path.basename(path): _sha256(path)}
    found = {}
    for root, folders, names in os.walk(path):
        folders.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            found[os.path.relpath(full, path).replace(os.sep, "/")] = _sha256(full)
    return found


def _check_sources(manifest, recipe, directory):
    """Refuses prepared data whose `files:` source files changed after
    `prepare` (edited, added or removed). Where the source is not on this
    machine (prepared data carried to another one, its purpose) there is
    nothing to compare, and the snapshot is what trains."""
    from keras_attn.zoo import schema

    recorded = manifest.get("sources")
    dataset = recipe["data"]["dataset"]
    if recorded is None or schema.dataset_kind(dataset) != "files" \
            or not os.path.exists(schema.files_path(dataset)):
        return
    now = _sources(recipe)
    changed = sorted(name for name in set(recorded) | set(now)
                     if recorded.get(name) != now.get(name))
    if changed:
        what = [f"{name} ({'added' if name not in recorded else 'removed' if name not in now else 'edited'})"  # noqa: E501
                for name in changed[:5]]
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ValueError(
            f"{directory} was prepared from other contents of {schema.files_path(dataset)}: "
            f"{', '.join(what)}{more} since `prepare` read them, so the prepared batches "
            f"are stale. Prepare the data again (`keras-attn prepare`). "
            f"Received: data={directory!r}")


def _manifest_digest(manifest):
    """The SHA-256 of the manifest's canonical JSON (sorted keys, no
    spaces), every key but `manifest_sha256` itself."""
    body = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _seal(manifest):
    """The manifest with its `manifest_sha256`."""
    body = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST}
    return dict(body, **{MANIFEST_DIGEST: _manifest_digest(body)})


def _foreign_reason(directory):
    """Why `directory` (an existing directory) is not one `prepare` may
    replace: None when it is empty or an earlier prepared directory (a
    manifest of a known format and only files `prepare` writes)."""
    entries = sorted(os.listdir(directory))
    if not entries:
        return None
    if MANIFEST not in entries:
        return f"it has no {MANIFEST}"
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        return f"its {MANIFEST} cannot be read as JSON ({error})"
    if (not isinstance(manifest, dict) or type(manifest.get("format")) is not int
            or manifest["format"] not in REPLACEABLE_FORMATS):
        found = manifest.get("format") if isinstance(manifest, dict) else None
        return f"its {MANIFEST} has no prepared-data format (format: {found!r})"
    for entry in entries:
        path = os.path.join(directory, entry)
        if entry != MANIFEST and not _PREPARED_FILE.fullmatch(entry):
            return f"`prepare` does not write {entry!r}"
        if os.path.islink(path) or not os.path.isfile(path):
            return f"{entry!r} is not a plain file"
    return None


PREPARED = DirectoryKind("a directory written by `keras-attn prepare`", _foreign_reason,
                         replaceable="an earlier one written by `keras-attn prepare`",
                         aside_prefix=".prepare-old-")


# What `prepare` writes: an earlier prepared directory is replaced, any other
# non-empty one refused (`keras_attn._directories`).
def _check_replaceable(output):
    check_replaceable(output, PREPARED, "output")


def _write_pass(path, batches):
    """Writes one pass (a list of flat batches) to `path` atomically; returns
    its manifest entry (`dtypes`: the pipeline's dtype of each part)."""
    if not batches:
        raise ValueError(f"Nothing to prepare for {os.path.basename(path)}: no batches.")
    keys = sorted(batches[0])
    for index, batch in enumerate(batches):
        if sorted(batch) != keys:
            raise ValueError(f"Batch {index} of {os.path.basename(path)} has parts "
                             f"{sorted(batch)}, the first {keys}.")
        for key in keys:
            if batch[key].ndim != batches[0][key].ndim:
                raise ValueError(f"Batch {index} of {os.path.basename(path)} has `{key}` of "
                                 f"shape {batch[key].shape}, the first {batches[0][key].shape}.")
    arrays, shapes = {}, {}
    for key in keys:
        leaves = [batch[key] for batch in batches]
        widest = np.max([leaf.shape[1:] for leaf in leaves], axis=0).astype(int).tolist() \
            if leaves[0].ndim > 1 else []
        if any(list(leaf.shape[1:]) != widest for leaf in leaves):
            # Padded batches of varying width (a length bucket each): stored
            # padded to the widest, each batch's own shape kept beside.
            shapes[f"shape/{key}"] = np.array([leaf.shape[1:] for leaf in leaves], "int64")
            leaves = [np.pad(leaf, [(0, 0)] + [(0, w - n) for n, w in zip(leaf.shape[1:], widest)])
                      for leaf in leaves]
        arrays[key] = np.concatenate(leaves)
    sizes = np.array([len(batch[keys[0]]) for batch in batches], "int64")
    return dict(_write_arrays(path, arrays, rows=True, sizes=sizes, **shapes),
                batches=len(batches), rows=int(sizes.sum()),
                varying=sorted(key[len("shape/"):] for key in shapes))


def _write_arrays(path, arrays, rows=False, **extra):
    """`arrays` (narrowed) and `extra` to `path` atomically; returns the
    manifest entry (`dtypes`, `shapes`: of each array as given).

    `rows`: a pass (`extra` holds its `sizes`), written as blocks of rows
    (`_blocks`) in an uncompressed `.npz`, so that a reader can take some
    blocks alone; the entry adds `stored` (each array's stored dtype),
    `block_rows` and `meta_sha256` (of every member but the blocks, which a
    reader of some rows reads whole). Otherwise the arrays themselves,
    compressed (`tables.npz`, read whole)."""
    from keras_attn.training.checkpoints import atomic_write

    narrowed = {key: _narrow(np.asarray(array)) for key, array in arrays.items()}
    entry = {}
    if rows:
        block_rows = _block_rows(narrowed)
        blocks, ends, digests = _blocks(narrowed, extra["sizes"], block_rows)
        meta = dict(extra, **{BLOCK_ENDS: ends, BLOCK_DIGESTS: digests})
        entry = {"stored": {key: array.dtype.str for key, array in narrowed.items()},
                 "block_rows": block_rows, "meta_sha256": _arrays_digest(meta)}
        members = dict(meta, **{BLOCKS: blocks})
        atomic_write(path, lambda stream: np.savez(stream, **members))
    else:
        atomic_write(path, lambda stream: np.savez_compressed(stream, **extra, **narrowed))
    return dict({
        "file": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "sha256": _sha256(path),
        "dtypes": {key: str(np.asarray(array).dtype) for key, array in arrays.items()},
        "shapes": {key: list(np.shape(array)) for key, array in arrays.items()},
    }, **entry)


def _block_starts(sizes, block_rows):
    """The first row of each block of a pass whose batches have `sizes`
    rows (blocks of `block_rows` rows within each batch), and the pass's
    row count after them."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("int64")
    starts = [np.arange(start, end, block_rows) for start, end in zip(offsets, offsets[1:])]
    return np.concatenate(starts + [offsets[-1:]])


def _block_rows(arrays):
    """The rows of a block of the pass `arrays`: the fewest, a power of
    two, whose bytes (in every array) reach `BLOCK_BYTES`."""
    row_bytes = sum(array.dtype.itemsize * int(np.prod(array.shape[1:]))
                    for array in arrays.values())
    rows = 1
    while rows * row_bytes < BLOCK_BYTES:
        rows *= 2
    return rows


def _blocks(arrays, sizes, block_rows):
    """`(blocks, ends, digests)`: each block of `block_rows` rows of a pass
    (its rows of every array, by sorted key, in C order) compressed with
    zlib, end to end (uint8); the end of each; the SHA-256 of each."""
    keys = sorted(arrays)
    starts = _block_starts(sizes, block_rows)
    compressed = [zlib.compress(b"".join(np.ascontiguousarray(arrays[key][start:end]).tobytes()
                                         for key in keys))
                  for start, end in zip(starts[:-1], starts[1:])]
    digests = np.array([np.frombuffer(hashlib.sha256(block).digest(), np.uint8)
                        for block in compressed]).reshape(len(compressed), 32)
    ends = np.cumsum([len(block) for block in compressed]).astype("int64")
    return np.frombuffer(b"".join(compressed), np.uint8), ends, digests


def _unblock(file, entry, blocks, rows):
    """`{key: array in the stored dtype}` of the rows of `blocks` (the
    compressed blocks, holding `rows[i]` rows each), decompressed and split
    by the manifest's `stored` dtypes and `shapes`."""
    keys = sorted(entry["stored"])
    dtypes = {key: np.dtype(entry["stored"][key]) for key in keys}
    widths = {key: tuple(entry["shapes"][key][1:]) for key in keys}
    row_bytes = {key: dtypes[key].itemsize * int(np.prod(widths[key])) for key in keys}
    parts = {key: [] for key in keys}
    for block, count in zip(blocks, rows):
        try:
            data = zlib.decompress(block)
        except zlib.error as error:
            raise ValueError(f"Prepared file {file}: a block cannot be decompressed ({error}).")
        if len(data) != count * sum(row_bytes.values()):
            raise ValueError(f"Prepared file {file}: a block of {count} rows holds "
                             f"{len(data)} bytes, not the {count * sum(row_bytes.values())} "
                             f"of its rows.")
        at = 0
        for key in keys:
            size = count * row_bytes[key]
            parts[key].append(np.frombuffer(data[at:at + size], dtypes[key])
                              .reshape((count,) + widths[key]))
            at += size
    return {key: np.concatenate(parts[key]) if parts[key]
            else np.empty((0,) + widths[key], dtypes[key]) for key in keys}


def _read_file(file, entry):
    """`({key: array as stored}, {member: array} of the rest: sizes,
    shapes)` of a whole prepared file (a pass stored as blocks where its
    manifest `entry` says so: decompressed)."""
    with np.load(file, allow_pickle=False) as stored:
        members = {key: stored[key] for key in stored.files}
    if "block_rows" not in entry:
        arrays = {key: members.pop(key) for key in entry["dtypes"] if key in members}
        return arrays, members
    sizes = members.get("sizes")
    _check_sizes(file, entry, sizes)
    ends, blocks = members.pop(BLOCK_ENDS, None), members.pop(BLOCKS, None)
    members.pop(BLOCK_DIGESTS, None)
    starts = _block_starts(sizes, entry["block_rows"])
    if (ends is None or blocks is None or ends.shape != starts[1:].shape
            or np.any(np.diff(ends, prepend=0) < 0) or ends[-1] != blocks.size):
        raise ValueError(f"Prepared file {file}: its blocks do not match its batch sizes.")
    blocks = blocks.tobytes()
    begins = np.concatenate([[0], ends[:-1]])
    return _unblock(file, entry, [blocks[begin:end] for begin, end in zip(begins, ends)],
                    np.diff(starts)), members


def _arrays_digest(arrays):
    """The SHA-256 of `arrays` (name, dtype, shape and bytes of each, by
    name)."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}|{array.dtype.str}|{list(array.shape)}|".encode("utf-8"))
        digest.update(array.tobytes())
    return digest.hexdigest()


def _collect(dataset, limit=None):
    batches = []
    for batch in dataset:
        batches.append(_flatten(batch))
        if limit is not None and len(batches) == limit:
            break
    return batches


def prepare(recipe, overrides=(), output=None, verbose=True):
    """Writes a recipe's batches (every training epoch, validation, test) to
    `output` (default `prepared/<recipe name>`), for `train(..., data=output)`
    on a machine without TensorFlow. Needs TensorFlow (the tf.data pipelines).

    Args:
        recipe: a recipe file or a zoo recipe name.
        overrides: `"dotted.key=value"` strings, as for `train`; `train` must
            be given the same ones (for the data-defining keys).
        output: the directory: a new one, an empty one, or an earlier
            prepared directory (replaced once the new one is complete).
            Any other directory is refused and left as it is.
        verbose: print a line per file.

    Returns:
        The manifest (a dict; also `<output>/prepared.json`), with `output`.

    Raises:
        ValueError: a bad recipe or override, data that cannot be prepared
            yet (a tfds speech set), an output that is a file, a symbolic
            link, or a non-empty directory `prepare` did not write (the
            message names what it holds).
    """
    import shutil
    import tempfile

    from keras_attn.training.checkpoints import atomic_write_json
    from keras_attn.zoo.recipe import load_recipe
    from keras_attn.zoo.tasks import make_task
    from keras_attn._base.zoo_files import locate_recipe

    recipe = load_recipe(locate_recipe(recipe), overrides)
    task = make_task(recipe)
    task.check_preparable()
    output = output or os.path.join("prepared", recipe["name"])
    _check_replaceable(output)  # before the work, and again before replacing
    task.prepare()
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    # A new directory of its own (never one that was there): removed below.
    staging = tempfile.mkdtemp(prefix=".prepare-" + os.path.basename(os.path.abspath(output))
                               + "-", dir=parent)
    try:
        steps, epochs = task.steps_per_epoch, recipe["training"]["epochs"]
        files = {}
        for epoch in range(epochs):
            batches = _collect(task.prepared_batches("train", epoch), limit=steps)
            if len(batches) < steps:
                raise ValueError(f"Epoch {epoch} has {len(batches)} batches, fewer than "
                                 f"steps_per_epoch={steps}.")
            files[f"train-{epoch:04d}"] = _write_pass(
                os.path.join(staging, f"train-{epoch:04d}.npz"), batches)
            if verbose:
                entry = files[f"train-{epoch:04d}"]
                print(f"epoch {epoch + 1}/{epochs}: {entry['batches']} batches, "
                      f"{entry['bytes'] / 2**20:.2f} MiB", flush=True)
        tables = task.prepared_tables()
        if tables:
            files["tables"] = _write_arrays(os.path.join(staging, "tables.npz"), tables)
        for split in ("validation", "test"):
            dataset = task.prepared_batches(split)
            if dataset is not None:
                files[split] = _write_pass(os.path.join(staging, f"{split}.npz"),
                                           _collect(dataset))
        manifest = {
            "format": FORMAT,
            "recipe": _data_keys(recipe),
            "name": recipe["name"],
            "task": task.name,
            "steps_per_epoch": steps,
            "epochs": epochs,
            "state": task.prepared_state(),
            "files": files,
        }
        sources = _sources(recipe)
        if sources is not None:
            manifest["sources"] = sources
        manifest = _seal(manifest)
        atomic_write_json(os.path.join(staging, MANIFEST), manifest)
        _replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(entry["bytes"] for entry in files.values())
    if verbose:
        print(f"{recipe['name']}: {len(files)} files, {total / 2**20:.2f} MiB in {output}",
              flush=True)
    return dict(manifest, output=output)


def _replace(staging, output):
    """Moves the complete directory `staging` to `output` (checked again: it
    may have changed while the batches were made)."""
    replace_directory(staging, output, PREPARED, "output")


class PreparedData:
    """A prepared directory, checked against a recipe (see the module
    docstring). Raises `ValueError` naming the file and what is wrong: no
    directory or manifest, another format, a manifest edited or damaged
    (its `manifest_sha256`) or missing what `prepare` writes, another
    recipe (the first differing key, the epochs, the steps), a missing
    file, one of another size or checksum (truncated or edited), or one
    whose arrays do not match its manifest (their shapes, a dtype `prepare`
    would not have written).

    As process k of N (`process=(k, N)`, a multi-process data-parallel
    job), the training and validation passes are read by rows: each
    process reads and checks only the rows it feeds (`batch_rows`), in a
    directory of format 3 from the files themselves (the blocks of rows
    that hold them, each against its SHA-256; the batch sizes, shapes and
    block digests against the manifest's `meta_sha256`), in one of format
    2 from every file read and checked whole. The test pass (evaluated by
    process 0 alone) and `tables.npz` (which rows of every process index)
    are read and checked whole.

    Args:
        directory: the output of `prepare`.
        recipe: the resolved recipe to train.
        process: `(index, count)` of this process in its job; `(0, 1)`
            for one process. The recipe's batch size must divide by the
            count (each process feeds an equal share of every batch).
    """

    def __init__(self, directory, recipe, process=(0, 1)):
        self.directory = directory
        self.process = _check_process(process, recipe)
        # What one process refuses stops every process of the job.
        _agreed(self.process, directory, lambda: self._open(recipe))

    def _open(self, recipe):
        directory = self.directory
        path = os.path.join(directory, MANIFEST)
        if not os.path.isfile(path):
            raise ValueError(
                f"`data` must be a directory written by `keras-attn prepare`; "
                f"{directory} has no {MANIFEST}. Received: data={directory!r}"
            )
        try:
            with open(path, encoding="utf-8") as stream:
                manifest = json.load(stream)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} cannot be read ({error}). Received: data={directory!r}"
                             ) from None
        if (not isinstance(manifest, dict) or type(manifest.get("format")) is not int
                or manifest["format"] not in READABLE_FORMATS):
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ValueError(f"{path} is prepared data of format {found!r}; this keras_attn "
                             f"reads formats {READABLE_FORMATS[0]} to {FORMAT}. Prepare the "
                             f"data again (`keras-attn prepare`). Received: data={directory!r}")
        if manifest.get(MANIFEST_DIGEST) != _manifest_digest(manifest):
            raise ValueError(
                f"{path} is not the manifest `prepare` wrote: its {MANIFEST_DIGEST} "
                f"{manifest.get(MANIFEST_DIGEST)!r} is not the SHA-256 of its content "
                f"({_manifest_digest(manifest)}): edited or damaged. Prepare the data again. "
                f"Received: data={directory!r}"
            )
        _check_layout(path, manifest, directory)
        ours = _data_keys(recipe)
        theirs = manifest.get("recipe", {})
        for key in DATA_KEYS:
            if theirs.get(key) != ours[key]:
                raise ValueError(
                    f"{directory} was prepared for another recipe: `{key}` is "
                    f"{theirs.get(key)!r} there and {ours[key]!r} here. Prepare it again "
                    f"with this recipe and overrides (`keras-attn prepare`). "
                    f"Received: data={directory!r}"
                )
        # What the run reads from the manifest (the files of each epoch, the
        # steps) is the recipe's too (training.steps_per_epoch unset: one
        # pass over the prepared training data).
        training = recipe.get("training", {})
        for key, theirs, ours in (
                ("epochs", manifest["epochs"], training.get("epochs")),
                ("steps_per_epoch", manifest["steps_per_epoch"],
                 training.get("steps_per_epoch") or manifest["state"].get("batches_per_epoch"))):
            if theirs != ours:
                raise ValueError(
                    f"{directory} was prepared for another recipe: {path} holds {key}="
                    f"{theirs!r}, the recipe `training.{key}` is {ours!r}. Prepare it again "
                    f"with this recipe and overrides. Received: data={directory!r}")
        _check_sources(manifest, recipe, directory)
        self.manifest = manifest
        self.files = manifest["files"]
        expected = [f"train-{epoch:04d}" for epoch in range(manifest["epochs"])]
        for name in expected:
            if name not in self.files:
                raise ValueError(f"{path} lists no `{name}` file. Received: data={directory!r}")
            if self.files[name].get("batches") != manifest["steps_per_epoch"]:
                raise ValueError(f"{path} lists {self.files[name].get('batches')!r} batches "
                                 f"of `{name}`, not steps_per_epoch="
                                 f"{manifest['steps_per_epoch']}. Received: data={directory!r}")
        extra = sorted(name for name in self.files if name.startswith("train-")
                       and name not in expected)
        if extra:
            raise ValueError(f"{path} lists {extra}, beyond its {manifest['epochs']} epochs. "
                             f"Received: data={directory!r}")
        # Read by rows on this process (the rest read whole): the passes
        # the processes share out, where the format allows it.
        self._by_rows = set()
        if self.process[1] > 1 and manifest["format"] >= 3:
            self._by_rows = {name for name in self.files if _shared_out(name)}
        self._checked = set()  # the files checked whole
        self._meta = {}
        for name, entry in self.files.items():
            if name in self._by_rows:
                self._meta[name] = self._check_meta(name, entry)
            elif name != "test" or self.process[0] == 0:  # else checked if read
                self._check_file(name, entry)
        self._cache = {}
        self._tables = None
        self.bytes_read = 0  # of the passes read by rows (their arrays' rows)

    @property
    def state(self):
        return self.manifest["state"]

    @property
    def steps_per_epoch(self):
        return self.manifest["steps_per_epoch"]

    def _file(self, name):
        file = os.path.join(self.directory, self.files[name]["file"])
        if not os.path.isfile(file):
            raise ValueError(f"Prepared file {file} is missing. Received: data={self.directory!r}")
        return file

    def _check_file(self, name, entry):
        file = self._file(name)
        size = os.path.getsize(file)
        if size != entry["bytes"] or _sha256(file) != entry["sha256"]:
            raise ValueError(
                f"Prepared file {file} is not the file `prepare` wrote (size {size} bytes, "
                f"{entry['bytes']} written; or another SHA-256): truncated, edited or "
                f"replaced. Prepare the data again. Received: data={self.directory!r}"
            )
        self._checked.add(name)

    def _blocked(self, name):
        """Whether the pass `name` is stored as blocks of rows (format 3);
        its manifest entry checked for what reading them needs."""
        entry = self.files[name]
        if self.manifest["format"] < 3 or name == "tables":
            return False
        stored = entry.get("stored")
        valid = (isinstance(stored, dict) and set(stored) == set(entry["dtypes"])
                 == set(entry["shapes"]) and type(entry.get("block_rows")) is int
                 and entry["block_rows"] > 0
                 and isinstance(entry.get("meta_sha256"), str))
        if valid:
            try:
                valid = all(np.dtype(dtype).kind in "biuf" for dtype in stored.values())
            except TypeError:
                valid = False
        if not valid:
            raise ValueError(f"{os.path.join(self.directory, MANIFEST)} does not list how "
                             f"`{name}` is stored (`stored`, `block_rows`, `meta_sha256`). "
                             f"Prepare the data again. Received: data={self.directory!r}")
        return True

    def _check_meta(self, name, entry):
        """What a reader of some rows of a pass reads whole, checked against
        the manifest's `meta_sha256`: the batch sizes and shapes, the end
        and the SHA-256 of every block. Returns `(offset, meta)`: where the
        blocks start in the file, `{member: array}` of the rest."""
        file = self._file(name)
        self._blocked(name)
        problem = None
        try:
            members = _stored_members(file)
            with np.load(file, allow_pickle=False) as stored:
                meta = {key: stored[key] for key in stored.files if key != BLOCKS}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            problem = f" ({error}): truncated, edited or replaced"
        else:
            expected = {"sizes", BLOCK_ENDS, BLOCK_DIGESTS} | {
                f"shape/{key}" for key in entry.get("varying", ())}
            if _arrays_digest(meta) != entry["meta_sha256"] or set(meta) != expected:
                problem = ": its batch sizes, shapes or block digests are not the ones written"
            else:
                blocks = members.get(BLOCKS, (0, np.dtype("O"), ()))
                starts = _block_starts(meta["sizes"], entry["block_rows"])
                ends = meta[BLOCK_ENDS]
                if (blocks[1] != np.uint8 or len(blocks[2]) != 1 or ends.shape != starts[1:].shape
                        or np.any(np.diff(ends, prepend=0) < 0)
                        or (ends.size and ends[-1] != blocks[2][0])):
                    problem = ": its blocks are not the ones its manifest lists"
        if problem:
            raise ValueError(f"Prepared file {file} is not the file `prepare` wrote{problem}. "
                             f"Prepare the data again. Received: data={self.directory!r}")
        return members[BLOCKS][0], meta

    def _load(self, name):
        """`(file, {key: array in the written dtype}, sizes or None)`."""
        entry = self.files[name]
        if name not in self._checked:  # a file read only where it is needed
            self._check_file(name, entry)
        file = os.path.join(self.directory, entry["file"])
        self._blocked(name)
        arrays, extra = _read_file(file, entry)
        missing = sorted(set(entry["dtypes"]) - set(arrays))
        if missing:
            raise ValueError(f"Prepared file {file} holds no {missing}; its manifest "
                             f"lists them.")
        arrays = {key: _check_dtype(file, key, arrays[key], dtype)
                  for key, dtype in entry["dtypes"].items()}
        missing = sorted({f"shape/{key}" for key in entry.get("varying", ())} - set(extra))
        if missing:
            raise ValueError(f"Prepared file {file} holds no {missing}.")
        shapes = {key: extra[f"shape/{key}"] for key in entry.get("varying", ())}
        self._check_shapes(file, entry, arrays, shapes)
        return file, arrays, extra.get("sizes"), shapes

    @staticmethod
    def _check_shapes(file, entry, arrays, shapes):
        """The batch shapes of the varying parts within their arrays, and
        every array of the shape the manifest lists."""
        for key, shape in shapes.items():
            if shape.shape != (entry["batches"], arrays[key].ndim - 1) or np.any(
                    shape > np.asarray(arrays[key].shape[1:])):
                raise ValueError(f"Prepared file {file}: the batch shapes of `{key}` do not "
                                 f"fit its array {arrays[key].shape}.")
        for key, array in arrays.items():
            shape = entry["shapes"][key]
            if list(array.shape) != shape:
                raise ValueError(f"Prepared file {file}: `{key}` has shape {array.shape}, "
                                 f"not {tuple(shape)}.")

    @property
    def tables(self):
        if self._tables is None:
            self._tables = self._load("tables")[1] if "tables" in self.files else {}
        return self._tables

    def _arrays(self, name, replicas=1):
        """`(sizes, {key: array in the pipeline's dtype}, {key: batch
        shapes}, rows)` of one pass as this process reads it: `rows[b]`,
        the rows of the arrays that batch b feeds here (`batch_rows`)."""
        if (name, replicas) not in self._cache:
            process = self.process if _shared_out(name) else (0, 1)
            entry = self.files[name]
            if name in self._by_rows:
                sizes, arrays, shapes, rows = self._read_rows(name, replicas)
            else:
                file, arrays, sizes, shapes = self._load(name)
                _check_sizes(file, entry, sizes)
                rows = batch_rows(sizes, replicas, *process)
            # One pass in memory at a time.
            self._cache = {(name, replicas): (sizes, arrays, shapes, rows)}
        return self._cache[(name, replicas)]

    def _read_rows(self, name, replicas):
        """`_arrays` of a pass read by rows: only the blocks that hold rows
        this process feeds, each checked against its SHA-256."""
        entry = self.files[name]
        file = self._file(name)
        offset, meta = self._meta[name]
        sizes = meta["sizes"]
        _check_sizes(file, entry, sizes)
        wanted = batch_rows(sizes, replicas, *self.process)
        starts = _block_starts(sizes, entry["block_rows"])
        needed = np.unique(np.searchsorted(starts, np.concatenate(wanted), side="right") - 1)
        ends = meta[BLOCK_ENDS]
        begins = np.concatenate([[0], ends[:-1]])
        data = _read_ranges(file, offset, begins[needed], ends[needed])
        self.bytes_read += sum(len(block) for block in data)
        for block, found in zip(needed, data):
            if hashlib.sha256(found).digest() != meta[BLOCK_DIGESTS][block].tobytes():
                raise ValueError(
                    f"Prepared file {file} is not the file `prepare` wrote: rows "
                    f"{starts[block]} to {starts[block + 1] - 1} (a block that this process "
                    f"reads) are not the rows written (their SHA-256): damaged or edited. "
                    f"Prepare the data again. Received: data={self.directory!r}")
        stored = _unblock(file, entry, data, starts[needed + 1] - starts[needed])
        arrays = {key: _check_dtype(file, key, stored[key], dtype)
                  for key, dtype in entry["dtypes"].items()}
        shapes = {key: meta[f"shape/{key}"] for key in entry.get("varying", ())}
        read = np.concatenate([np.arange(starts[block], starts[block + 1]) for block in needed])
        # The shapes the manifest lists, but of the rows read.
        listed = dict(entry, shapes={key: [read.size] + shape[1:]
                                     for key, shape in entry["shapes"].items()})
        self._check_shapes(file, listed, arrays, shapes)
        rows = [np.searchsorted(read, batch) for batch in wanted]
        return sizes, arrays, shapes, rows

    def check(self, model, task=None, replicas=1):
        """Every batch of every file this process reads against what
        `model` accepts (the model's own checks on concrete arrays, and
        `task.check_prepared`); `ValueError` naming the file. `replicas`:
        the devices of the job, as for `batches`. In a job, every process
        calls it, and one's refusal stops them all."""
        _agreed(self.process, self.directory, lambda: self._check(model, task, replicas))

    def _check(self, model, task, replicas):
        for name in self.files:
            if name == "tables":
                parts = _unflatten(self.tables)
                if "x" not in parts:  # no batch rows (e.g. images an `index` points at)
                    continue
            elif name == "test" and self.process[0] != 0:
                continue  # evaluated by process 0 alone
            else:
                parts = _unflatten(self._arrays(name, replicas)[1])
            try:
                if name == "tables":  # batch rows stored once: each part of each row
                    _check_same_rows(parts)
                if "x" in parts:
                    model.check_inputs(parts["x"])
                model.check_labels(parts.get("y"))
                if "index" in parts:  # rows of the examples stored once
                    _check_index("index", parts["index"], self.state["index_rows"],
                                 "rows of the stored examples")
                if "row" in parts:  # rows of the batch rows stored once
                    _check_index("row", parts["row"], self._table_rows(),
                                 "rows of the batch rows in tables.npz")
                if task is not None:
                    task.check_prepared(parts, model)
            except ValueError as error:
                raise ValueError(
                    f"Prepared file {os.path.join(self.directory, self.files[name]['file'])}: "
                    f"{error}"
                ) from None

    def _table_rows(self):
        """The batch rows stored once in tables.npz (its `y`), which `row`
        parts index; 0 when it holds none."""
        return len(self.tables["y"]) if "y" in self.tables else 0

    def batches(self, split, epoch=None, finish=None, replicas=1, weightless=None):
        """The `Batches` of `"train"` (with `epoch`), `"validation"` or
        `"test"`; None for a split the recipe does not have. `finish(parts,
        tables)` (`Task.finish_prepared`) maps a stored batch's parts to the
        model's `(x, y[, sample_weight])`. `replicas`: the devices of the
        data-parallel job; each batch is filled up to a multiple of it (as
        `even_batches`), and of the training and validation batches this
        process gets its rows (`batch_rows`). `weightless(batch, keep)`
        (`Task.weightless_rows`), with `replicas` > 1: every finished
        batch with its filler rows (`keep` False, `batch_kept`) made to
        count for nothing, as `even_batches` makes them."""
        name = f"train-{epoch:04d}" if split == "train" else split
        if name not in self.files:
            if split == "train":
                raise ValueError(f"{self.directory} holds {self.manifest['epochs']} epochs; "
                                 f"epoch {epoch} was asked for.")
            return None
        sizes, arrays, shapes, rows = self._arrays(name, replicas)
        if finish is not None:
            tables = self.tables
            finished = lambda parts: finish(parts, tables)  # noqa: E731
        else:
            finished = None
        if weightless is not None and replicas > 1:
            process = self.process if _shared_out(name) else (0, 1)
            kept = batch_kept(sizes, replicas, *process)
            return Batches(sizes, arrays, finished, shapes=shapes, rows=rows,
                           weightless=lambda batch, index: weightless(batch, kept[index]))
        return Batches(sizes, arrays, finished, shapes=shapes, rows=rows)


def _agreed(process, directory, check):
    """Runs `check()` on this process of a job of several (`process`:
    `(index, count)`), where each reads and checks its own share of the
    data: whether any process refused its share (a `ValueError`) is
    gathered on every process (JAX's `multihost_utils.process_allgather`;
    every process must call it, in the same order), so that a refusal stops
    every process at once, by name, rather than leaving the others to wait
    for a process that has left the job. The refusing process raises its
    own error."""
    try:
        import jax

        joined = process[1] > 1 and jax.process_count() > 1
    except ImportError:
        joined = False
    if not joined:  # one process (or a test reading as process k alone)
        return check()
    from jax.experimental import multihost_utils

    error = None
    try:
        check()
    except ValueError as raised:
        error = raised
    refused = np.asarray(multihost_utils.process_allgather(
        np.array([error is not None], "int32"))).reshape(-1)
    if error is not None:
        raise error
    if refused.any():
        which = ", ".join(str(index) for index in np.flatnonzero(refused))
        raise ValueError(
            f"The prepared data of process {which} of {process[1]} was refused there (its "
            f"output names the file and what is wrong): every process of the job stops "
            f"before the first step (this is process {process[0]}). Prepare the data again "
            f"where it was damaged. Received: data={directory!r}")
    return None


def _shared_out(name):
    """Whether the processes of a job share out the batches of the file
    `name` (training and validation) rather than one reading it whole."""
    return name.startswith("train-") or name == "validation"


def _check_process(process, recipe):
    """`process` as `(index, count)`, checked: a valid index, a count that
    divides the recipe's (global) batch size."""
    try:
        index, count = (int(value) for value in process)
        valid = 0 <= index < count and tuple(process) == (index, count)
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError("Invalid value for argument `process`: it must be (index, count) "
                         f"with 0 <= index < count. Received: process={process!r}")
    batch_size = recipe.get("training", {}).get("batch_size")
    if count > 1 and (not isinstance(batch_size, int) or batch_size % count):
        raise ValueError(
            f"The global batch of {batch_size} rows cannot be shared out evenly over "
            f"{count} processes: each feeds an equal share of every batch. Make "
            f"`training.batch_size` a multiple of the process count (the prepared data "
            f"with it). Received: training.batch_size={batch_size!r} with {count} processes")
    return index, count


def _check_sizes(file, entry, sizes):
    if sizes is None or len(sizes) != entry["batches"] or int(sizes.sum()) != entry["rows"]:
        raise ValueError(f"Prepared file {file}: its batch sizes do not add up to "
                         f"its {entry['rows']} rows.")


def batch_rows(sizes, replicas=1, process=0, processes=1):
    """For each batch of a pass (`sizes`: the rows of each, laid end to end),
    the rows that process `process` of `processes` feeds: the batch filled
    up to a multiple of `replicas` with its own first rows again (as
    `keras_attn.zoo.tasks.base.even_batches`), cut into `processes` equal
    slices, slice `process` kept (as
    `keras_attn.training.distribute.process_rows`), so that the processes
    together feed the global batch that one process with `replicas`
    devices feeds.

    Batches of 4 and 3 rows over 2 devices, one a process: process 1 feeds
    rows 2 and 3 of the first, and of the second (rows 4 to 6, filled up to
    4 with its first row again: 4, 5, 6, 4) its last two.

    >>> [rows.tolist() for rows in batch_rows([4, 3], replicas=2, process=1, processes=2)]
    [[2, 3], [6, 4]]
    """
    if replicas % processes:
        raise ValueError(f"Invalid value for argument `replicas`: the devices of a job "
                         f"must divide evenly over its {processes} processes. "
                         f"Received: replicas={replicas}")
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("int64")
    rows = []
    for start, size in zip(offsets, np.asarray(sizes, "int64")):
        share = -(-int(size) // replicas) * replicas // processes
        rows.append(start + np.arange(process * share, (process + 1) * share) % size)
    return rows


def batch_kept(sizes, replicas=1, process=0, processes=1):
    """For each batch of a pass, a boolean per row that `batch_rows` gives
    process `process` of `processes`: True for the batch's own rows, False
    for the filler rows that fill it up to a multiple of `replicas` (which
    `Task.weightless_rows` makes count for nothing).

    >>> [kept.tolist() for kept in batch_kept([4, 3], replicas=2, process=1, processes=2)]
    [[True, True], [True, False]]
    """
    kept = []
    for size in np.asarray(sizes, "int64"):
        share = -(-int(size) // replicas) * replicas // processes
        kept.append(np.arange(process * share, (process + 1) * share) < size)
    return kept


def _stored_members(file):
    """`{key: (offset, dtype, shape)}` of the arrays of an uncompressed
    `.npz` (`np.savez`): where each array's data starts in the file, read
    from the zip's headers and the `.npy` headers, nothing else."""
    with zipfile.ZipFile(file) as archive:
        infos = archive.infolist()
    members = {}
    with open(file, "rb") as stream:
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"its member {info.filename!r} is not an uncompressed array")
            stream.seek(info.header_offset)
            local = stream.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"the header of its member {info.filename!r} is damaged")
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_length + extra_length
            stream.seek(start)
            version = np.lib.format.read_magic(stream)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"its member {info.filename!r} is of .npy version {version}")
            shape, fortran_order, dtype = read_header(stream)
            if fortran_order or dtype.hasobject:
                raise ValueError(f"its member {info.filename!r} is not a C-ordered array")
            if stream.tell() + dtype.itemsize * int(np.prod(shape)) > start + info.file_size:
                raise ValueError(f"its member {info.filename!r} is shorter than its array")
            members[info.filename[:-len(".npy")]] = (stream.tell(), dtype, tuple(shape))
    return members


def _read_ranges(file, offset, begins, ends):
    """The bytes `[begin, end)` after `offset` in `file` for each pair (in
    increasing order), each run of adjacent ranges read at once and nothing
    else."""
    found = []
    with open(file, "rb") as stream:
        index = 0
        while index < len(begins):
            last = index
            while last + 1 < len(begins) and begins[last + 1] == ends[last]:
                last += 1
            stream.seek(offset + int(begins[index]))
            data = stream.read(int(ends[last] - begins[index]))
            if len(data) != ends[last] - begins[index]:
                raise ValueError(f"Prepared file {file} is shorter than its blocks: truncated.")
            found += [data[begin - begins[index]:end - begins[index]]
                      for begin, end in zip(begins[index:last + 1], ends[index:last + 1])]
            index = last + 1
    return found


def _check_layout(path, manifest, directory):
    """`ValueError` unless the manifest has the fields `PreparedData` reads,
    each file entry naming its own file in the directory (`<name>.npz`)."""
    problem = None
    files = manifest.get("files")
    for key, kind in (("recipe", dict), ("state", dict), ("files", dict), ("epochs", int),
                      ("steps_per_epoch", int)):
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            problem = f"`{key}` is {manifest.get(key)!r}, not a {kind.__name__}"
            break
    else:
        for name, entry in files.items():
            fields = ("file", "bytes", "sha256", "dtypes", "shapes")
            if not isinstance(entry, dict) or any(field not in entry for field in fields):
                problem = f"the entry of `{name}` lacks one of {fields}"
            elif entry["file"] != f"{name}.npz" or not _PREPARED_FILE.fullmatch(entry["file"]):
                problem = f"the entry of `{name}` names the file {entry['file']!r}"
            if problem:
                break
    if problem:
        raise ValueError(f"{path} is not a manifest `prepare` writes: {problem}. "
                         f"Received: data={directory!r}")


def _check_dtype(file, key, stored, dtype):
    """The stored array `stored` read back as `dtype` (the manifest's): only
    as `prepare` writes it, that dtype itself or, for integers, a narrower
    integer type whose values `dtype` holds. A manifest whose dtype would
    change the values (float32 -> float16, int16 -> uint8, ...) is refused."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        target = None
    if target is not None and stored.dtype == target:
        return stored
    if (target is not None and stored.dtype.kind in "iu" and target.kind in "iu"
            and (stored.size == 0 or (np.iinfo(target).min <= stored.min()
                                      and stored.max() <= np.iinfo(target).max))):
        return stored.astype(target)
    raise ValueError(f"Prepared file {file}: `{key}` is stored as {stored.dtype}, which "
                     f"`prepare` does not write for the manifest's dtype {dtype!r} (read "
                     f"as it, the values would change).")


def _check_same_rows(parts):
    rows = {name: len(value) for name, value in _flatten(parts).items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"the batch rows stored once must have the same rows in every part. "
                         f"Received: rows {rows}")


def _check_index(name, index, rows, what):
    if index.size and (index.min() < 0 or index.max() >= rows):
        raise ValueError(f"`{name}` must lie in [0, {rows}) ({what}). "
                         f"Received: values from {index.min()} to {index.max()}")


def _default_finish(parts):
    return tuple(parts[key] for key in ("x", "y", "sample_weight") if key in parts)


class Batches(keras.utils.PyDataset):
    """One pass of prepared batches as a `keras.utils.PyDataset`, read in
    order by `Model.fit` / `evaluate` on every backend; `skip(k)` starts at
    batch k (what `ResumableTrainer` asks of a dataset to resume mid-epoch).
    `rows[b]`: the rows of `arrays` that make batch b (`batch_rows`; by
    default the `sizes[b]` rows after the batches before it).
    `weightless(batch, b)`: batch b as finished, with its filler rows made
    to count for nothing (`PreparedData.batches`); None: as finished.
    """

    def __init__(self, sizes, arrays, finish=None, start=0, shapes=None, rows=None,
                 weightless=None):
        super().__init__()
        self.sizes = np.asarray(sizes)
        self.arrays = arrays
        self.finish = finish or _default_finish
        self.start = start
        self.shapes = shapes or {}
        self.rows = batch_rows(self.sizes) if rows is None else rows
        self.weightless = weightless

    def __len__(self):
        return len(self.sizes) - self.start

    @property
    def num_batches(self):
        return len(self)

    def cardinality(self):
        return len(self)

    def skip(self, count):
        return Batches(self.sizes, self.arrays, self.finish, self.start + int(count), self.shapes,
                       self.rows, self.weightless)

    def for_backend(self):
        """These batches as `Model.fit` reads them best on this backend: on
        TensorFlow, batches of varying width as a `tf.data.Dataset` (Keras
        turns a `PyDataset` into one whose shapes it takes from its first
        batches, and a wider batch later fails); otherwise `self`."""
        if not self.shapes or keras.backend.backend() != "tensorflow":
            return self
        import tensorflow as tf

        first = self[0]

        def spec(array, varying):
            shape = (None,) + tuple(None if varying else n for n in array.shape[1:])
            return tf.TensorSpec(shape, tf.as_dtype(array.dtype))

        # A varying part may sit anywhere in the structure: every axis but the
        # batch's is left open where any of the stored parts varies.
        signature = keras.tree.map_structure(lambda array: spec(array, True), first)
        dataset = tf.data.Dataset.from_generator(
            lambda: (self[index] for index in range(len(self))), output_signature=signature)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(self)))

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        index += self.start
        rows = self.rows[index]
        parts = {}
        for key, array in self.arrays.items():
            value = array[rows]
            if key in self.shapes:  # cut back to this batch's own width
                value = value[(slice(None),) + tuple(slice(0, int(n)) for n in self.shapes[key][index])]
            parts[key] = value
        batch = self.finish(_unflatten(parts))
        return batch if self.weightless is None else self.weightless(batch, index)
