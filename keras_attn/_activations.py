"""Activations the layers resolve by name (`keras_attn._checks.get_activation`).

Below the layers, so that the argument checks find them without importing
`keras_attn.layers`; `keras_attn.layers.activations` is their public home.
"""

import keras
from keras import ops

_SQRT_HALF = 0.7071067811865476


@keras.saving.register_keras_serializable(package="keras_attn", name="gelu")
def gelu(x):
    """The exact GELU, `x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))`, as BERT
    and ViT define it (Hendrycks & Gimpel, 2016), written with `erf`.

    The layers use it for the name `"gelu"`. It is the function Keras's own
    `"gelu"` computes, to float32 round-off (within 1e-6: below x = -5,
    where GELU is under 1e-6, `1 + erf` cancels and the values round to
    about 0, as in BERT's original code), but cheaper under XLA: Keras goes through `erfc`, whose XLA lowering
    evaluates two rational approximations and selects between them, where
    `erf` is one. Measured in a BERT (bert_small shapes) training step on
    the CPU, against Keras's GELU in the same process: 2.4% faster with JAX,
    the same with TensorFlow (`benchmarks/RESULTS.md`).

    Example:

    >>> import numpy as np
    >>> [round(float(v), 4) for v in gelu(np.array([-1.0, 0.0, 1.0]))]
    [-0.1587, 0.0, 0.8413]
    """
    x = ops.convert_to_tensor(x)
    return 0.5 * x * (1.0 + ops.erf(x * ops.cast(_SQRT_HALF, x.dtype)))


@keras.saving.register_keras_serializable(package="keras_attn", name="gelu_approximate")
def gelu_approximate(x):
    """GELU's tanh approximation,
    `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`: what keras-hub's
    BERT computes, and Hugging Face's `"gelu_new"` / `"gelu_pytorch_tanh"`.
    It differs from the exact GELU by up to about 5e-4.

    Example:

    >>> import numpy as np
    >>> [round(float(v), 4) for v in gelu_approximate(np.array([-1.0, 0.0, 1.0]))]
    [-0.1588, 0.0, 0.8412]
    """
    return keras.activations.gelu(x, approximate=True)


def serialize_activation(activation):
    """`keras.activations.serialize`, except that the layers' exact GELU is
    written as `"gelu"` (the name it was given by), so configs stay the same
    as with Keras's activation of that name."""
    if activation is gelu:
        return "gelu"
    if activation is gelu_approximate:
        return "gelu_approximate"
    return keras.activations.serialize(activation)

# The packages that register classes, once this module is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
