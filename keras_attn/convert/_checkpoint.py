"""Reading a Hugging Face directory strictly: every malformed file is a
`ValueError` naming the file and the key, every tensor has exactly the shape
the config implies and only finite values (no NaN, no infinity), and every
tensor is used or its skipping is named.

Hand-written because `safetensors` and `json` raise their own errors
(`SafetensorError`, `JSONDecodeError`, `KeyError`) that name neither the
file nor what the converter expected.
"""

import json
import os

_MISSING = object()


def read_config(directory, file="config.json"):
    """The dict of `<directory>/config.json` (or of the JSON `file` there)."""
    path = os.path.join(directory, file)
    try:
        with open(path, encoding="utf-8") as stream:
            config = json.load(stream)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist. Received: path={directory!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}). Received: path={directory!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object. Received: {type(config).__name__}")
    return config


def refuse(file, key, value, why):
    """Raises the `ValueError` of a malformed entry: the file, what is wrong
    and the key with the value received."""
    raise ValueError(f"{file}: {why}. Received: {key}={value!r}")


def _field(config, key, kind, default, file):
    value = config.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{file} has no {key!r}, which the converter needs. "
                         f"Received: keys={sorted(config)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{file}: {key!r} must be a number. Received: {key}={value!r}")
    if kind is int:
        if value != int(value):
            raise ValueError(f"{file}: {key!r} must be an integer. Received: {key}={value!r}")
        return int(value)
    return float(value)


def config_int(config, key, file, default=_MISSING):
    """An integer field of `config.json`; `ValueError` naming `file` and
    `key` when it is missing (with no default) or not an integer."""
    return _field(config, key, int, default, file)


def config_float(config, key, file, default=_MISSING):
    return _field(config, key, float, default, file)


def hf_class_names(hf_config, file, num_classes=None):
    """`(num_classes, class_names)` of a classifier's `config.json`: the
    names its `id2label` gives classes `0..num_classes-1`, or None when it
    has none or transformers' default names (`LABEL_i`). `num_classes`:
    the head's size where the tensors tell it (the image classifiers'); None
    reads it from `num_labels`, else the length of `id2label`, else 2.

    A label map that does not fit the head is a `ValueError` naming `file`,
    the key and the value: `id2label` not an object, its length not the
    head's, a key that is not one of the ids `0..num_classes-1` (or repeats
    one), a name that is not a non-empty string of one line, or a name
    given to two ids. `label2id` is not read: it is `id2label`'s inverse
    (`save_hf` writes it so), and an old one left beside renamed classes
    is common."""
    id2label = hf_config.get("id2label")
    if id2label is None:
        id2label = {}
    if not isinstance(id2label, dict):
        raise ValueError(f"{file}: 'id2label' must be an object of class id -> name. "
                         f"Received: id2label={_short(id2label)}")
    if num_classes is None:
        num_classes = config_int(hf_config, "num_labels", file, len(id2label) or 2)
    if not id2label:
        return num_classes, None
    if len(id2label) != num_classes:
        raise ValueError(f"{file}: 'id2label' has {len(id2label)} names but the classifier has "
                         f"{num_classes} classes (num_labels, or the classifier's tensor). "
                         f"Received: id2label={_short(id2label)}")
    names = [None] * num_classes
    ids = {}  # name -> its id
    for key, name in id2label.items():
        try:
            index = int(key)
        except ValueError:
            index = -1
        if not 0 <= index < num_classes or names[index] is not None:
            raise ValueError(f"{file}: the keys of 'id2label' must be the class ids 0 to "
                             f"{num_classes - 1}, each once. Received: id2label[{key!r}]={name!r}")
        if not isinstance(name, str) or not name or "\n" in name or "\r" in name:
            raise ValueError(f"{file}: each name in 'id2label' must be a non-empty string of one "
                             f"line. Received: id2label[{key!r}]={name!r}")
        if name in ids:
            raise ValueError(f"{file}: 'id2label' names the class {name!r} twice (ids "
                             f"{ids[name]} and {index}). Received: id2label[{key!r}]={name!r}")
        names[index], ids[name] = name, index
    if names == [f"LABEL_{i}" for i in range(num_classes)]:
        return num_classes, None
    return num_classes, names


SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


class LoadedTensors(dict):
    """`{name: np.ndarray}` of a directory's weights (what `read_safetensors`
    returns), with the file to name in messages: `file` for the checkpoint
    as a whole (`model.safetensors`, or the index of a sharded one) and
    `file_of(name)` for one tensor (the shard holding it)."""

    def __init__(self, file, shards=None):
        super().__init__()
        self.file = file
        self.shards = shards  # {name: shard path}, None for one file

    def file_of(self, name):
        if self.shards is None:
            return self.file
        return self.shards.get(name, self.file)


def read_safetensors(directory):
    """`{name: np.ndarray}` (a `LoadedTensors`) of `<directory>/model.safetensors`,
    or of the shards that `<directory>/model.safetensors.index.json` names
    (what `save_pretrained` writes above its `max_shard_size`: each tensor
    name of its "weight_map" -> the file in `directory` holding it).

    A directory holding both reads `model.safetensors` and ignores the
    index, as transformers' `from_pretrained` does for a local directory.
    A sharded checkpoint is checked before any tensor is read: a malformed
    index, a shard the index names that does not exist, a tensor the index
    names that its shard does not hold, or a tensor a shard holds that the
    index does not name (or puts in another shard) is a `ValueError` naming
    the file and the key. Each shard's arrays go into the one dict as they
    are (nothing is copied).
    """
    path = os.path.join(directory, SAFETENSORS)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(directory, SAFETENSORS_INDEX)):
            return _read_shards(directory)
        raise ValueError(f"{path} does not exist (nor {SAFETENSORS_INDEX}, the index of a "
                         f"sharded checkpoint). Received: path={directory!r}")
    tensors = LoadedTensors(path)
    tensors.update(_load(path, directory))
    return tensors


def _load(path, directory):
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except Exception as error:  # SafetensorError, or an OSError of a cut file
        raise ValueError(
            f"{path} cannot be read as safetensors (truncated or not a safetensors "
            f"file): {error}. Received: path={directory!r}"
        ) from None


def _read_shards(directory):
    from safetensors import safe_open

    index = os.path.join(directory, SAFETENSORS_INDEX)
    weight_map = read_config(directory, SAFETENSORS_INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: 'weight_map' must be a non-empty object of tensor name -> "
                         f"shard file. Received: weight_map={_short(weight_map)}")
    shards = {}  # shard name -> the tensor names the index puts there
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or shard in ("", ".", "..")
                or os.path.basename(shard) != shard or "/" in shard or "\\" in shard):
            raise ValueError(f"{index}: 'weight_map' must name a file of {directory} for "
                             f"each tensor. Received: {name!r} -> {shard!r}")
        shards.setdefault(shard, set()).add(name)
    for shard, names in sorted(shards.items()):
        if not os.path.isfile(os.path.join(directory, shard)):
            raise ValueError(f"{index} names the shard {shard!r} (holding {min(names)!r}), "
                             f"which does not exist. Received: path={directory!r}")
    # Every shard's header first: a wrong key in the last shard is refused
    # before gigabytes are read.
    for shard, names in sorted(shards.items()):
        path = os.path.join(directory, shard)
        try:
            with safe_open(path, framework="numpy") as stream:
                held = set(stream.keys())
        except Exception as error:
            raise ValueError(
                f"{path} cannot be read as safetensors (truncated or not a safetensors "
                f"file): {error}. Received: path={directory!r}"
            ) from None
        missing = sorted(names - held)
        if missing:
            raise ValueError(f"{index} puts tensor {missing[0]!r} in {shard}, which does not "
                             f"hold it ({len(missing)} such). Received: {len(held)} tensors "
                             f"in {path}")
        extra = sorted(held - names)
        if extra:
            name = extra[0]
            where = (f"which {index} puts in {weight_map[name]}" if name in weight_map
                     else f"which {index} does not name")
            raise ValueError(f"{path} holds tensor {name!r}, {where} ({len(extra)} such). "
                             f"Received: path={directory!r}")
    tensors = LoadedTensors(index, {name: os.path.join(directory, shard)
                                 for name, shard in weight_map.items()})
    for shard in sorted(shards):
        tensors.update(_load(os.path.join(directory, shard), directory))
    return tensors


def check_sizes(tensors, directory, sizes, layers=(), optional=(), file="config.json"):
    """Refuses a config whose sizes disagree with the checkpoint's tensors,
    before the model is built: a `vocab_size` of 10**9 over a table of
    30522 rows would otherwise allocate the 10**9 rows (an out-of-memory
    error, or minutes of building, that names nothing).

    `tensors`: the checkpoint's `{name: array}` (`read_safetensors`; only
    the shapes are read). `sizes`: `(name, shape, keys)`, the shape the
    config implies for tensor `name`, and `keys` `{axis: (key, value)}` the
    config key each axis comes from. `layers`: `(key, value, prefix)`, the
    checkpoint must hold layers `prefix0.` to `prefix{value-1}.` and no
    other. A tensor of `sizes` the checkpoint does not hold is refused
    (the loader's message) unless `optional` names it (one a checkpoint
    may leave out). A `ValueError` names `directory/file`, the key, its
    value and the tensor's shape; a tensor of another rank, or another size
    on an axis no key sets, gets the loader's shape message.
    """
    where = os.path.join(directory, file)
    for key, value, prefix in layers:
        held = {}  # layer index -> a tensor of it
        for name in sorted(tensors):
            if name.startswith(prefix):
                index = name[len(prefix):].split(".", 1)[0]
                if index.isdigit():
                    held.setdefault(int(index), name)
        if set(held) != set(range(value)):
            extra = sorted(set(held) - set(range(value)))
            example = (f"tensor {held[extra[0]]!r} is of layer {extra[0]}" if extra else
                       f"it has no layer {min(set(range(value)) - set(held))}")
            span = f"{prefix}0 to {prefix}{max(held)}; " if held else ""
            raise ValueError(
                f"{where}: {key}={value!r} disagrees with the checkpoint, which holds "
                f"{len(held)} layer{'s' * (len(held) != 1)} ({span}{example}). "
                f"Received: {key}={value!r}")
    for name, expected, keys in sizes:
        if name not in tensors:
            if name in optional:
                continue
            # Named here, not after building: the sizes it would have checked
            # could be any.
            checkpoint = getattr(tensors, "file", None) or os.path.join(directory, SAFETENSORS)
            raise ValueError(f"{checkpoint} has no tensor {name!r}, which the config implies. "
                             f"Received: path={directory!r}")
        shape, expected = tuple(tensors[name].shape), tuple(expected)
        if shape == expected:
            continue
        source = tensors.file_of(name) if hasattr(tensors, "file_of") else SAFETENSORS
        wrong = [axis for axis in range(len(shape))
                 if len(shape) == len(expected) and shape[axis] != expected[axis]]
        if not wrong or any(axis not in keys for axis in wrong):  # another rank or layout
            raise ValueError(
                f"{source}: tensor {name!r} has shape {shape} but config.json implies "
                f"{expected}. Received: {name}.shape={shape}")
        key, value = keys[wrong[0]]
        raise ValueError(
            f"{where}: {key}={value!r} disagrees with the checkpoint: tensor {name!r} has "
            f"shape {shape} but config.json implies {expected} (in {source}). "
            f"Received: {key}={value!r}, {name}.shape={shape}")


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Tensors:
    """The checkpoint's tensors, handed out with an exact shape check; what
    was never asked for is reported by `check_all_used`. Messages name
    `file` (`model.safetensors`, or the index of a sharded checkpoint) and,
    for one tensor, `file_of(key)` (the shard holding it)."""

    def __init__(self, tensors, directory):
        self.tensors = tensors
        self.file = getattr(tensors, "file", None) or os.path.join(directory, SAFETENSORS)
        self.used = set()

    def file_of(self, key):
        if isinstance(self.tensors, LoadedTensors):
            return self.tensors.file_of(key)
        return self.file

    def get(self, key, shape):
        if key not in self.tensors:
            raise ValueError(f"{self.file} has no tensor {key!r}, which the config implies. "
                             f"Received: path={os.path.dirname(self.file)!r}")
        value = self.tensors[key]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"{self.file_of(key)}: tensor {key!r} has shape {tuple(value.shape)} but "
                f"config.json implies {tuple(shape)}. Received: {key}.shape={tuple(value.shape)}"
            )
        self.check_finite(key)
        self.used.add(key)
        return value.astype("float32", copy=False)  # a float32 tensor is not held twice

    def check_finite(self, key):
        """`ValueError` naming the file and `key` when the tensor holds a NaN
        or an infinity (a corrupt or diverged checkpoint: loaded, it would
        make every output NaN without an error)."""
        import numpy as np

        value = self.tensors[key]
        if np.issubdtype(value.dtype, np.floating):  # integers are always finite
            finite = np.isfinite(value)
            if not finite.all():
                bad = int(finite.size - np.count_nonzero(finite))
                raise ValueError(
                    f"{self.file_of(key)}: tensor {key!r} holds {bad} non-finite value(s) "
                    f"(NaN or infinity); the checkpoint is corrupt or its training diverged. "
                    f"Received: {key}.shape={tuple(value.shape)}"
                )

    def check_all_used(self, ignored=(), dropped=()):
        """`ValueError` naming every tensor not used. `ignored`: prefixes of
        buffers that hold no weight (skipped silently); `dropped`: prefixes
        of heads the caller chose to drop (skipped, and named in the
        returned list)."""
        unused = sorted(set(self.tensors) - self.used)
        unused = [k for k in unused if not any(k.startswith(p) for p in ignored)]
        skipped = [k for k in unused if any(k.startswith(p) for p in dropped)]
        left = [k for k in unused if k not in skipped]
        if left:
            shown = ", ".join(left[:8]) + (", ..." if len(left) > 8 else "")
            raise ValueError(
                f"{self.file} has {len(left)} tensor(s) the model built from "
                f"config.json has no place for (more layers than num_hidden_layers, "
                f"or another architecture?): {shown}. Received: "
                f"{len(self.tensors)} tensors"
            )
        return skipped


# === Writing (keras_attn -> Hugging Face) ===


class Entry:
    """One checkpoint tensor and the Keras variable it fills: `to_keras`
    lays the checkpoint's array out for the variable, `to_hf` undoes it
    (transposes and reshapes only, so a round trip is exact).

    The loaders and the savers read one list of entries, so the two
    directions cannot disagree on a name or a layout."""

    def __init__(self, name, shape, variable, to_keras=None, to_hf=None):
        self.name = name
        self.shape = tuple(shape)
        self.variable = variable
        self.to_keras = to_keras or _same
        self.to_hf = to_hf or _same


def _same(array):
    return array


def transposed(array):
    return array.T


def read_entries(entries, tensors, model=None, unread=()):
    """[(variable, array)] for every `Entry`, each tensor read from
    `tensors` (`Tensors`) and checked before anything is assigned. With
    `model`, every weight of it must have an entry, except the variables in
    `unread` (weights the checkpoint has no place for, left as they are)."""
    if model is not None:
        covered = {id(entry.variable) for entry in entries} | {id(v) for v in unread}
        missing = [w.path for w in model.weights if id(w) not in covered]
        if missing:
            raise ValueError(f"Weights without a tensor. Received: missing={missing}")
    plan = []
    for entry in entries:
        array = entry.to_keras(tensors.get(entry.name, entry.shape))
        if tuple(entry.variable.shape) != tuple(array.shape):
            raise ValueError(  # a bug of the layout, not of the file
                f"Weight {entry.variable.path!r} has shape {tuple(entry.variable.shape)}. "
                f"Received: shape={tuple(array.shape)}"
            )
        plan.append((entry.variable, array))
    return plan


def layer_weights(layer, count):
    """`layer.weights`, which must be the `count` float weights of a plain
    layer: a layer with LoRA adapters or int8 weights has no checkpoint
    layout (a `ValueError` that says what to do)."""
    if getattr(layer, "lora_enabled", False):
        raise ValueError(
            f"Layer {layer.path!r} has LoRA adapters: fold them in first with "
            "keras_attn.models.merge_lora(model), then convert the merged model. "
            f"Received: {layer.path}.lora_rank={layer.lora_rank}"
        )
    mode = getattr(layer, "quantization_mode", None)
    if mode is not None:
        raise ValueError(
            f"Layer {layer.path!r} is quantized ({mode}); checkpoints of the other "
            "libraries hold float weights: convert the model before `quantize`. "
            f"Received: {layer.path}.quantization_mode={mode!r}"
        )
    weights = list(layer.weights)
    if len(weights) != count:
        raise ValueError(  # a bug of the converter's layout, not of the user's model
            f"Layer {layer.path!r} has {len(weights)} weights, the layout expects {count}. "
            f"Received: weights={[w.path for w in weights]}"
        )
    return weights


# What the `save_hf_*` writers write (`write_directory`): a directory
# holding these files only, config.json and the weights among them, is one
# they may replace (generation_config.json: a Parakeet transducer's).
HF_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
            "preprocessor_config.json", "generation_config.json")


def _hf_reason(directory):
    """Why the existing directory `directory` is not a Hugging Face directory
    these writers write (None when it is)."""
    entries = sorted(os.listdir(directory))
    for required in ("config.json", "model.safetensors"):
        if required not in entries:
            return f"it has no {required}"
    for entry in entries:
        path = os.path.join(directory, entry)
        if entry not in HF_FILES:
            return f"keras_attn does not write {entry!r}"
        if os.path.islink(path) or not os.path.isfile(path):
            return f"{entry!r} is not a plain file"
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as stream:
            config = json.load(stream)
    except (OSError, ValueError) as error:
        return f"its config.json cannot be read as JSON ({error})"
    if not isinstance(config, dict) or "model_type" not in config:
        return "its config.json names no model_type"
    return None


def hf_directory_kind():
    """The `DirectoryKind` (`keras_attn.export.saved_model`) of what
    `write_directory` writes: `check_replaceable` with it refuses any other
    non-empty directory (`keras-attn export --format hf` checks it before
    reading the run)."""
    from keras_attn._directories import DirectoryKind

    return DirectoryKind("a Hugging Face directory written by keras_attn (config.json, "
                         "model.safetensors and only the other files it writes: "
                         + ", ".join(HF_FILES[2:]) + ")", _hf_reason)


def write_directory(directory, files, tensors, overwrite=False):
    """Writes `files` (`{name: text}`) and `tensors` (`{name: array}`, as
    `model.safetensors`) into `directory` atomically: everything goes to a
    new sibling directory first, which then takes `directory`'s place, so
    an error or an interruption never leaves a half-written directory.

    An existing non-empty `directory` is a `ValueError` unless `overwrite`,
    and with `overwrite` unless it is a Hugging Face directory these
    writers write (`config.json`, `model.safetensors`, and no file but
    `HF_FILES`): any other directory is refused, named with what it holds,
    and left as it is. The old directory is moved aside into a new
    directory of its own and removed only once the new one is in place.
    """
    import shutil
    import tempfile

    import numpy as np
    from safetensors.numpy import save_file

    from keras_attn._directories import check_replaceable
    from keras_attn._directories import replace_directory

    unknown = sorted(set(files) - set(HF_FILES))
    if unknown:  # a writer's bug: a later overwrite would refuse the directory
        raise ValueError(f"`files` may only name {HF_FILES}. Received: {unknown}")
    kind = hf_directory_kind()
    directory = os.path.abspath(os.fspath(directory))
    # A file, a link or a foreign directory: refused with or without overwrite.
    check_replaceable(directory, kind, "directory")
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise ValueError(
            "`directory` exists and is not empty (an earlier Hugging Face directory); pass "
            f"overwrite=True to replace it. Received: directory={directory!r}"
        )
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(directory) + "-", dir=parent)
    try:
        target = os.path.join(staging, "hf")
        os.mkdir(target)
        for name, text in files.items():
            with open(os.path.join(target, name), "w", encoding="utf-8") as stream:
                stream.write(text)
        # `ascontiguousarray` makes a 0-d array 1-d: the shape is kept.
        arrays = {name: np.ascontiguousarray(value).reshape(np.shape(value))
                  for name, value in tensors.items()}
        save_file(arrays, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
        replace_directory(target, directory, kind, "directory")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def hf_label_fields(num_classes, model_names, class_names=None):
    """config.json's `num_labels`, `id2label` and `label2id` (its inverse)
    for a classifier of `num_classes` classes: the names `class_names` (the
    writer's argument) if given, else the model's own (`model_names`), else
    transformers' defaults `LABEL_i`. `num_classes` None (a model without a
    head) gives no fields, and refuses `class_names`."""
    from keras_attn._checks import check_class_names

    if num_classes is None:
        if class_names is not None:
            raise ValueError("Invalid value for argument `class_names`: the model has no "
                             f"classifier head. Received: class_names={class_names!r}")
        return {}
    names = (check_class_names("class_names", class_names, num_classes) or model_names
             or [f"LABEL_{i}" for i in range(num_classes)])
    return {"num_labels": num_classes,
            "id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


def json_text(value):
    return json.dumps(value, indent=2, sort_keys=True) + "\n"
