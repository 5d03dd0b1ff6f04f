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
train-0000.npz ...   epoch e's training batches, as the tf.data pipeline made them
validation.npz       the validation batches (when the recipe has them)
test.npz             the test batches (translation: its sources and references
                     are in tables.npz, decoded and scored with BLEU)
tables.npz           what a task stores once
```

Each `.npz` holds the batches of one pass laid end to end (`sizes`: the
rows of each batch; batches of varying width, as a length bucket each, are
padded to the widest and cut back to their own `shape/<part>` when read) in
the narrowest integer type that holds their values; they are read back in
the pipeline's dtypes. `tables.npz` holds what a task stores once (the
digits the augmented batches index, the translation test set). The training batches of every
epoch are stored (an epoch is a pure function of the recipe and the epoch:
`Task.train_dataset_fn`), so a run from prepared files sees the batches of a
run from tf.data, the masks and orders included, and resumes exactly as it
does (`ResumableTrainer`: `Batches.skip`). What would make them large is
stored compactly: image augmentation as the source pixels (uint8) and one
projective transform per image (drawn by the same stateless TensorFlow ops),
applied when the batch is read with `keras.ops.image.affine_transform`
(equal on TensorFlow; within 1e-4 of 255 on JAX and PyTorch).

Why Keras's `PyDataset` and not grain with array_record: the prepared data
of the small recipes is a few MiB that fits in memory, read in order, batch
by batch, by one process; `PyDataset` is what `Model.fit` reads on every
backend with no dependency beyond Keras, and NumPy's `.npz` keeps the files
readable anywhere. grain's strengths (random access into large record
files, sharded readers, worker processes) are for data sets this path does
not serve yet (tfds sets larger than memory).

Nothing reaches a training step unchecked: opening a directory checks the
format, that it was prepared for this recipe (the data-defining keys), that
every file is there with its size and SHA-256, and then every batch of every
file against what the model accepts (`GuardedModel.check_inputs` /
`check_labels`: ids, labels, masks, lengths), all before the first step.
"""

import hashlib
import json
import os

import keras
import numpy as np

MANIFEST = "prepared.json"
FORMAT = 1
# The recipe keys that decide the batches (and the translation test set): a
# directory prepared with other values is refused. The rest (optimizer,
# schedule, precision, checkpoints, XLA, the search) may change between
# `prepare` and `train`.
DATA_KEYS = ("family", "task", "model", "data", "training.seed", "training.batch_size",
             "training.epochs", "training.steps_per_epoch", "evaluation.max_examples")


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
    return dict(_write_arrays(path, arrays, sizes=sizes, **shapes), batches=len(batches),
                rows=int(sizes.sum()), varying=sorted(key[len("shape/"):] for key in shapes))


def _write_arrays(path, arrays, **extra):
    """`arrays` (narrowed) and `extra` to `path` atomically; returns the
    manifest entry (`dtypes`, `shapes`: of each array as given)."""
    from keras_attn.training.checkpoints import atomic_write

    narrowed = {key: _narrow(np.asarray(array)) for key, array in arrays.items()}
    atomic_write(path, lambda stream: np.savez_compressed(stream, **extra, **narrowed))
    return {
        "file": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "sha256": _sha256(path),
        "dtypes": {key: str(np.asarray(array).dtype) for key, array in arrays.items()},
        "shapes": {key: list(np.shape(array)) for key, array in arrays.items()},
    }


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
        output: the directory; an existing prepared directory is replaced.
        verbose: print a line per file.

    Returns:
        The manifest (a dict; also `<output>/prepared.json`), with `output`.

    Raises:
        ValueError: a bad recipe or override, data that cannot be prepared
            yet (a tfds speech set), an output that is a file.
    """
    import shutil

    from keras_attn.training.checkpoints import atomic_write_json
    from keras_attn.zoo.recipe import load_recipe
    from keras_attn.zoo.runs import locate_recipe
    from keras_attn.zoo.tasks import make_task

    recipe = load_recipe(locate_recipe(recipe), overrides)
    task = make_task(recipe)
    task.check_preparable()
    output = output or os.path.join("prepared", recipe["name"])
    if os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"`output` (--out) must be a directory; {output} is a file. "
                         f"Received: output={output!r}")
    task.prepare()
    staging = os.path.join(os.path.dirname(os.path.abspath(output)),
                           ".prepare-" + os.path.basename(os.path.abspath(output)))
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
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
        atomic_write_json(os.path.join(staging, MANIFEST), manifest)
        if os.path.isdir(output):
            shutil.rmtree(output)
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(entry["bytes"] for entry in files.values())
    if verbose:
        print(f"{recipe['name']}: {len(files)} files, {total / 2**20:.2f} MiB in {output}",
              flush=True)
    return dict(manifest, output=output)


class PreparedData:
    """A prepared directory, checked against a recipe (see the module
    docstring). Raises `ValueError` naming the file and what is wrong: no
    directory or manifest, another format, another recipe (the first
    differing key), a missing file, one of another size or checksum
    (truncated or edited), or one whose arrays do not match its manifest.

    Args:
        directory: the output of `prepare`.
        recipe: the resolved recipe to train.
    """

    def __init__(self, directory, recipe):
        self.directory = directory
        path = os.path.join(directory, MANIFEST)
        if not os.path.isfile(path):
            raise ValueError(
                f"`data` (--data) must be a directory written by `keras-attn prepare`; "
                f"{directory} has no {MANIFEST}. Received: data={directory!r}"
            )
        try:
            with open(path, encoding="utf-8") as stream:
                manifest = json.load(stream)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} cannot be read ({error}). Received: data={directory!r}"
                             ) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ValueError(f"{path} is prepared data of format {found!r}; this keras_attn "
                             f"reads format {FORMAT}. Received: data={directory!r}")
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
        self.manifest = manifest
        self.files = manifest["files"]
        expected = [f"train-{epoch:04d}" for epoch in range(manifest["epochs"])]
        for name in expected:
            if name not in self.files:
                raise ValueError(f"{path} lists no `{name}` file. Received: data={directory!r}")
        for name, entry in self.files.items():
            self._check_file(name, entry)
        self._cache = {}
        self._tables = None

    @property
    def state(self):
        return self.manifest["state"]

    @property
    def steps_per_epoch(self):
        return self.manifest["steps_per_epoch"]

    def _check_file(self, name, entry):
        file = os.path.join(self.directory, entry["file"])
        if not os.path.isfile(file):
            raise ValueError(f"Prepared file {file} is missing. Received: data={self.directory!r}")
        size = os.path.getsize(file)
        if size != entry["bytes"] or _sha256(file) != entry["sha256"]:
            raise ValueError(
                f"Prepared file {file} is not the file `prepare` wrote (size {size} bytes, "
                f"{entry['bytes']} written; or another SHA-256): truncated, edited or "
                f"replaced. Prepare the data again. Received: data={self.directory!r}"
            )

    def _load(self, name):
        """`(file, {key: array in the written dtype}, sizes or None)`."""
        entry = self.files[name]
        file = os.path.join(self.directory, entry["file"])
        with np.load(file, allow_pickle=False) as stored:
            arrays = {key: stored[key].astype(dtype, copy=False)
                      for key, dtype in entry["dtypes"].items()}
            sizes = stored["sizes"] if "sizes" in stored.files else None
            shapes = {key: stored[f"shape/{key}"] for key in entry.get("varying", ())}
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
        return file, arrays, sizes, shapes

    @property
    def tables(self):
        if self._tables is None:
            self._tables = self._load("tables")[1] if "tables" in self.files else {}
        return self._tables

    def _arrays(self, name):
        """`(sizes, {key: array in the pipeline's dtype}, {key: batch
        shapes})` of one pass."""
        if name not in self._cache:
            file, arrays, sizes, shapes = self._load(name)
            entry = self.files[name]
            if sizes is None or len(sizes) != entry["batches"] or int(sizes.sum()) != entry["rows"]:
                raise ValueError(f"Prepared file {file}: its batch sizes do not add up to "
                                 f"its {entry['rows']} rows.")
            self._cache = {name: (sizes, arrays, shapes)}  # one pass in memory at a time
        return self._cache[name]

    def check(self, model, task=None):
        """Every batch of every file against what `model` accepts (the
        model's own checks on concrete arrays, and `task.check_prepared`);
        `ValueError` naming the file."""
        for name in self.files:
            if name == "tables":
                continue
            _, arrays, _ = self._arrays(name)
            parts = _unflatten(arrays)
            try:
                if "x" in parts:
                    model.check_inputs(parts["x"])
                model.check_labels(parts.get("y"))
                if "index" in parts:  # rows of the examples stored once
                    _check_index(parts["index"], self.state["index_rows"])
                if task is not None:
                    task.check_prepared(parts, model)
            except ValueError as error:
                raise ValueError(
                    f"Prepared file {os.path.join(self.directory, self.files[name]['file'])}: "
                    f"{error}"
                ) from None

    def batches(self, split, epoch=None, finish=None):
        """The `Batches` of `"train"` (with `epoch`), `"validation"` or
        `"test"`; None for a split the recipe does not have. `finish(parts,
        tables)` (`Task.finish_prepared`) maps a stored batch's parts to the
        model's `(x, y[, sample_weight])`."""
        name = f"train-{epoch:04d}" if split == "train" else split
        if name not in self.files:
            if split == "train":
                raise ValueError(f"{self.directory} holds {self.manifest['epochs']} epochs; "
                                 f"epoch {epoch} was asked for.")
            return None
        sizes, arrays, shapes = self._arrays(name)
        if finish is not None:
            tables = self.tables
            return Batches(sizes, arrays, lambda parts: finish(parts, tables), shapes=shapes)
        return Batches(sizes, arrays, shapes=shapes)


def _check_index(index, rows):
    if index.size and (index.min() < 0 or index.max() >= rows):
        raise ValueError(f"`index` must lie in [0, {rows}) (rows of the stored examples). "
                         f"Received: values from {index.min()} to {index.max()}")


def _default_finish(parts):
    return tuple(parts[key] for key in ("x", "y", "sample_weight") if key in parts)


class Batches(keras.utils.PyDataset):
    """One pass of prepared batches as a `keras.utils.PyDataset`, read in
    order by `Model.fit` / `evaluate` on every backend; `skip(k)` starts at
    batch k (what `ResumableTrainer` asks of a dataset to resume mid-epoch).
    """

    def __init__(self, sizes, arrays, finish=None, start=0, shapes=None):
        super().__init__()
        self.sizes = np.asarray(sizes)
        self.arrays = arrays
        self.finish = finish or _default_finish
        self.start = start
        self.shapes = shapes or {}
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])

    def __len__(self):
        return len(self.sizes) - self.start

    @property
    def num_batches(self):
        return len(self)

    def cardinality(self):
        return len(self)

    def skip(self, count):
        return Batches(self.sizes, self.arrays, self.finish, self.start + int(count), self.shapes)

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
        rows = slice(int(self.offsets[index]), int(self.offsets[index + 1]))
        parts = {}
        for key, array in self.arrays.items():
            value = array[rows]
            if key in self.shapes:  # cut back to this batch's own width
                value = value[(slice(None),) + tuple(slice(0, int(n)) for n in self.shapes[key][index])]
            parts[key] = value
        return self.finish(_unflatten(parts))
