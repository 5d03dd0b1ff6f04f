"""What the model families share to check packed rows (docs/packing.md)
beyond the layers' own checks (`keras_attn.ops.masking`)."""

import numpy as np
from keras import ops

from keras_attn._guard import concrete_value


def refused(bad, name, message):
    """`bad` `(B,)`, True for a row that breaks a rule of packed rows.

    Where its values exist (an eager call) the first bad row is a
    `ValueError` naming `name`, `message(row)` saying why and what was
    received, and None is returned; inside a traced graph, where nothing can
    raise, `bad` itself: the rows for the caller to make NaN (`nan_where`).
    """
    found = concrete_value(bad)
    if found is None:
        return bad
    if found.any():
        raise ValueError(f"Invalid value for argument `{name}`: "
                         f"{message(int(np.argmax(found)))}")
    return None


def any_invalid(*invalid):
    """The rows `(B,)` that any of `invalid` (each `(B,)` or None) marks;
    None when none can be invalid."""
    merged = None
    for bad in invalid:
        if bad is not None:
            merged = bad if merged is None else ops.logical_or(merged, bad)
    return merged


def packed_inputs(inputs, names):
    """`{name: value}` of the optional packed inputs `names` of a dict of
    inputs that holds them all, None when it holds none of them (the model
    then runs its functional graph); some without the others is a
    `ValueError`."""
    if not isinstance(inputs, dict):
        return None
    present = [name for name in names if inputs.get(name) is not None]
    if not present:
        return None
    if len(present) < len(names):
        raise ValueError(
            "Invalid value for argument `inputs`: packed rows need all of "
            f"{list(names)}. Received: inputs with keys {sorted(inputs)}"
        )
    return {name: inputs[name] for name in names}
