"""Reading a Hugging Face directory strictly: every malformed file is a
`ValueError` naming the file and the key, every tensor has exactly the shape
the config implies, and every tensor is used or its skipping is named.

Hand-written because `safetensors` and `json` raise their own errors
(`SafetensorError`, `JSONDecodeError`, `KeyError`) that name neither the
file nor what the converter expected.
"""

import json
import os

_MISSING = object()


def read_config(directory):
    """The dict of `<directory>/config.json`."""
    path = os.path.join(directory, "config.json")
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


def read_safetensors(directory):
    """`{name: np.ndarray}` of `<directory>/model.safetensors`."""
    from safetensors.numpy import load_file

    path = os.path.join(directory, "model.safetensors")
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist. Received: path={directory!r}")
    try:
        return load_file(path)
    except Exception as error:  # SafetensorError, or an OSError of a cut file
        raise ValueError(
            f"{path} cannot be read as safetensors (truncated or not a safetensors "
            f"file): {error}. Received: path={directory!r}"
        ) from None


class Tensors:
    """The checkpoint's tensors, handed out with an exact shape check; what
    was never asked for is reported by `check_all_used`."""

    def __init__(self, tensors, directory, prefix=""):
        self.tensors = tensors
        self.file = os.path.join(directory, "model.safetensors")
        self.prefix = prefix
        self.used = set()

    def has(self, name):
        return self.prefix + name in self.tensors or name in self.tensors

    def get(self, name, shape, prefixed=True):
        key = (self.prefix if prefixed else "") + name
        if key not in self.tensors:
            raise ValueError(f"{self.file} has no tensor {key!r}, which the config implies. "
                             f"Received: path={os.path.dirname(self.file)!r}")
        value = self.tensors[key]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"{self.file}: tensor {key!r} has shape {tuple(value.shape)} but "
                f"config.json implies {tuple(shape)}. Received: {key}.shape={tuple(value.shape)}"
            )
        self.used.add(key)
        return value.astype("float32")

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
