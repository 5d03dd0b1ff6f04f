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
    """

    name: str
    architectures: Tuple[str, ...]
    model_types: Tuple[str, ...]
    load: Callable
    save: Callable = None
    writes: Callable = None
    models: Tuple[str, ...] = ()


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
