"""The converters' registry and the one strict load and save path they share.

Each family's converter file (bert.py, vit.py, ...) fills one `Converter`:
the `architectures` and `model_type`s of `config.json` it reads, its
`load(directory)` and `save(model, directory, overwrite=False, **options)`
(the public `load_hf_*` / `save_hf_*`), and `writes(model)`, which says by
`isinstance` on the family's model classes (subclasses included) whether
`save` takes the model. Its weight table stays in the file: a `_layout`
returning `Entry`s (`_checkpoint.Entry`), one list both directions read;
its config mapping both ways too (`*_config_from_hf`, the writer's dict).
The file ends with `register(CONVERTER)`, and `FAMILIES` below names the
file: a new family is its file plus one line here. (A line here, not only
the `register` call, because `load_hf` must find a family nobody imported.)

`load_hf` / `save_hf` (hf.py) dispatch from the registry only:
`converter_for_config` by `architectures[0]`, else `model_type`;
`converter_for_model` by the first converter that `writes` the model. Two
converters claiming one architecture or model type is refused at
`register`.

The scaffolding every family repeated is here once:

- `load_weights(model, entries, tensors, ...)`: every entry's tensor read
  with its exact shape and checked finite (`Tensors.get`), every weight of
  the model covered (`read_entries`), every tensor of the checkpoint used
  (`Tensors.check_all_used`), and only then anything assigned.
- `write_weights(directory, entries, files, ...)`: the variables laid out
  for the checkpoint (`Entry.to_hf`; entries sharing one name are the row
  blocks of one fused tensor, stacked in order and held to its shape) and
  written atomically with the files (`write_directory`).

Reading the config, the label map (`hf_class_names` / `hf_label_fields`),
the size checks before building (`check_sizes`) and the image processor
stay in `_checkpoint.py` / `_image_processor.py`.
"""

import dataclasses
import importlib
from typing import Callable
from typing import Tuple

from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_entries
from keras_attn.convert._checkpoint import transposed
from keras_attn.convert._checkpoint import write_directory

# The family converter files, in the order `save_hf` asks them: one line a family.
FAMILIES = (
    "keras_attn.convert.bert",
    "keras_attn.convert.modernbert",
    "keras_attn.convert.vit",
    "keras_attn.convert.dinov2",
    "keras_attn.convert.parakeet",
    "keras_attn.convert.marian",
)


@dataclasses.dataclass(frozen=True)
class Converter:
    """What one family's converter file tells `load_hf` and `save_hf`.

    Attributes:
        name: the family ("bert", "vit", ...).
        architectures: the `architectures` of `config.json` it reads.
        model_types: the `model_type`s it reads (a config without
            `architectures`).
        load: `load(directory)`, the model of such a directory.
        save: `save(model, directory, overwrite=False, **options)`, or None
            for a family that is read only.
        writes: `writes(model) -> bool`, whether `save` takes `model`.
        models: the names of the model classes `save` writes (for messages).
        classifier: `classifier(directory, num_classes, class_names)`, the
            family's classifier with the checkpoint's encoder (and its own
            head where it has one of `num_classes` outputs), what
            `load_hf(directory, num_classes=...)` gives; None for a family
            without one (refused by name).
    """

    name: str
    architectures: Tuple[str, ...]
    model_types: Tuple[str, ...]
    load: Callable
    save: Callable = None
    writes: Callable = None
    models: Tuple[str, ...] = ()
    classifier: Callable = None


_CONVERTERS = {}  # name -> Converter, in registration order
_LOADED = []  # whether FAMILIES were imported


def register(converter):
    """Adds `converter` to the registry (a family file's last line);
    `ValueError` when another family already reads one of its
    architectures or model types. Returns `converter`."""
    for other in _CONVERTERS.values():
        if other.name == converter.name:
            continue
        shared = sorted(set(other.architectures) & set(converter.architectures)
                        | set(other.model_types) & set(converter.model_types))
        if shared:
            raise ValueError(f"Converter {converter.name!r} claims what {other.name!r} reads. "
                             f"Received: {shared}")
    _CONVERTERS[converter.name] = converter
    return converter


def converters():
    """The registered converters, every family of `FAMILIES` imported."""
    if not _LOADED:
        for module in FAMILIES:
            importlib.import_module(module)  # its last line registers it
        _LOADED.append(True)
    return list(_CONVERTERS.values())


def architectures():
    return sorted(a for c in converters() for a in c.architectures)


def converter_for_config(config):
    """`(converter, what)`: the converter of a `config.json` dict by
    `architectures[0]`, else `model_type` (None when none reads it), and
    `what` the field it was looked up by, for a message."""
    names = config.get("architectures")
    if isinstance(names, str):
        names = [names]
    if names:
        found = [c for c in converters() if names[0] in c.architectures]
        what = f"architecture {names[0]!r}"
    else:
        model_type = config.get("model_type")
        found = [c for c in converters() if model_type in c.model_types]
        what = f"model_type {model_type!r} (and no 'architectures')"
    return (found[0] if found else None), what


def classifier_arguments(num_classes, class_names):
    """`(num_classes, class_names)` of `load_hf(directory, num_classes=,
    class_names=)`: the count from the names when only they are given, the
    two checked against each other (`ValueError` naming the argument)."""
    from keras_attn._checks import check_class_names

    if num_classes is None:
        if not isinstance(class_names, (list, tuple)) or not class_names:
            raise ValueError("Invalid value for argument `class_names`: a non-empty list of the "
                             f"classes' names. Received: class_names={class_names!r}")
        num_classes = len(class_names)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError("Invalid value for argument `num_classes`: a positive integer. "
                         f"Received: num_classes={num_classes!r}")
    return num_classes, check_class_names("class_names", class_names, num_classes)


def head_dropped_warning(directory, had, num_classes):
    """Warns that the checkpoint's classifier of `had` outputs is not loaded
    (a new head of `num_classes` takes its place), as transformers'
    `ignore_mismatched_sizes=True` reports it."""
    import warnings

    warnings.warn(f"{directory}: the checkpoint's classifier has {had} outputs; a new head of "
                  f"num_classes={num_classes} takes its place (initialised at random)",
                  stacklevel=3)


def own_head(model, classifier_class, directory, num_classes, class_names):
    """The loaded `model` when it is a `classifier_class` of `num_classes`
    outputs (named by `class_names` if given: `named_head`), else None
    (with `head_dropped_warning` for a classifier of another size)."""
    if not isinstance(model, classifier_class):
        return None
    if model.num_classes != num_classes:
        head_dropped_warning(directory, model.num_classes, num_classes)
        return None
    return named_head(model, class_names, directory)


def named_head(model, class_names, directory):
    """The checkpoint's own head `model` under `class_names` (None: its own
    names). The names of `id2label` mean what each output was trained on:
    `class_names` holding the same names in another order (a folder's
    sorted classes) reorders the head's outputs (the kernel's columns and
    the bias of its "classifier" Dense), so that output i is
    `class_names[i]`; names none of the checkpoint's (or a checkpoint with
    transformers' default `LABEL_i`) rename its outputs, as transformers'
    `from_pretrained(..., id2label=...)` does. A mix, where a name of the
    checkpoint would land on another of its outputs, is refused: renaming
    would answer one class's score under another's name."""
    own = model.class_names
    if class_names is None or own is None or list(own) == list(class_names):
        if class_names is not None:
            model.class_names = class_names
        return model
    own = list(own)
    if sorted(own) == sorted(class_names):
        import numpy as np

        order = [own.index(name) for name in class_names]
        head = model.get_layer("classifier")
        head.kernel.assign(np.asarray(head.kernel)[:, order])
        if head.bias is not None:
            head.bias.assign(np.asarray(head.bias)[order])
    else:
        moved = [f"{name!r} (its output {own.index(name)}, here {i})"
                 for i, name in enumerate(class_names) if name in own and own.index(name) != i]
        if moved:
            raise ValueError(
                f"Invalid value for argument `class_names`: {directory}'s classifier names its "
                f"outputs {own} (id2label); {', '.join(moved)} would move while other outputs "
                "are renamed. Pass the checkpoint's names in any order (the head is reordered "
                "to match), or names none of them (its outputs renamed). Received: "
                f"class_names={list(class_names)!r}")
    model.class_names = list(class_names)
    return model


def vit_classifier(model, directory, num_classes, class_names, pooling):
    """The `ViT` classifier of `num_classes` over the loaded `model` (a ViT
    with or without a head): the model itself when its head has
    `num_classes` outputs (named by `class_names` if given: `named_head`), else a ViT
    of the same config with `pooling` and a new head, every other weight
    copied by path (all of them, or a `ValueError`: a bug, not a file's)."""
    from keras_attn.models.vit import ViT

    config = model.vit_config
    if config.num_classes == num_classes:
        return named_head(model, class_names, directory)
    if config.num_classes is not None:
        head_dropped_warning(directory, config.num_classes, num_classes)
    new = ViT(**dataclasses.asdict(dataclasses.replace(config, num_classes=num_classes,
                                                       pooling=pooling)),
              class_names=class_names)
    old = {w.path: w for w in model.weights if not w.path.startswith("classifier/")}
    kept = [w for w in new.weights if not w.path.startswith("classifier/")]
    if sorted(w.path for w in kept) != sorted(old):
        raise ValueError(f"The new head's ViT has other weights than the loaded one. "
                         f"Received: {sorted(set(old) ^ {w.path for w in kept})}")
    for weight in kept:
        weight.assign(old[weight.path])
    for name, value in vars(model).items():  # what the converters carry on the object
        if name.startswith("_dinov2_"):
            setattr(new, name, value)
    return new


def converter_for_model(model):
    """The first converter whose `writes(model)` (None when none does)."""
    for converter in converters():
        if converter.save is not None and converter.writes(model):
            return converter
    return None


def load_weights(model, entries, tensors, unread=(), ignored=(), dropped=(), cast=False):
    """Assigns the checkpoint's tensors to `model`'s weights by `entries`,
    strictly: each tensor of its exact shape and finite, every weight of
    `model` covered (but `unread`), every tensor used (but the prefixes
    `ignored` and `dropped`), and nothing assigned before all of it holds.
    `cast`: assign in each variable's dtype. Returns the dropped tensors'
    names (`Tensors.check_all_used`)."""
    plan = read_entries(entries, tensors, model, unread)  # raises before any assignment
    skipped = tensors.check_all_used(ignored, dropped)
    for variable, array in plan:
        variable.assign(array.astype(variable.dtype) if cast else array)
    return skipped


def hf_tensors(entries):
    """`{name: float32 array}` of the checkpoint `entries` lay out: entries
    sharing a name are row blocks of one fused tensor, stacked in order,
    which must come out of the entry's shape (else a layout bug)."""
    import numpy as np
    from keras import ops

    parts = {}
    for entry in entries:
        array = np.asarray(ops.convert_to_numpy(entry.variable), "float32")
        parts.setdefault(entry.name, []).append(entry.to_hf(array))
    tensors = {name: arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
               for name, arrays in parts.items()}
    for entry in entries:
        if tuple(tensors[entry.name].shape) != entry.shape:
            raise ValueError(f"Tensor {entry.name!r} has shape {tensors[entry.name].shape}. "
                             f"Received: expected {entry.shape}")
    return tensors


def write_weights(directory, entries, files, overwrite=False, extra=None):
    """Writes the model's weights laid out by `entries` (`hf_tensors`),
    the tensors `extra` (`{name: array}`, buffers that are no weight) and
    `files` (`{name: text}`) as a Hugging Face directory, atomically
    (`write_directory`). Returns its absolute path."""
    tensors = hf_tensors(entries)
    tensors.update(extra or {})
    return write_directory(directory, files, tensors, overwrite=overwrite)


def entry_helpers(entries, width, num_heads=None):
    """`dense(layer, name, n_out, n_in)` and `norm(layer, name)`, which add
    a Dense layer's (torch's `(out, in)` kernel transposed) or a biased
    LayerNorm's (`width` wide) `Entry`s to `entries`; with `num_heads`,
    also `heads_in(layer, name)` and `heads_out(layer, name)`, an
    attention projection's: torch's `(D, D)` Linear as Keras' per-head
    `(D, N, H)` query / key / value kernel (bias `(N, H)`, or none:
    `bias=False`) or `(N, H, D)` output kernel."""

    def dense(layer, name, n_out, n_in):
        kernel, bias = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", (n_out, n_in), kernel, transposed, transposed))
        entries.append(Entry(name + ".bias", (n_out,), bias))

    def norm(layer, name):
        gamma, beta = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", (width,), gamma))
        entries.append(Entry(name + ".bias", (width,), beta))

    if num_heads is None:
        return dense, norm
    D, N = width, num_heads
    H = D // N

    def heads_in(layer, name, bias=True):
        weights = layer_weights(layer, 2 if bias else 1)
        entries.append(Entry(name + ".weight", (D, D), weights[0],
                             lambda a: a.T.reshape(D, N, H), lambda a: a.reshape(D, D).T))
        if bias:
            entries.append(Entry(name + ".bias", (D,), weights[1],
                                 lambda a: a.reshape(N, H), lambda a: a.reshape(D)))

    def heads_out(layer, name):
        kernel, bias = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", (D, D), kernel,
                             lambda a: a.T.reshape(N, H, D), lambda a: a.reshape(D, D).T))
        entries.append(Entry(name + ".bias", (D,), bias))

    return dense, norm, heads_in, heads_out
