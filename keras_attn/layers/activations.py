"""Activations the layers resolve by name."""

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


def serialize_activation(activation):
    """`keras.activations.serialize`, except that the layers' exact GELU is
    written as `"gelu"` (the name it was given by), so configs stay the same
    as with Keras's activation of that name."""
    if activation is gelu:
        return "gelu"
    return keras.activations.serialize(activation)
