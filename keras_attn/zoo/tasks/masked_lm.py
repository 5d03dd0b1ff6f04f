"""masked_lm: BERT pretraining (masked LM + next sentence prediction).

Data: documents (the pydoc corpus embedded in CPython, or a tfds text set);
the first `test_documents` are the test set, the next `validation_documents`
the validation set, the rest train. A WordPiece vocabulary is learned on the
training sentences (the model's vocabulary is its size), next-sentence pairs
are drawn once with the seed. Training batches of epoch e: a permutation
keyed by (seed, e) and masks drawn by stateless ops keyed by seed, e and the
batch index (15% of tokens, 80/10/10). Held-out masks are fixed (epoch 0).
With `data.packing`, the training examples of epoch e are packed into rows
of `sequence_length` (`keras_attn.data.pack_sequences`, best-fit decreasing
over the whole epoch keyed by (seed, e)) with BERT's packed inputs
(`packed_segment_ids`, `positions`, one NSP target per example); the
validation and test batches stay padded, one example per row, so the
metrics are those of the padded recipe (docs/packing.md).
Metrics: held-out masked-LM loss, accuracy and perplexity, NSP accuracy.
Export: the pretrainer, `serve(token_ids, segment_ids, padding_mask,
mask_positions) -> {"mlm": (B, P, V) logits, "nsp": (B, 2) logits}`; the
run directory gets `vocab.txt`.

Family `modernbert` (a recipe in models/modernbert/): a
`ModernBertMaskedLM` on the same examples, vocabulary, masks and packing
(the held-out masks are the BERT recipe's), without next-sentence
prediction and without segment ids: a batch is `{"token_ids",
"padding_mask"}` (with packing also `packed_segment_ids` and `positions`),
the targets `(B, T)` ids weighted 1 at the masked positions and 0
elsewhere, so the masked-LM loss is the mean over the same predictions.
Metrics: masked-LM loss, accuracy and perplexity. Export:
`serve(token_ids, padding_mask) -> {"mlm": (B, T, V) logits}`.

`data.next_sentence: false` (RoBERTa's objective; a recipe in models/bert/
with RoBERTa's positions, `model.overrides.padding_id` the vocabulary's
`[PAD]`): no sentence pairs and no next-sentence prediction. Each example
is one segment `[CLS] text [SEP]`, a document's sentences in order joined
while they fit (`text.make_document_segments`, RoBERTa's DOC-SENTENCES;
held-out examples the same way from their documents), masked as above
(new masks every epoch); the bert family's model is
`BertPretrainer(next_sentence=False)`, its batches without the "nsp"
target, its export `{"mlm": ...}` alone. ModernBERT takes the same
examples. Not with `data.packing`.
"""

import functools
from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.families import text_family
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks._bert_text import TextFamilyTask
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import process_positions
from keras_attn._base.quiet_tensorflow import traced_as_written

# The pretrainer's NSP slots per row when nothing is packed (its default).
UNPACKED_MAX_SEGMENTS = 8


class MaskedLMData(schema.Data):
    """BERT pretraining, masked LM + next sentence. Embedded: the English
    documentation inside CPython (`pydoc_data.topics`); tfds: any text set,
    each example a document."""

    sequence_length: int = field(128, ge=8, le=schema.MAX_SIZE, description="`[CLS] A [SEP] B [SEP]` length.")
    vocabulary_size: int = field(8000, ge=16, le=schema.MAX_SIZE, description="WordPieces to learn from the training "
                                                         "documents (the model gets the learned "
                                                         "size).")
    mask_rate: float = field(0.15, gt=0, lt=1, description="Share of the tokens masked.")
    max_predictions: Optional[int] = field(
        None, ge=1, le=schema.MAX_SIZE, description="Masked positions per sequence (null: round(sequence_length * "
                                "mask_rate) + 4).")
    test_documents: int = field(8, ge=2, le=schema.MAX_SIZE, description="Documents held out for the test (the "
                                                     "first ones).")
    validation_documents: int = field(4, ge=0, le=schema.MAX_SIZE, description="The next ones, for validation: 0 "
                                                           "or at least 2.")
    split: str = field("train", only="tfds", description="The split the documents come from.")
    text_key: str = field("text", only="tfds", description="The feature with the text.")
    max_documents: Optional[int] = field(
        None, ge=1, le=schema.MAX_SIZE, description="Read only the first ones (null: all; quick experiments).")
    next_sentence: bool = field(
        True, description="false: RoBERTa's objective: no sentence pairs and no next-sentence "
                          "prediction; each example one segment, a document's sentences in "
                          "order joined up to `sequence_length` (the bert family's model: "
                          "`BertPretrainer(next_sentence=False)`). Not with `packing`.")
    packing: bool = field(
        False, description="Train on packed rows: each epoch's examples packed into rows of "
                           "`sequence_length` (best-fit decreasing over the epoch, a function "
                           "of the seed and the epoch; `training.batch_size` counts rows), "
                           "with BERT's packed inputs. Validation and test stay padded, one "
                           "example per row: the metrics mean what they mean unpacked.")

    @pydantic.model_validator(mode="after")
    def _single_segments_unpacked(self):
        if not self.next_sentence and self.packing:
            raise schema.key_error("next_sentence", "false is not supported with "
                                   "`data.packing` true (packed rows carry sentence pairs)",
                                   self.next_sentence)
        return self

    @pydantic.field_validator("validation_documents")
    @classmethod
    def _negatives_need_two(cls, value):
        if value == 1:
            raise schema.key_error("", "must be 0 or at least 2 (next-sentence negatives come "
                                       "from another document)", value)
        return value


class MaskedLMEvaluation(schema.Evaluation):
    metric: Literal["mlm_loss", "mlm_accuracy", "mlm_perplexity", "nsp_accuracy"] = field(
        "mlm_loss", description="On the held-out documents, masks fixed by the seed.")


@functools.lru_cache(maxsize=None)
def masked_lm_only_evaluation(prefix):
    """The `Evaluation` of a family whose masked LM does not predict the
    next sentence, named after its config (`ModernBertMaskedLMEvaluation`)."""
    return pydantic.create_model(
        f"{prefix}MaskedLMEvaluation", __base__=schema.Evaluation,
        metric=(Literal["mlm_loss", "mlm_accuracy", "mlm_perplexity"], field(
            "mlm_loss", description="On the held-out documents, masks fixed by the seed "
                                    "(no next-sentence prediction).")))


class MaskedLM(TextFamilyTask):
    name = "masked_lm"
    Data = MaskedLMData
    Evaluation = MaskedLMEvaluation
    embedded_data = "CPython pydoc topics"
    metric_names = {"mlm_accuracy": "MLM accuracy", "mlm_loss": "held-out MLM loss",
                    "mlm_perplexity": "MLM perplexity", "nsp_accuracy": "NSP accuracy"}

    @classmethod
    def evaluation_class(cls, family):
        if text_family(family).next_sentence_prediction:
            return cls.Evaluation
        return masked_lm_only_evaluation(schema.family_api(family)[2].__name__
                                         .removesuffix("Config"))

    def __init__(self, recipe):
        super().__init__(recipe)
        if not self.next_sentence and self.evaluation["metric"] == "nsp_accuracy":
            raise ValueError(
                "Recipe key `data.next_sentence` is false: there is no next-sentence "
                "prediction for evaluation.metric='nsp_accuracy' to measure. "
                "Received: data.next_sentence=False")

    @property
    def next_sentence(self):
        """Sentence pairs and next-sentence prediction (BERT), or single
        segments and the masked LM alone (`data.next_sentence: false`)."""
        return self.data.get("next_sentence", True)  # absent when true

    @property
    def predicts_next_sentence(self):
        """The model predicts the next sentence: sentence pairs, and a
        family whose masked LM does."""
        return self.next_sentence and self.text_family.next_sentence_prediction

    def _config(self):
        """The family's model config; sentence pairs need a model of two
        segments when it predicts the next sentence."""
        config = self.text_family.model_config(self.recipe["model"]["preset"],
                                               self.recipe["model"]["overrides"],
                                               self.vocabulary)
        if self.predicts_next_sentence and config.num_segments < 2:
            raise ValueError(
                "Recipe key `data.next_sentence` must be false for a model with "
                f"num_segments={config.num_segments} (sentence pairs need segments 0 and "
                "1). Received: data.next_sentence=True")
        return config

    def _inputs(self):
        return self.text_family.masked_lm_inputs()

    def _for_model(self, dataset):
        """`dataset` as the recipe's model takes it (the family's
        `masked_lm_batches`)."""
        return self.text_family.masked_lm_batches(dataset)

    def load_data(self):
        from keras_attn.data import text

        data = self.data
        if self.embedded:
            documents = text.load_pydoc_corpus()[: data["max_documents"]]
        else:
            documents = text.load_tfds_documents(
                self.tfds_name, data_dir=data["data_dir"], split=data["split"],
                text_key=data["text_key"], max_documents=data["max_documents"],
                download=data["download"],
            )
        tests, validations = data["test_documents"], data["validation_documents"]
        if len(documents) < tests + validations + 2:
            raise ValueError(
                "Recipe keys `data.test_documents` + `data.validation_documents` leave "
                f"fewer than 2 of the {len(documents)} documents to train on. Received: "
                f"data.test_documents={tests}, data.validation_documents={validations}"
            )
        test_documents = documents[:tests]
        validation_documents = documents[tests : tests + validations]
        train_documents = documents[tests + validations :]
        sentences = [s for document in train_documents for s in document]
        self.vocabulary = text.train_wordpiece_vocabulary(sentences, data["vocabulary_size"])
        self.tokenizer = text.make_tokenizer(self.vocabulary)
        if not self.next_sentence:
            # Single segments, (texts, None, None) for pretraining_dataset.
            def segments(documents):
                texts = text.make_document_segments(documents, self.tokenizer,
                                                    data["sequence_length"])
                return texts, None, None

            self.train_pairs = segments(train_documents)
            self.test_pairs = segments(test_documents)
            self.validation_pairs = segments(validation_documents) if validations else None
        else:
            self.train_pairs = text.make_sentence_pairs(train_documents, seed=self.seed)
            self.test_pairs = text.make_sentence_pairs(test_documents, seed=self.seed + 1)
            self.validation_pairs = (
                text.make_sentence_pairs(validation_documents, seed=self.seed + 2)
                if validations else None
            )
        for key, pairs in (("data.test_documents", self.test_pairs),
                           ("data.validation_documents", self.validation_pairs),
                           ("data.max_documents", self.train_pairs)):
            if pairs is not None and not len(pairs[0]):
                raise ValueError(
                    f"Recipe key `{key}` gives documents without a sentence pair (each "
                    f"has one sentence). Received: {key}={data[key.split('.')[1]]!r}"
                )
        self.max_predictions = data["max_predictions"] or (
            round(data["sequence_length"] * data["mask_rate"]) + 4
        )
        self.batches_per_epoch = batch_count(len(self.train_pairs[0]), self.batch_size)
        config = self._config()
        if config.max_sequence_length < data["sequence_length"]:
            raise ValueError(
                "Recipe key `data.sequence_length` must be at most the model's "
                f"max_sequence_length={config.max_sequence_length}. "
                f"Received: data.sequence_length={data['sequence_length']}"
            )
        self.model_config = config
        self.max_segments = UNPACKED_MAX_SEGMENTS
        if data.get("packing"):  # absent when false (the resolved recipe leaves it out)
            self._pack_training_examples()

    # === Packed training rows ===

    def _pack_training_examples(self):
        """Tokenizes the training pairs once (`[CLS] A [SEP] B [SEP]` cut to
        `sequence_length`, as the padded pipeline does), and sets the rows
        per epoch and the NSP slots per row. Every epoch packs the same
        multiset of lengths in one buffer, and best-fit decreasing decides
        from the sorted lengths alone: every epoch has the same number of
        rows with the same numbers of examples, in other places."""
        from keras_attn.data import pack_rows
        from keras_attn.data import text

        pack = text.pack_pairs(self.tokenizer, self.data["sequence_length"])
        first, second, labels = self.train_pairs
        tokens, sentences, lengths = [], [], []
        for start in range(0, len(labels), 1024):
            token_ids, segment_ids, padding_mask = pack(
                np.asarray(first[start:start + 1024]), np.asarray(second[start:start + 1024]))
            tokens.append(np.asarray(token_ids))
            sentences.append(np.asarray(segment_ids))
            lengths.append(np.asarray(padding_mask).sum(axis=1))
        lengths = np.concatenate(lengths)
        tokens, sentences = np.concatenate(tokens), np.concatenate(sentences)
        self.train_examples = [np.stack([tokens[i, :n], sentences[i, :n]], axis=1)
                               for i, n in enumerate(lengths)]
        self.train_labels = np.asarray(labels, "int32")
        rows = pack_rows(lengths, self.data["sequence_length"], buffer_size=len(lengths),
                         seed=self.seed, epoch=0)
        self.max_segments = max(len(row) for row in rows)
        self.batches_per_epoch = batch_count(len(rows), self.batch_size)

    def packed_epoch(self, epoch):
        """Epoch `epoch`'s packed rows before masking (NumPy): `token_ids`,
        `segment_ids` (sentence A/B), `packed_segment_ids`, `positions`
        `(R, sequence_length)`, `nsp` and `nsp_weights` `(R, max_segments)`
        and `example_ids` (the training pair of each NSP slot, -1 past a
        row's last)."""
        from keras_attn.data import pack_sequences

        self.prepare()
        packed = pack_sequences(self.train_examples, self.data["sequence_length"],
                                buffer_size=len(self.train_examples), seed=self.seed,
                                epoch=epoch, max_segments=self.max_segments)
        rows = len(packed["segment_ids"])
        if batch_count(rows, self.batch_size) != self.batches_per_epoch:
            raise RuntimeError(f"Epoch {epoch} packs into {rows} rows, epoch 0 into another "
                               f"number of batches ({self.batches_per_epoch}).")
        example_ids = np.full((rows, self.max_segments), -1, "int64")
        example_ids[:, : packed["example_ids"].shape[1]] = packed["example_ids"]
        present = example_ids >= 0
        return {
            "token_ids": packed["inputs"][..., 0].astype("int32"),
            "segment_ids": packed["inputs"][..., 1].astype("int32"),
            "packed_segment_ids": packed["segment_ids"],
            "positions": packed["positions"],
            "nsp": np.where(present, self.train_labels[np.maximum(example_ids, 0)], 0)
            .astype("int32"),
            "nsp_weights": present.astype("float32"),
            "example_ids": example_ids,
        }

    def _packed_dataset(self, epoch, positions=None):
        """Epoch `epoch`'s packed batches `(x, y, sample_weight)`, masked
        as the padded pipeline masks (the stateless draws keyed by seed,
        epoch and batch; `[CLS]` / `[SEP]` of every example left alone).
        With `positions` (`size -> (R,)`, see `process_train_dataset_fn`):
        only those rows of each batch filled up, masked as in the whole
        batch, the fillers weightless."""
        import tensorflow as tf

        from keras_attn.data import text

        rows = self.packed_epoch(epoch)
        mask_tokens = text.dynamic_masking(self.tokenizer, self.data["mask_rate"],
                                           self.max_predictions, seed=self.seed)
        key = tf.constant([self.seed, epoch], tf.int64)

        def some_rows(index, batch):
            size = tf.shape(batch["nsp"])[0]
            kept = positions(size)
            batch = {name: tf.gather(value, kept % size) for name, value in batch.items()}
            return self.weightless_rows(to_batch(index, batch, kept % size, size), kept < size)

        def to_batch(index, batch, kept=None, size=None):
            masked = mask_tokens(batch["token_ids"],
                                 tf.random.experimental.stateless_fold_in(key, index),
                                 rows=kept, batch_size=size)
            x = {
                "token_ids": tf.cast(masked["token_ids"], "int32"),
                "segment_ids": batch["segment_ids"],
                "padding_mask": tf.cast(batch["packed_segment_ids"] > 0, "int32"),
                "mask_positions": tf.cast(masked["mask_positions"], "int32"),
                "packed_segment_ids": batch["packed_segment_ids"],
                "positions": batch["positions"],
            }
            y = {"mlm": tf.cast(masked["mask_ids"], "int32"), "nsp": batch["nsp"]}
            weight = {"mlm": tf.cast(masked["mask_weights"], "float32"),
                      "nsp": batch["nsp_weights"]}
            return x, y, weight

        rows.pop("example_ids")
        dataset = tf.data.Dataset.from_tensor_slices(rows).batch(self.batch_size).enumerate()
        dataset = dataset.map(traced_as_written(to_batch if positions is None else some_rows),
                              num_parallel_calls=tf.data.AUTOTUNE)
        return self._for_model(dataset).prefetch(tf.data.AUTOTUNE)

    def _dataset(self, pairs, epoch, shuffle, positions=None):
        from keras_attn.data import text

        return self._for_model(text.pretraining_dataset(
            *pairs, self.tokenizer, sequence_length=self.data["sequence_length"],
            batch_size=self.batch_size, mask_rate=self.data["mask_rate"],
            max_predictions=self.max_predictions, shuffle=shuffle, seed=self.seed, epoch=epoch,
            rows=positions, weightless=self.weightless_rows if positions else None,
        ))

    def train_dataset_fn(self, epoch):
        self.prepare()
        if self.data.get("packing"):
            return self._packed_dataset(epoch)
        return self._dataset(self.train_pairs, epoch, shuffle=True)

    def process_train_dataset_fn(self, replicas, process, processes):
        # Each process tokenizes (padded) and masks only its rows; the masks'
        # draws are the whole batch's (dynamic_masking), the packing of an
        # epoch (NumPy, in memory) every process's.
        import tensorflow as tf

        self.prepare()
        positions = process_positions(replicas, process, processes, arange=tf.range)
        if self.data.get("packing"):
            return lambda epoch: self._packed_dataset(epoch, positions)
        return lambda epoch: self._dataset(self.train_pairs, epoch, shuffle=True,
                                           positions=positions)

    def validation_data(self):
        self.prepare()
        if self.validation_pairs is None:
            return None
        return self._dataset(self.validation_pairs, 0, shuffle=False)

    def test_data(self):
        self.prepare()
        return self._dataset(self.test_pairs, 0, shuffle=False)

    # Prepared data: every epoch's masked batches as the pipeline made them.
    def prepared_state(self):
        return dict(super().prepared_state(), vocabulary=list(self.vocabulary),
                    max_predictions=self.max_predictions, max_segments=self.max_segments)

    def use_prepared(self, state):
        self.vocabulary = state["vocabulary"]
        self.max_predictions = state["max_predictions"]
        self.max_segments = state.get("max_segments", UNPACKED_MAX_SEGMENTS)
        self.model_config = self._config()
        super().use_prepared(state)

    def make_model(self, preset, overrides):
        backbone = self.text_family.backbone(preset, overrides, self.vocabulary)
        return self.text_family.masked_lm(backbone, self.max_segments, self.next_sentence)

    def assume_data_sizes(self):
        self.vocabulary = [None] * self.data["vocabulary_size"]  # the size asked for
        self.max_segments = UNPACKED_MAX_SEGMENTS  # NSP slots: no weights

    def compile_arguments(self, model):
        return self.text_family.masked_lm_compile_arguments()

    def evaluate(self, model):
        return self.evaluate_batches(model, self.test_data())

    def evaluate_batches(self, model, batches):
        metrics = super().evaluate_batches(model, batches)
        if self.predicts_next_sentence:
            return metrics
        # The BERT recipes' names: one output, "mlm".
        return {("mlm_" + name if name in ("loss", "accuracy", "perplexity") else name): value
                for name, value in metrics.items()}

    def export(self, model, path, format="saved_model", precision="float32"):
        self.check_export_format(format, precision)
        if format != "saved_model":
            return self._export_portable(model, path, format, precision)
        import tensorflow as tf

        from keras_attn.export import export_saved_model

        names = self._inputs()

        def serve(*inputs):
            outputs = self._named_outputs(model(dict(zip(names, inputs)), training=False))
            return {name: tf.cast(value, "float32") for name, value in outputs.items()}

        signature = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
        return export_saved_model(model, path, input_signature=signature, serving_fn=serve)

    def _export_portable(self, model, path, format, precision):
        import keras

        from keras_attn.export.portable import export_portable

        self.prepare()
        names = self._inputs()
        inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
        outputs = self._named_outputs(model(inputs, training=False))
        outputs = {name: keras.ops.cast(value, "float32") for name, value in outputs.items()}
        serving = keras.Model([inputs[name] for name in names], outputs,
                              name="masked_lm_serving")
        vocabulary = list(self.vocabulary)
        preprocessing = {"vocabulary": "vocab.txt (WordPiece)",
                         "mask_positions": "indices of the [MASK] tokens, padded with 0",
                         "mask_id": vocabulary.index("[MASK]"),
                         "pad_id": vocabulary.index("[PAD]")}
        if "mask_positions" not in names:
            del preprocessing["mask_positions"]  # logits at every position
        return export_portable(
            serving, path, format, precision, files={"vocab.txt": "".join(t + "\n" for t in vocabulary)},
            preprocessing=preprocessing)

    def _named_outputs(self, outputs):
        """The model's outputs as a dict (`{"mlm": ...[, "nsp": ...]}`)."""
        return self.text_family.masked_lm_outputs(outputs)

    def assets(self):
        self.prepare()
        return {"vocab.txt": "\n".join(self.vocabulary) + "\n"}

    def example_inputs(self):
        self.prepare()
        x, _, _ = next(iter(self._dataset(self.test_pairs, 0, shuffle=False)))
        return {name: np.asarray(x[name])[:4] for name in self._inputs()}

    def reference_outputs(self, model, inputs):
        outputs = self._named_outputs(model.predict(dict(inputs), verbose=0))
        return {name: np.asarray(value, "float32") for name, value in outputs.items()}

    def served_outputs(self, loaded, inputs):
        outputs = loaded.serve(*[inputs[name] for name in self._inputs()])
        return {name: np.asarray(value) for name, value in outputs.items()}
