"""ModernBERT's masked-LM head and the masked-LM model."""

import keras
from keras import ops

from keras_attn import _keras_compat
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import get_activation
from keras_attn._guard import GuardedModel
from keras_attn._guard import IdSpec
from keras_attn.layers.activations import serialize_activation
from keras_attn.models._config import dtype_policy_with_quantization
from keras_attn.models.modernbert.modernbert_backbone import ModernBertBackbone
from keras_attn.models.modernbert.modernbert_backbone import modernbert_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class ModernBertMaskedLMHead(keras.layers.Layer):
    """Token logits at every position, ModernBERT's prediction head.

    ```
    sequence (B, T, D) -> Dense D (no bias), activation,   "transform_dense"
      LayerNorm (no bias)                                   "transform_layer_norm"
     -> x @ embeddings^T + output_bias                      (B, T, V) logits
    ```

    The decoder matrix is the token embedding table passed at call time
    (`embeddings=`): input and output embeddings are one variable, as in the
    released checkpoints; the layer owns the transform and the `(V,)` bias.

    Args:
        vocabulary_size: V.
        activation: transform activation (`"gelu"`: exact GELU).
        layer_norm_epsilon: epsilon of the transform LayerNorm.
        kernel_initializer: initializer of the transform kernel.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, T, D)` encoder output.
        embeddings: `(V, D)` decoder matrix.

    Returns:
        `(B, T, V)` logits.
    """

    def __init__(self, vocabulary_size, activation="gelu", layer_norm_epsilon=1e-5,
                 kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.activation = get_activation("activation", activation)
        self.layer_norm_epsilon = check_positive_float(
            "layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or modernbert_initializer())

    def build(self, inputs_shape, embeddings_shape=None):
        width = inputs_shape[-1]
        self.transform_dense = keras.layers.Dense(
            width, use_bias=False, kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy, name="transform_dense")
        self.transform_dense.build(inputs_shape)
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, center=False, dtype=self.dtype_policy,
            name="transform_layer_norm")
        self.transform_layer_norm.build(inputs_shape)
        self.output_bias = self.add_weight(
            shape=(self.vocabulary_size,), initializer="zeros", name="output_bias")
        self.built = True

    def call(self, inputs, embeddings):
        embeddings = ops.convert_to_tensor(embeddings)
        if embeddings.shape[0] is not None and embeddings.shape[0] != self.vocabulary_size:
            raise ValueError(
                f"`embeddings` must have vocabulary_size={self.vocabulary_size} "
                f"rows. Received: embeddings.shape={tuple(embeddings.shape)}"
            )
        x = self.transform_layer_norm(self.activation(self.transform_dense(inputs)))
        embeddings = ops.cast(embeddings, x.dtype)
        return ops.matmul(x, ops.transpose(embeddings)) + ops.cast(self.output_bias, x.dtype)

    def compute_output_shape(self, inputs_shape, embeddings_shape=None):
        return (*inputs_shape[:-1], self.vocabulary_size)

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "activation": serialize_activation(self.activation),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class ModernBertMaskedLM(GuardedModel, keras.Model):
    """ModernBERT with its masked-LM head (Hugging Face's
    `ModernBertForMaskedLM`): logits for every position.

    Args:
        backbone: a `ModernBertBackbone`.

    Inputs: the backbone's (`token_ids`, `padding_mask`).
    Outputs: `(B, T, V)` logits. Targets for `fit`: `(B, T)` token ids,
    weighted by a `sample_weight` that is 1 at the masked positions.
    """

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, ModernBertBackbone):
            raise ValueError(
                "`backbone` must be a ModernBertBackbone (build_modernbert). "
                f"Received: backbone={type(backbone).__name__}"
            )
        config = backbone.modernbert_config

        # === Layers ===
        mlm_head = ModernBertMaskedLMHead(
            config.vocabulary_size, activation=config.activation,
            layer_norm_epsilon=config.layer_norm_epsilon, dtype=backbone.dtype_policy,
            name="mlm_head")

        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name)
                  for name in ("token_ids", "padding_mask")}
        sequence = backbone(inputs)["sequence_output"]
        logits = mlm_head(sequence, embeddings=backbone.token_embedding.embeddings)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone

    def compile(self, optimizer="adam", loss="auto", metrics="auto",
                weighted_metrics="auto", **kwargs):
        """"auto": cross-entropy on the logits averaged over the positions
        whose `sample_weight` is not 0 (the masked ones), and their
        accuracy."""
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight")
        if metrics == "auto":
            metrics = None
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                        weighted_metrics=weighted_metrics, **kwargs)

    def input_specs(self):
        return self.backbone.input_specs()

    def max_length(self):
        return self.backbone.max_length()

    def label_specs(self):
        return {None: IdSpec(0, self.backbone.modernbert_config.vocabulary_size,
                             "the vocabulary")}

    def outputs_are_logits(self):
        return True

    def get_config(self):
        backbone = keras.saving.serialize_keras_object(self.backbone)
        backbone["config"]["dtype"] = keras.saving.serialize_keras_object(
            dtype_policy_with_quantization(self, self.backbone.dtype_policy))
        return {"name": self.name, "trainable": self.trainable, "backbone": backbone}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        model = cls(**config)
        _keras_compat.resolve_policy_maps(model)
        return model
