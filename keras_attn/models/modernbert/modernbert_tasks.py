"""ModernBERT's masked-LM head, the masked-LM model and the sequence
classifier."""

import keras
from keras import ops

from keras_attn._checks import check_choice
from keras_attn._checks import check_class_names
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn._checks import get_activation
from keras_attn._guard import IdSpec
from keras_attn.layers.activations import serialize_activation
from keras_attn.models._task import BackboneTask
from keras_attn.models.bert.bert_backbone import PACKED_INPUT_NAMES
from keras_attn.models.bert.bert_backbone import packed_inputs
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


def _check_backbone(backbone):
    if not isinstance(backbone, ModernBertBackbone):
        raise ValueError(
            "`backbone` must be a ModernBertBackbone (build_modernbert). "
            f"Received: backbone={type(backbone).__name__}"
        )
    return backbone


def _backbone_inputs():
    return {name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("token_ids", "padding_mask")}


class _ModernBertTask(BackboneTask):
    """The task models' shared base (`BackboneTask`)."""


@keras.saving.register_keras_serializable(package="keras_attn")
class ModernBertMaskedLM(_ModernBertTask):
    """ModernBERT with its masked-LM head (Hugging Face's
    `ModernBertForMaskedLM`): logits for every position.

    Args:
        backbone: a `ModernBertBackbone`.

    Inputs: the backbone's (`token_ids`, `padding_mask`).
    Outputs: `(B, T, V)` logits. Targets for `fit`: `(B, T)` token ids,
    weighted by a `sample_weight` that is 1 at the masked positions.

    Packed rows (docs/packing.md): with the backbone's optional
    `packed_segment_ids` and `positions` inputs, each example of a row is
    encoded alone (its own attention, its own rotary positions); the logits
    stay `(B, T, V)`, one per position of the row.
    """

    def __init__(self, backbone, **kwargs):
        config = _check_backbone(backbone).modernbert_config

        # === Layers ===
        mlm_head = ModernBertMaskedLMHead(
            config.vocabulary_size, activation=config.activation,
            layer_norm_epsilon=config.layer_norm_epsilon, dtype=backbone.dtype_policy,
            name="mlm_head")

        # === Functional Model ===
        inputs = _backbone_inputs()
        sequence = backbone(inputs)["sequence_output"]
        logits = mlm_head(sequence, embeddings=backbone.token_embedding.embeddings)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)  # a dict is read by name, never by position
        if packed_inputs(inputs) is None:  # the functional graph
            return super().call(inputs, training=training, mask=mask)
        backbone = self.backbone
        sequence = backbone(
            {name: inputs[name] for name in ("token_ids", "padding_mask") + PACKED_INPUT_NAMES},
            training=training)["sequence_output"]
        return self.get_layer("mlm_head")(sequence,
                                          embeddings=backbone.token_embedding.embeddings)

    def compute_output_spec(self, inputs, training=None, mask=None):
        # Known shapes: a symbolic run of the packed path would not be the
        # functional graph.
        if packed_inputs(inputs) is None:
            return super().compute_output_spec(inputs, training=training, mask=mask)
        token_ids = inputs["token_ids"]
        return keras.KerasTensor(
            (token_ids.shape[0], token_ids.shape[1],
             self.backbone.modernbert_config.vocabulary_size), self.compute_dtype)

    def optional_input_names(self):
        return PACKED_INPUT_NAMES  # the classifier reads the functional graph only

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

    def label_specs(self):
        return {None: IdSpec(0, self.backbone.modernbert_config.vocabulary_size,
                             "the vocabulary")}


POOLINGS = ("cls", "mean")


class _SequencePooling(keras.layers.Layer):
    """`(B, T, D)` -> `(B, D)`: the first token's vector (`"cls"`), or the
    mean over the tokens `padding_mask` marks real (`"mean"`; a row without
    any gives zeros).

    Private: only `ModernBertSequenceClassifier` builds it, from its own
    `pooling` argument.
    """

    def __init__(self, pooling, **kwargs):
        super().__init__(**kwargs)
        self.pooling = pooling

    def call(self, inputs, padding_mask):
        if self.pooling == "cls":
            return inputs[:, 0, :]  # (B, D)
        # Summed in float32: thousands of float16 vectors can overflow.
        real = ops.expand_dims(ops.cast(padding_mask, "bool"), -1)  # (B, T, 1)
        total = ops.sum(ops.where(real, ops.cast(inputs, "float32"), 0), axis=1)  # (B, D)
        count = ops.sum(ops.cast(real, "float32"), axis=1)  # (B, 1)
        return ops.cast(total / ops.maximum(count, 1), inputs.dtype)

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return (inputs_shape[0], inputs_shape[2])

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling}


@keras.saving.register_keras_serializable(package="keras_attn")
class ModernBertSequenceClassifier(_ModernBertTask):
    """A class for the whole input (Hugging Face's
    `ModernBertForSequenceClassification`).

    ```
    sequence_output (B, T, D) -> [CLS] vector or mean    "pooling"          (B, D)
     -> Dense D (no bias), activation                    "head_dense"
     -> LayerNorm (no bias)                              "head_layer_norm"
     -> Dropout                                          "classifier_dropout"
     -> Dense K                                          "classifier"       (B, K) logits
    ```

    Args:
        backbone: a `ModernBertBackbone`.
        num_classes: K.
        pooling: `"cls"`, the first token's vector, or `"mean"`, the mean
            over the real tokens (`padding_mask`); Hugging Face's
            `classifier_pooling`.
        dropout: rate before the classifier (Hugging Face's
            `classifier_dropout`, 0 in the release).
        class_names: optional name of each class, in output order (K distinct
            strings; `save_hf` writes them as Hugging Face's `id2label`).

    The head's activation and LayerNorm epsilon are the backbone's.

    Inputs: the backbone's (`token_ids`, `padding_mask`).
    Outputs: `(B, K)` logits. Targets for `fit`: `(B,)` int labels.

    Example:

    >>> import numpy as np
    >>> from keras_attn.models.modernbert import build_modernbert
    >>> backbone = build_modernbert("modernbert_base", vocabulary_size=50, num_layers=1,
    ...                             num_heads=2, hidden_dim=8, intermediate_dim=12,
    ...                             local_window=4, pad_id=0)
    >>> model = ModernBertSequenceClassifier(backbone, num_classes=3, pooling="mean")
    >>> ids = np.array([[2, 7, 9, 3, 0]])
    >>> tuple(model({"token_ids": ids, "padding_mask": ids != 0}).shape)
    (1, 3)
    """

    _task_args = ("num_classes", "pooling", "dropout", "class_names")

    def __init__(self, backbone, num_classes, pooling="cls", dropout=0.0, class_names=None,
                 **kwargs):
        config = _check_backbone(backbone).modernbert_config
        num_classes = check_positive_int("num_classes", num_classes)
        pooling = check_choice("pooling", pooling, POOLINGS)
        dropout = check_rate("dropout", dropout)
        class_names = check_class_names("class_names", class_names, num_classes)
        dtype = backbone.dtype_policy

        # === Layers ===
        sequence_pooling = _SequencePooling(pooling, dtype=dtype, name="pooling")
        head_dense = keras.layers.Dense(
            config.hidden_dim, use_bias=False, kernel_initializer=modernbert_initializer(),
            dtype=dtype, name="head_dense")
        head_activation = keras.layers.Activation(
            get_activation("activation", config.activation), dtype=dtype,
            name="head_activation")
        head_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, center=False, dtype=dtype,
            name="head_layer_norm")
        classifier_dropout = keras.layers.Dropout(dropout, dtype=dtype,
                                                  name="classifier_dropout")
        classifier = keras.layers.Dense(
            num_classes, kernel_initializer=modernbert_initializer(), dtype=dtype,
            name="classifier")

        # === Functional Model ===
        inputs = _backbone_inputs()
        sequence = backbone(inputs)["sequence_output"]
        pooled = sequence_pooling(sequence, padding_mask=inputs["padding_mask"])  # (B, D)
        features = head_layer_norm(head_activation(head_dense(pooled)))
        logits = classifier(classifier_dropout(features))  # (B, K)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone
        self.num_classes = num_classes
        self.pooling = pooling
        self.dropout = dropout
        self.class_names = class_names

    def compile(self, optimizer="adam", loss="auto", metrics="auto", **kwargs):
        """"auto": sparse cross-entropy on the logits, and accuracy."""
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if metrics == "auto":
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def label_specs(self):
        return {None: IdSpec(0, self.num_classes, "the classes")}
