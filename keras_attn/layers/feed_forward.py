"""Position-wise feed-forward network."""

import keras

from keras_attn._clone import for_sublayer

from keras_attn._checks import check_bool
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import get_activation
from keras_attn.layers.activations import serialize_activation


@keras.saving.register_keras_serializable(package="keras_attn")
class FeedForward(keras.layers.Layer):
    """`act(x W1 + b1) W2 + b2`, applied to every position alike, or with
    `gated=True` the gated linear unit `(act(x W + b) * (x V + c)) W2 + b2`.

    ReLU in the Transformer, GELU in BERT and ViT, Swish in the Conformer;
    gated, GELU is GeGLU (ModernBERT) and SiLU / Swish is SwiGLU (Llama,
    DINOv2's giant model).

    Args:
        intermediate_dim: width of the hidden layer (`d_ff`).
        activation: a Keras activation name or callable. `"gelu"` is the exact
            (erf) GELU.
        dropout: dropout rate on the output.
        activation_dropout: dropout rate after the activation (ViT, Conformer).
        output_dim: output width; defaults to the input width.
        use_bias: whether both projections have biases.
        gated: whether the hidden layer is a gated linear unit (Shazeer,
            "GLU Variants Improve Transformer", 2020): one input projection
            `intermediate_dense` of width `2 * intermediate_dim`, whose
            kernel columns `[:intermediate_dim]` (`W`) go through the
            activation and columns `[intermediate_dim:]` (`V`) multiply them
            unactivated. That is the order of ModernBERT's `mlp.Wi`
            (`input, gate = Wi(x).chunk(2)`, `act(input) * gate`): its
            weights copy as they are. Llama's and DINOv2's `gate_proj`
            (activated) and `up_proj` are the first and the second half.
        kernel_initializer: initializer of both kernels.
        bias_initializer: initializer of both biases.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(..., D)`.
        training: whether dropout is active.

    Returns:
        `(..., output_dim)`.

    Example:

    >>> import numpy as np
    >>> tuple(FeedForward(32, activation="gelu")(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        activation_dropout=0.0,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        gated=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.activation = get_activation("activation", activation)
        self.dropout = check_rate("dropout", dropout)
        self.activation_dropout = check_rate("activation_dropout", activation_dropout)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.use_bias = bool(use_bias)
        self.gated = check_bool("gated", gated)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        def dense(units, name):
            return keras.layers.Dense(
                units,
                use_bias=self.use_bias,
                kernel_initializer=for_sublayer(self.kernel_initializer, name),
                bias_initializer=for_sublayer(self.bias_initializer, name),
                dtype=self.dtype_policy,
                name=name,
            )

        width = self.intermediate_dim * (2 if self.gated else 1)
        self.intermediate_dense = dense(width, "intermediate_dense")
        self.intermediate_dense.build(inputs_shape)
        self.output_dense = dense(self.output_dim or inputs_shape[-1], "output_dense")
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.activation_dropout_layer = keras.layers.Dropout(
            self.activation_dropout, dtype=self.dtype_policy, name="activation_dropout"
        )
        self.output_dropout_layer = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="output_dropout"
        )
        self.built = True

    def call(self, inputs, training=None):
        x = self.intermediate_dense(inputs)  # (..., F), gated (..., 2F)
        if self.gated:
            x = self.activation(x[..., : self.intermediate_dim]) * x[..., self.intermediate_dim:]
        else:
            x = self.activation(x)
        x = self.activation_dropout_layer(x, training=training)
        x = self.output_dense(x)
        return self.output_dropout_layer(x, training=training)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": serialize_activation(self.activation),
                "dropout": self.dropout,
                "activation_dropout": self.activation_dropout,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "gated": self.gated,
            }
        )
        return config
