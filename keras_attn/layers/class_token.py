"""A learned [CLS] token prepended to a sequence (BERT-style pooling for ViT)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attn")
class ClassToken(keras.layers.Layer):
    """Prepends one learned `(D,)` vector to every sequence of the batch.

    ViT classifies from this token: after the encoder, its output is the
    image representation (Dosovitskiy et al., eq. 1, `z_0^0 = x_class`).

    Args:
        initializer: initializer of the token. The reference ViT starts it at
            zeros; Hugging Face uses a truncated normal.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)`.

    Returns:
        `(B, T + 1, D)`, the token at position 0.

    Example:

    >>> import numpy as np
    >>> tuple(ClassToken()(np.ones((2, 4, 8), "float32")).shape)
    (2, 5, 8)

    References:
        Dosovitskiy et al., "An Image is Worth 16x16 Words", 2021, section 3.1.
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        if len(inputs_shape) != 3:
            raise ValueError(
                "`inputs` must have rank 3, (B, T, D). "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.token = self.add_weight(
            name="token",
            shape=(inputs_shape[-1],),
            initializer=self.initializer,
            trainable=True,
        )
        self.built = True

    def call(self, inputs):
        batch_size = ops.shape(inputs)[0]
        token = ops.cast(self.token, inputs.dtype)[None, None, :]  # (1, 1, D)
        token = ops.broadcast_to(token, (batch_size, 1, ops.shape(inputs)[-1]))
        return ops.concatenate([token, inputs], axis=1)  # (B, T + 1, D)

    def compute_output_shape(self, inputs_shape):
        length = inputs_shape[1]
        length = None if length is None else length + 1
        return (inputs_shape[0], length, inputs_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config
