"""The `EinsumDense` projections of the two attention layers."""

import keras

from keras_attn._clone import for_sublayer


def einsum_projection(owner, equation, output_shape, bias_axes, name, input_shape):
    """An `EinsumDense` built for `input_shape`, with the owning layer's
    initializers, regularizers and constraints (if it has them; each cloned
    for this projection), dtype policy and `use_bias` (`bias_axes=None` for a
    projection without bias in any case)."""
    layer = keras.layers.EinsumDense(
        equation,
        output_shape=output_shape,
        bias_axes=bias_axes if owner.use_bias else None,
        kernel_initializer=for_sublayer(owner.kernel_initializer, name),
        bias_initializer=for_sublayer(owner.bias_initializer, name),
        kernel_regularizer=for_sublayer(getattr(owner, "kernel_regularizer", None), name),
        bias_regularizer=for_sublayer(getattr(owner, "bias_regularizer", None), name),
        kernel_constraint=for_sublayer(getattr(owner, "kernel_constraint", None), name),
        bias_constraint=for_sublayer(getattr(owner, "bias_constraint", None), name),
        dtype=owner.dtype_policy,
        name=name,
    )
    layer.build(input_shape)
    return layer
