"""BERT task models: pretraining (masked LM + next sentence), sequence
classification and token classification.

Each is a functional `keras.Model` around a `BertBackbone` whose `compile`
fills in the loss and metrics when they are left out, so
`model.compile(optimizer); model.fit(dataset)` trains it.
"""

import keras

from keras_attn._guard import IdSpec
from keras_attn._guard import check_ids
from keras_attn._checks import check_bool
from keras_attn._checks import check_class_names
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn.models._task import BackboneTask
from keras_attn.models.bert.bert_backbone import PACKED_INPUT_NAMES
from keras_attn.models.bert.bert_backbone import BertBackbone
from keras_attn.models.bert.bert_backbone import bert_initializer
from keras_attn.models.bert.bert_backbone import packed_inputs
from keras_attn.models.bert.bert_heads import BertMaskedLMHead
from keras_attn.models.bert.bert_heads import example_pooled_outputs
from keras_attn.training.metrics import Perplexity


def _check_backbone(backbone):
    if not isinstance(backbone, BertBackbone):
        raise ValueError(
            "`backbone` must be a BertBackbone (from build_bert). "
            f"Received: backbone={type(backbone).__name__}"
        )
    return backbone


def _backbone_inputs():
    return {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }


def _sparse_ce(**kwargs):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)


class _BertTask(BackboneTask):
    """The task models' shared base (`BackboneTask`), with class labels.
    Inputs and labels are checked as `keras_attn.models._guarded.GuardedModel`
    says."""

    def label_specs(self):
        return {None: IdSpec(0, self.num_classes, "the classes")}


@keras.saving.register_keras_serializable(package="keras_attn")
class BertPretrainer(_BertTask):
    """BERT pretraining: masked LM and next sentence prediction.

    Inputs: the backbone's `token_ids`, `segment_ids`, `padding_mask` and
    `mask_positions` `(B, P)` (the positions the masked LM predicts; padded
    entries carry weight 0 in the targets' sample weights).

    Outputs: `{"mlm": (B, P, V) logits, "nsp": (B, 2) logits}`; class 1 of
    `nsp` means "B is the sentence that follows A".

    Packed rows (docs/packing.md): with the backbone's optional
    `packed_segment_ids` and `positions` inputs, `mask_positions` index the
    packed row, and `nsp` is `(B, K, 2)`, one prediction per example of the
    row (`K = max_segments`), from each example's own `[CLS]`; its targets
    are `(B, K)` with sample weights 1 for the row's examples and 0 past
    them. Each example gets the outputs, loss and gradient it gets alone.

    Args:
        backbone: a `BertBackbone`.
        max_segments: the most examples a packed row holds (the `K` of the
            packed `nsp` output); unused for unpacked rows.
        next_sentence: False leaves out the next-sentence head: the model
            is a masked LM alone (RoBERTa's pretraining, transformers'
            `BertForMaskedLM` / `RobertaForMaskedLM`), its outputs
            `{"mlm": ...}` and its targets `{"mlm": ...}`.

    The masked-LM decoder is the backbone's token embedding table (one
    variable, tied as in the original BERT) plus an output bias.

    Targets for `fit`: `y = {"mlm": (B, P) original ids, "nsp": (B,)}`,
    `sample_weight = {"mlm": (B, P) 1/0, "nsp": (B,) ones}` (what
    `keras_attn.data.text.pretraining_dataset` yields).

    Example:

    >>> from keras_attn.models.bert import build_bert
    >>> backbone = build_bert("bert_tiny", vocabulary_size=100, num_layers=1,
    ...                       max_sequence_length=16)
    >>> model = BertPretrainer(backbone)
    >>> {name: tuple(t.shape) for name, t in model.output.items()}
    {'mlm': (None, None, 100), 'nsp': (None, 2)}
    """

    _task_args = ("max_segments", "next_sentence")

    def __init__(self, backbone, max_segments=8, next_sentence=True, **kwargs):
        backbone = _check_backbone(backbone)
        max_segments = check_positive_int("max_segments", max_segments)
        next_sentence = check_bool("next_sentence", next_sentence)
        config = backbone.bert_config

        # === Layers ===
        mlm_head = BertMaskedLMHead(
            config.vocabulary_size,
            activation=config.activation,
            layer_norm_epsilon=config.layer_norm_epsilon,
            kernel_initializer=bert_initializer(),
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        nsp_dense = keras.layers.Dense(
            2,
            kernel_initializer=bert_initializer(),
            dtype=backbone.dtype_policy,
            name="nsp_dense",
        ) if next_sentence else None

        # === Functional Model ===
        inputs = _backbone_inputs()
        inputs["mask_positions"] = keras.Input(
            shape=(None,), dtype="int32", name="mask_positions"
        )
        outputs = backbone(
            {name: inputs[name] for name in ("token_ids", "segment_ids", "padding_mask")}
        )
        mlm = mlm_head(
            outputs["sequence_output"],
            inputs["mask_positions"],
            embeddings=backbone.token_embedding.embeddings,
        )
        heads = {"mlm": mlm}
        if next_sentence:
            heads["nsp"] = nsp_dense(outputs["pooled_output"])
        super().__init__(inputs=inputs, outputs=heads, **kwargs)

        # === Config ===
        self.backbone = backbone
        self.max_segments = max_segments
        self.next_sentence = next_sentence

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)  # a dict is read by name, never by position
        packed = packed_inputs(inputs)
        if packed is None:  # the functional graph, as without packing
            return super().call(inputs, training=training, mask=mask)
        backbone = self.backbone
        outputs = backbone(
            {name: inputs[name] for name in
             ("token_ids", "segment_ids", "padding_mask") + PACKED_INPUT_NAMES},
            training=training,
        )
        mlm = self.get_layer("mlm_head")(
            outputs["sequence_output"],
            inputs["mask_positions"],
            embeddings=backbone.token_embedding.embeddings,
        )
        if not self.next_sentence:
            return {"mlm": mlm}
        pooled = example_pooled_outputs(
            outputs["sequence_output"], packed[0], backbone.get_layer("pooled_dense"),
            self.max_segments)
        return {"mlm": mlm, "nsp": self.get_layer("nsp_dense")(pooled)}

    def compute_output_spec(self, inputs, training=None, mask=None):
        # The outputs' shapes are known; a symbolic run of the packed path
        # would not be the functional graph (and PyTorch's fallback for it
        # feeds ones, which are no packing).
        if packed_inputs(inputs) is None:
            return super().compute_output_spec(inputs, training=training, mask=mask)
        batch = inputs["token_ids"].shape[0]
        dtype = self.compute_dtype
        specs = {"mlm": keras.KerasTensor(tuple(inputs["mask_positions"].shape)
                                          + (self.backbone.bert_config.vocabulary_size,), dtype)}
        if self.next_sentence:
            specs["nsp"] = keras.KerasTensor((batch, self.max_segments, 2), dtype)
        return specs

    def optional_input_names(self):
        return PACKED_INPUT_NAMES  # the classifiers read the functional graph only

    def label_specs(self):
        specs = {"mlm": IdSpec(0, self.backbone.bert_config.vocabulary_size, "the vocabulary")}
        if self.next_sentence:
            specs["nsp"] = IdSpec(0, 2, "0 random, 1 next")
        return specs

    def check_arrays(self, named):
        positions, tokens = named.get("mask_positions"), named.get("token_ids")
        if positions is not None and tokens is not None and tokens.ndim == 2:
            check_ids("mask_positions", positions,
                      IdSpec(0, tokens.shape[1], "positions of token_ids"))

    def compile(self, optimizer="adam", loss="auto", metrics="auto",
                weighted_metrics="auto", **kwargs):
        """`keras.Model.compile`; "auto" is the masked-LM cross-entropy
        averaged over the real predictions plus the NSP cross-entropy (with
        `next_sentence`), with masked-LM accuracy and perplexity and NSP
        accuracy as metrics."""
        if loss == "auto":
            loss = {
                "mlm": _sparse_ce(reduction="mean_with_sample_weight"),
                # Per example: with packed rows the slots past a row's last
                # example carry weight 0 (unpacked, every weight is 1: the mean).
                "nsp": _sparse_ce(reduction="mean_with_sample_weight"),
            }
            if not self.next_sentence:
                del loss["nsp"]
        if metrics == "auto":
            metrics = None
        if weighted_metrics == "auto":
            weighted_metrics = {
                "mlm": [
                    keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                    Perplexity(name="perplexity"),
                ],
                "nsp": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            }
            if not self.next_sentence:
                del weighted_metrics["nsp"]
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            **kwargs,
        )


class _BertClassifier(_BertTask):
    """A backbone output (`_output`) -> Dropout -> Dense(num_classes): the
    construction the sequence and token classifiers share."""

    _task_args = ("num_classes", "dropout", "class_names")
    _output = None

    def __init__(self, backbone, num_classes, dropout=0.1, class_names=None, **kwargs):
        backbone = _check_backbone(backbone)
        num_classes = check_positive_int("num_classes", num_classes)
        dropout = check_rate("dropout", dropout)
        class_names = check_class_names("class_names", class_names, num_classes)

        # === Layers ===
        classifier_dropout = keras.layers.Dropout(
            dropout, dtype=backbone.dtype_policy, name="classifier_dropout"
        )
        classifier = keras.layers.Dense(
            num_classes,
            kernel_initializer=bert_initializer(),
            dtype=backbone.dtype_policy,
            name="classifier",
        )

        # === Functional Model ===
        inputs = _backbone_inputs()
        features = backbone(inputs)[self._output]
        logits = classifier(classifier_dropout(features))
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone
        self.num_classes = num_classes
        self.dropout = dropout
        self.class_names = class_names


@keras.saving.register_keras_serializable(package="keras_attn")
class BertSequenceClassifier(_BertClassifier):
    """A class for the whole input: pooled `[CLS]` -> Dropout -> Dense.

    Args:
        backbone: a `BertBackbone`.
        num_classes: K.
        dropout: rate before the classifier (0.1 in BERT fine-tuning).
        class_names: optional name of each class, in output order (K distinct
            strings; `save_hf` writes them as Hugging Face's `id2label`).

    Outputs: `(B, K)` logits. Targets for `fit`: `(B,)` int labels.
    """

    _output = "pooled_output"  # (B, D) -> logits (B, K)

    def compile(self, optimizer="adam", loss="auto", metrics="auto", **kwargs):
        """"auto": sparse cross-entropy on logits and accuracy."""
        if loss == "auto":
            loss = _sparse_ce()
        if metrics == "auto":
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)


@keras.saving.register_keras_serializable(package="keras_attn")
class BertTokenClassifier(_BertClassifier):
    """A class per token (tagging): sequence output -> Dropout -> Dense.

    Args:
        backbone: a `BertBackbone`.
        num_classes: K.
        dropout: rate before the classifier.
        class_names: optional name of each class, in output order (K distinct
            strings; `save_hf` writes them as Hugging Face's `id2label`).

    Outputs: `(B, T, K)` logits. Targets for `fit`: `(B, T)` int labels with
    `sample_weight` = the padding mask, so that padding counts in neither
    the loss nor the accuracy.
    """

    _output = "sequence_output"  # (B, T, D) -> logits (B, T, K)

    def compile(self, optimizer="adam", loss="auto", metrics="auto",
                weighted_metrics="auto", **kwargs):
        """"auto": cross-entropy averaged over real tokens, token accuracy."""
        if loss == "auto":
            loss = _sparse_ce(reduction="mean_with_sample_weight")
        if metrics == "auto":
            metrics = None
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            **kwargs,
        )


