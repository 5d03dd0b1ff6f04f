"""The value checks of bad data that every model family shares (the first
line of defence of `keras_attn.models._guarded.GuardedModel`): whenever the
data is concrete (eager calls, and `fit`, `evaluate`, `predict` on NumPy
arrays, checked once before the first step), an id outside its range, a mask
that is not boolean or 0/1 or a row of padding only, an empty batch, or a
sequence past `max_sequence_length` is a `ValueError` that names the input,
the values seen and the range allowed.

Here too: what a model accepts (`IdSpec`, `MaskSpec`) and `concrete_value`,
which tells a concrete tensor from a traced one through Keras's own helpers
(`keras_attn._keras_compat`). The layers and `keras_attn.data` use these
checks as well; the model mixin lives beside the models
(`keras_attn/models/_guarded.py`), the non-finite optimizer and callback
beside training (`keras_attn/training/nonfinite.py`).
"""

import dataclasses
import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._keras_compat import in_tf_graph
from keras_attn._keras_compat import is_in_jax_tracing_scope



def concrete_value(x):
    """`x` as a NumPy array when its values exist now, else None.

    None for symbolic Keras tensors and for tensors being traced (a
    `tf.function` graph, a `jax.jit` trace), where no Python check can run.
    """
    if x is None or isinstance(x, keras.KerasTensor):
        return None
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (numbers.Number, list)):
        return np.asarray(x)
    if not ops.is_tensor(x):
        return None
    backend = keras.backend.backend()
    if backend == "tensorflow":
        if in_tf_graph():
            return None
    elif backend == "jax":
        if is_in_jax_tracing_scope(x):
            return None
    elif backend == "torch":
        import torch  # only reached on the torch backend

        # A meta tensor (Keras traces `compute_output_spec` with them) or a
        # torch.compile trace has no values.
        if torch.compiler.is_compiling() or getattr(x, "is_meta", False):
            return None
    return ops.convert_to_numpy(x)


# === What a model accepts ===


@dataclasses.dataclass(frozen=True)
class IdSpec:
    """Integer ids in `[low, high)` (token, segment, label ids)."""

    low: int
    high: int
    what: str = ""

    def describe(self, name):
        what = f" ({self.what})" if self.what else ""
        return f"{name} in [{self.low}, {self.high}){what}"


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """A `(B, T)` padding mask: boolean, or numbers that are exactly 0 or 1,
    with at least one real token (a 1) in each row: a row of padding only
    has no answer of its own (it would come from the padding's ids)."""

    def describe(self, name):
        return f"{name} boolean or 0/1, each row with a real token"


def _sample(values, limit=8):
    values = sorted(set(np.asarray(values).ravel().tolist()))
    text = ", ".join(repr(v) for v in values[:limit])
    return text + (", ..." if len(values) > limit else "")


def comparable_ids(ids):
    """`ids` as a tensor that compares with a range in its own dtype (a
    cast to int32 first would wrap an int64 2**32 + 2 to a valid 2);
    booleans, which do not compare, as int32."""
    ids = ops.convert_to_tensor(ids)
    return ops.cast(ids, "int32") if keras.backend.standardize_dtype(ids.dtype) == "bool" else ids


def check_ids(name, values, spec):
    """`ValueError` unless every value of the NumPy array `values` is an
    integer in `[spec.low, spec.high)`."""
    values = np.asarray(values)
    if values.size == 0:
        return
    if values.dtype.kind == "f":
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
            bad = values[~np.isfinite(values) | (values != np.round(values))]
            raise ValueError(
                f"`{name}` must hold integer ids in [{spec.low}, {spec.high}). "
                f"Received: {name} with non-integer values {_sample(bad)}"
            )
    elif values.dtype.kind not in "iub":
        raise ValueError(
            f"`{name}` must hold integer ids in [{spec.low}, {spec.high}). "
            f"Received: {name}.dtype={values.dtype}"
        )
    bad = values[(values < spec.low) | (values >= spec.high)]
    if bad.size:
        what = f" ({spec.what})" if spec.what else ""
        raise ValueError(
            f"`{name}` must lie in [{spec.low}, {spec.high}){what}. "
            f"Received: {bad.size} value(s) of {name} out of range: {_sample(bad)}"
        )


def check_mask(name, values):
    """`ValueError` unless the mask is boolean or holds only 0 and 1 (a
    float 0.4 would be read as True: refused rather than guessed)."""
    values = np.asarray(values)
    if values.dtype == bool or values.size == 0:
        return
    bad = values[(values != 0) & (values != 1)]
    if bad.size:
        raise ValueError(
            f"`{name}` must be boolean or hold only 0 and 1 (1 = a real "
            f"token). Received: {name} with values {_sample(bad)}"
        )


def check_mask_rows(name, values):
    """`ValueError` naming the rows of a `(B, T)` padding mask that hold no
    real token. Such a row's answer comes from its padding alone (the ids
    under the mask, through the residual stream): Keras, keras-hub and
    transformers answer it with finite numbers that change with those ids;
    here it is refused, and made NaN inside a graph."""
    values = np.asarray(values)
    if values.ndim != 2 or values.shape[1] == 0:
        return
    empty = np.flatnonzero(~(values != 0).any(axis=1))
    if empty.size:
        raise ValueError(
            f"Invalid value for argument `{name}`: row(s) {empty[:8].tolist()}"
            f"{' ...' if empty.size > 8 else ''} hold no real token (a row of padding "
            "only has no answer of its own: it would come from the padding's ids); "
            f"leave such rows out. Received: {name}[{int(empty[0])}] all 0"
        )


def check_not_empty(name, values):
    """One clear error for an empty batch or a sequence of length 0, the same
    in every family and entry point (Keras's own `predict` fails on an empty
    batch with an UnboundLocalError, the convolutions with shape errors)."""
    shape = np.shape(values)
    if len(shape) >= 1 and shape[0] == 0:
        raise ValueError(
            f"`{name}` holds no example (a batch of 0); keras_attn models need "
            f"at least one. Received: {name}.shape={tuple(shape)}"
        )
    if len(shape) == 2 and shape[1] == 0:
        raise ValueError(
            f"`{name}` has length 0; keras_attn models need at least one step. "
            f"Received: {name}.shape={tuple(shape)}"
        )


def check_length(name, values, max_length, axis=1):
    """`ValueError` when `values` is longer than `max_length` on `axis`."""
    shape = np.shape(values)
    if len(shape) > axis and shape[axis] > max_length:
        raise ValueError(
            f"`{name}` is longer than the model's max_sequence_length="
            f"{max_length}. Received: {name}.shape={tuple(shape)}"
        )


# === The safety net of a compiled step ===


# The other packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
