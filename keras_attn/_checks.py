"""Argument checks shared by the layers.

Every check raises `ValueError` with a message that ends in the received value
(`Received: num_heads=0`), the convention of Keras's own layers.
"""

import numbers

import keras

from keras_attn._activations import gelu
from keras_attn._activations import gelu_approximate


def check_positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return value
    # bool is an int subclass; `num_heads=True` is a bug, not a count.
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value <= 0
    ):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a positive integer. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def check_rate(name, value):
    """A dropout rate: a number in [0, 1)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a number in [0, 1). "
            f"Received: {name}={value!r}"
        )
    return float(value)


def check_positive_float(name, value):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value > 0
    ):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a positive number. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def check_bool(name, value):
    """A flag: True or False, not a truthy stand-in such as 1 or "yes"."""
    if not isinstance(value, bool):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be True or False. "
            f"Received: {name}={value!r}"
        )
    return value


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be one of {sorted(choices)}. "
            f"Received: {name}={value!r}"
        )
    return value


def check_class_names(name, value, num_classes):
    """The name of each of a classifier's `num_classes` outputs, in output
    order: a list (or tuple) of distinct, non-empty strings of one line each
    (a line of labels.txt, a key of Hugging Face's `label2id`), returned as
    a list; None stays None."""
    if value is None:
        return None
    names = list(value) if isinstance(value, (list, tuple)) else None
    if (names is None or len(names) != num_classes
            or not all(isinstance(n, str) and n and "\n" not in n and "\r" not in n
                       for n in names)
            or len(set(names)) != len(names)):
        raise ValueError(
            f"Invalid value for argument `{name}`: it must be a list of the model's "
            f"{num_classes} classes: distinct, non-empty strings of one line each, in output "
            f"order. Received: {name}={value!r}"
        )
    return names


def check_flash_attention(value):
    if value not in (None, True, False):
        raise ValueError(
            "Invalid value for argument `flash_attention`: it must be None, True or False. "
            f"Received: flash_attention={value!r}"
        )
    return value


def get_activation(name, value):
    """`keras.activations.get` with an error that names the argument;
    `"gelu"` is `keras_attn.layers.activations.gelu` (the same function,
    computed through `erf`)."""
    if value == "gelu":
        return gelu
    if value == "gelu_approximate":
        return gelu_approximate
    try:
        return keras.activations.get(value)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"`{name}` must be the name of a Keras activation or a callable "
            f"({error}). Received: {name}={value!r}"
        ) from None


def static_dim(dim):
    """`dim` as an int when it is known, else None.

    Traced shapes hold None (TensorFlow) or symbolic dimensions (JAX's shape
    polymorphism) where the size is not known yet; neither can be compared.
    """
    return int(dim) if isinstance(dim, numbers.Integral) else None


def check_static_shape(name, tensor, expected, what):
    """Checks every statically known dim of `tensor` against `expected`.

    `expected` holds ints or None (unknown); a dim of 1 in `tensor` always
    passes (it broadcasts). Dynamic dims are left to the backend.
    """
    shape = tuple(static_dim(d) for d in tensor.shape)
    expected = tuple(static_dim(d) for d in expected)
    if len(shape) != len(expected):
        raise ValueError(
            f"`{name}` must have rank {len(expected)} ({what}). "
            f"Received: {name}.shape={shape}"
        )
    for got, want in zip(shape, expected):
        if got is None or want is None or got == 1 or got == want:
            continue
        raise ValueError(
            f"`{name}` must broadcast to {what} = {tuple(expected)}. "
            f"Received: {name}.shape={shape}"
        )

# The packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
