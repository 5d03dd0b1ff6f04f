"""The `EinsumDense` projections of the two attention layers."""

import keras


def einsum_projection(owner, equation, output_shape, bias_axes, name, input_shape):
    """An `EinsumDense` built for `input_shape`, with the owning layer's
    initializers, regularizers (if it has them), dtype policy and `use_bias`
    (`bias_axes=None` for a projection without bias in any case)."""
    layer = keras.layers.EinsumDense(
        equation,
        output_shape=output_shape,
        bias_axes=bias_axes if owner.use_bias else None,
        kernel_initializer=owner.kernel_initializer,
        bias_initializer=owner.bias_initializer,
        kernel_regularizer=getattr(owner, "kernel_regularizer", None),
        bias_regularizer=getattr(owner, "bias_regularizer", None),
        dtype=owner.dtype_policy,
        name=name,
    )
    layer.build(input_shape)
    return layer
