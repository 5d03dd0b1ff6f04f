"""translation: the Transformer on the embedded numbers task or a tfds
translation set.

Data: embedded: `num_train + num_validation + num_test` distinct random
numbers below `max_number` (split with the seed; the test numbers are the
first held-out ones, as in examples/translate.py), English words ->
Japanese numerals; tfds: the named splits. One WordPiece vocabulary shared
by both sides, learned on the training pairs. Training batches of epoch e:
a permutation keyed by (seed, e) (a seeded buffer for tfds), length-bucketed.
Metrics: BLEU (sacrebleu) and exact match of the test translations, decoded
with beam search (`evaluation.beam_width`) or greedily (null). Export: the
model with its search, `serve(source_ids) -> {"tokens", "scores"}`
(`keras_attn.export.export_translator`); the run directory gets `vocab.txt`.
"""

from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import in_memory_rows_fn
from keras_attn._base.quiet_tensorflow import traced_as_written

# The embedded numbers are a permutation of 1..max_number held in memory
# (8 bytes each): 10**7 is 80 MB.
MAX_NUMBER = 10**7


class TranslationData(schema.TfdsSplits):
    """Embedded: English number words -> Japanese numerals (num2words),
    numbers split at random; tfds: any translation set; files: a folder
    with `train.csv|jsonl`, `test.*` and optionally `validation.*`, each
    row a sentence pair (the columns or fields `source_language` and
    `target_language`)."""

    takes_files = True

    vocabulary_size: int = field(1000, ge=8, le=schema.MAX_SIZE, description="The shared WordPiece vocabulary.")
    bucket_boundaries: list[schema.PositiveSize] = field([8, 16, 32, 64], description="Length buckets: a "
                                         "non-empty increasing list of positive integers.")
    num_train: int = field(20_000, ge=1, le=schema.MAX_SIZE, only="embedded", description="Training pairs.")
    num_validation: int = field(500, ge=0, le=schema.MAX_SIZE, only="embedded", description="Validation pairs.")
    num_test: int = field(500, ge=1, le=schema.MAX_SIZE, only="embedded", description="Test pairs.")
    max_number: int = field(99_999, ge=2, le=MAX_NUMBER, only="embedded",
                            description="The numbers are below it; at least num_train + "
                                        "num_validation + num_test.")
    source_language: str = field("en", only="tfds or files",
                                 description="The source side (files: its column or field).")
    target_language: Optional[str] = field(
        None, only="tfds or files",
        description="The target side (null: tfds's other language; files: required).")
    vocabulary_examples: int = field(10_000, ge=1, le=schema.MAX_SIZE, only="tfds",
                                     description="Pairs the vocabulary is learned from.")
    packing: bool = field(
        False, description="Train on packed rows of `max(bucket_boundaries)` tokens a side: "
                           "source/target pairs packed in step once for the seed (best-fit "
                           "decreasing), the rows shuffled every epoch; `training.batch_size` "
                           "counts rows. Embedded and files datasets. Validation stays "
                           "bucketed, the test is decoded as unpacked.")

    _packing_in_memory = schema.packing_in_memory()

    @pydantic.field_validator("bucket_boundaries")
    @classmethod
    def _increasing(cls, value):
        if not value or min(value) < 1 or value != sorted(set(value)):
            raise schema.key_error("", "must be a non-empty increasing list of positive "
                                       "integers", value)
        return value

    @pydantic.model_validator(mode="after")
    def _sentence_pairs(self):
        if schema.dataset_kind(self.dataset) == "files":
            from keras_attn.data import files

            if self.target_language is None:
                raise schema.key_error("target_language", "must name the target column "
                                       "(field) of a files: dataset", None)
            schema.check_files(self.dataset, files.check_table_files, [
                self.source_language, self.target_language], "path", ("train", "test"))
        return self

    @pydantic.model_validator(mode="after")
    def _enough_numbers(self):
        if self.dataset == schema.EMBEDDED:
            used = self.num_train + self.num_validation + self.num_test
            if used > self.max_number:
                raise schema.key_error("num_train", "plus num_validation and num_test must be "
                                       f"at most data.max_number={self.max_number}",
                                       self.num_train)
        return self


class TranslationTraining(schema.Training):
    label_smoothing: float = field(0.1, ge=0, le=0.99, description="Epsilon of the "
                                   "label-smoothed cross-entropy (the paper's section 5.4).")


class TranslationEvaluation(schema.Evaluation):
    metric: Literal["bleu", "exact_match"] = field(
        "bleu", description="sacrebleu corpus BLEU, or the share of exact translations, on "
                            "the test set.")
    beam_width: Optional[int] = field(4, ge=1, le=schema.MAX_BEAM, description="null: greedy search.")
    alpha: float = field(0.6, ge=0, description="Length penalty.")
    tokenize: str = field("13a", description='sacrebleu\'s tokenizer ("char" for Japanese).')
    join_characters: Optional[bool] = field(
        None, description="null: true for the embedded task (Japanese is written without "
                          "spaces), else false.")
    max_examples: Optional[int] = field(None, ge=1, le=schema.MAX_SIZE, description="Decode at most this many.")


class Translation(Task):
    name = "translation"
    family = "transformer"
    Data = TranslationData
    Training = TranslationTraining
    Evaluation = TranslationEvaluation
    set_fields = ("vocabulary_size", "target_vocabulary_size", "pad_id")
    embedded_data = "number words EN to JA numerals"
    metric_names = {"bleu": "BLEU", "exact_match": "exact match"}
    # Prepared data: every epoch's length-bucketed batches, and for the BLEU the
    # test sources as ids and the references as text (decoded without
    # TensorFlow by keras_attn.data.scoring).

    def load_data(self):
        from keras_attn.data import translation
        from keras_attn._epochs import bucket_batch_count
        from keras_attn.models.transformer.transformer_config import get_transformer_config

        if self.embedded:
            self._load_numbers()
        elif self.files:
            self._load_files()
        else:
            self._load_tfds()
        self.tokenizer = translation.make_tokenizer(self.vocabulary)
        if not self.tfds_name:
            self.train_token_lengths = (self._token_lengths(self.train_sources),
                                        self._token_lengths(self.train_targets))
            lengths = [
                max(a, b) + 1  # + [END] / [START]
                for a, b in zip(*self.train_token_lengths)
            ]
            self.batches_per_epoch = bucket_batch_count(
                lengths, self.data["bucket_boundaries"], self.batch_size
            )
        overrides = dict(self.recipe["model"]["overrides"], vocabulary_size=len(self.vocabulary),
                         pad_id=translation.PAD_ID)
        self.model_config = get_transformer_config(self.recipe["model"]["preset"], **overrides)
        if self.data.get("packing"):  # absent when false (the resolved recipe leaves it out)
            self._pack_training_pairs()

    # === Packed training rows ===

    def _pack_training_pairs(self):
        """Packs the training pairs once: sources (`ids [END]`) and targets
        (`[START] ids` beside the labels `ids [END]`, one column each) in
        step into rows of `max(bucket_boundaries)` tokens. Which pairs share
        a row does not change what each learns (attention stays inside its
        pair); the rows are shuffled every epoch (`train_dataset_fn`), so
        every epoch has the same number of batches."""
        import tensorflow as tf

        from keras_attn.data import pack_sequences
        from keras_attn.data import translation

        row = max(self.data["bucket_boundaries"])
        sources, targets = [], []
        for source, target in zip(self.tokenizer(tf.constant(self.train_sources)),
                                  self.tokenizer(tf.constant(self.train_targets))):
            source, target = np.asarray(source, "int32"), np.asarray(target, "int32")
            sources.append(np.append(source, translation.END_ID))
            targets.append(np.stack([np.insert(target, 0, translation.START_ID),
                                     np.append(target, translation.END_ID)], axis=1))
        longest = max(max(len(s) for s in sources), max(len(t) for t in targets))
        if longest > row:
            raise ValueError(
                f"Recipe key `data.packing` packs rows of max(data.bucket_boundaries)={row} "
                f"tokens; a training pair has {longest} (with [END] / [START]): raise the "
                "last boundary. Received: data.packing=True, data.bucket_boundaries="
                f"{self.data['bucket_boundaries']}")
        self.packed_rows = pack_sequences(sources, row, targets=targets, target_row_length=row,
                                          buffer_size=len(sources), seed=self.seed,
                                          pad_value=translation.PAD_ID)
        self.batches_per_epoch = batch_count(len(self.packed_rows["segment_ids"]),
                                             self.batch_size)

    def _packed_dataset(self, epoch):
        """Epoch `epoch`'s batches of packed rows, `(x, labels)`: the rows
        in an order keyed by (seed, epoch)."""
        import tensorflow as tf

        from keras_attn._epochs import epoch_permutation

        rows = self.packed_rows
        order = epoch_permutation(len(rows["segment_ids"]), self.seed, epoch)
        x = {"source_ids": rows["inputs"], "target_ids": rows["targets"][..., 0],
             "source_segment_ids": rows["segment_ids"], "source_positions": rows["positions"],
             "target_segment_ids": rows["target_segment_ids"],
             "target_positions": rows["target_positions"]}
        x = {name: value[order].astype("int32") for name, value in x.items()}
        labels = rows["targets"][..., 1][order].astype("int32")  # as the padded pipeline's
        return tf.data.Dataset.from_tensor_slices((x, labels)).batch(self.batch_size).prefetch(
            tf.data.AUTOTUNE)

    def _token_lengths(self, texts):
        import tensorflow as tf

        return [len(ids) for ids in self.tokenizer(tf.constant(list(texts)))]

    def _load_numbers(self):
        from keras_attn.data import translation

        data = self.data
        train, held_out = translation.split_numbers(
            data["num_train"], data["num_test"] + data["num_validation"],
            data["max_number"], seed=self.seed,
        )
        train_pairs = translation.number_pairs(train)
        self.test_pairs = translation.number_pairs(held_out[: data["num_test"]])
        self.validation_pairs = translation.number_pairs(held_out[data["num_test"] :])
        self.train_sources, self.train_targets = (list(side) for side in zip(*train_pairs))
        self.vocabulary = translation.train_vocabulary(
            self.train_sources + self.train_targets, data["vocabulary_size"]
        )

    def _load_files(self):
        from keras_attn.data import files
        from keras_attn.data import translation

        fields = [self.data["source_language"], self.data["target_language"]]
        rows = files.table_rows(self.files, fields)
        pairs = {split: [(str(row[fields[0]]), str(row[fields[1]])) for row in split_rows or []]
                 for split, split_rows in rows.items()}
        self.train_sources, self.train_targets = (list(side) for side in zip(*pairs["train"]))
        self.test_pairs, self.validation_pairs = pairs["test"], pairs["validation"]
        self.vocabulary = translation.train_vocabulary(
            self.train_sources + self.train_targets, self.data["vocabulary_size"])

    def _tfds_pairs(self, split, limit=None):
        """`[(source, target)]` strings of a tfds split (the first `limit`)."""
        import tensorflow_datasets as tfds

        raw = tfds.load(self.tfds_name, split=split, data_dir=self.data["data_dir"],
                        download=False)
        if limit is not None:
            raw = raw.take(limit)
        source, target = self._languages
        return [(a.decode("utf-8"), b.decode("utf-8"))
                for a, b in raw.map(traced_as_written(
                    lambda x: (x[source], x[target]))).as_numpy_iterator()]

    def _load_tfds(self):
        from keras_attn.data import translation

        data = self.data
        languages = sorted(self.tfds_builder().info.features)
        source = data["source_language"]
        target = data["target_language"] or next((k for k in languages if k != source), None)
        for key, value in (("source_language", source), ("target_language", target)):
            if value not in languages or source == target:
                raise ValueError(
                    f"Recipe key `data.{key}` must be one of the dataset's languages "
                    f"{languages}, the two different. Received: data.{key}={value!r}"
                )
        self._languages = (source, target)
        pairs = self._tfds_pairs(data["train_split"], data["vocabulary_examples"])
        self.vocabulary = translation.train_vocabulary(
            [a for a, _ in pairs] + [b for _, b in pairs], data["vocabulary_size"]
        )
        examples = self.tfds_examples(data["train_split"])
        # Buckets make at least examples / batch_size batches (partial ones too).
        self.batches_per_epoch = max(1, examples // self.batch_size)
        limit = self.evaluation["max_examples"]
        self.test_pairs = self._tfds_pairs(data["test_split"], limit)
        self.validation_pairs = None

    def train_dataset_fn(self, epoch):
        from keras_attn.data import translation

        self.prepare()
        if self.data.get("packing"):
            return self._packed_dataset(epoch)
        if not self.tfds_name:
            return translation.make_translation_dataset(
                self.train_sources, self.train_targets, self.tokenizer, self.batch_size,
                shuffle=True, seed=self.seed, bucket_boundaries=self.data["bucket_boundaries"],
                epoch=epoch,
            )
        dataset, _ = translation.load_tfds_translation(
            self.tfds_name, data_dir=self.data["data_dir"], split=self.data["train_split"],
            source_language=self._languages[0], target_language=self._languages[1],
            tokenizer=self.tokenizer, batch_size=self.batch_size, shuffle=True,
            seed=self.seed, epoch=epoch,
        )
        return dataset

    def process_train_dataset_fn(self, replicas, process, processes):
        # The batches are found from the token lengths (load_data's), then
        # each process encodes only its rows.
        from keras_attn.data import translation

        return in_memory_rows_fn(
            self, replicas, process, processes,
            lambda positions, epoch: translation.translation_rows_dataset(
                self.train_sources, self.train_targets, self.train_token_lengths,
                self.tokenizer, positions, self.weightless_rows, self.batch_size,
                seed=self.seed, bucket_boundaries=self.data["bucket_boundaries"], epoch=epoch))

    def validation_data(self):
        from keras_attn.data import translation

        self.prepare()
        if self.tfds_name:
            split = self.data["validation_split"]
            if split is None:
                return None
            dataset, _ = translation.load_tfds_translation(
                self.tfds_name, data_dir=self.data["data_dir"], split=split,
                source_language=self._languages[0], target_language=self._languages[1],
                tokenizer=self.tokenizer, batch_size=self.batch_size,
            )
            return dataset
        if not self.validation_pairs:
            return None
        sources, targets = zip(*self.validation_pairs)
        return translation.make_translation_dataset(
            sources, targets, self.tokenizer, self.batch_size,
            bucket_boundaries=self.data["bucket_boundaries"],
        )

    def weightless_rows(self, batch, keep):
        """Filler rows' labels all padding: LabelSmoothedCrossEntropy and
        MaskedTokenAccuracy then count none of their tokens (each divides
        by the real tokens it sees), so no sample weight is added."""
        from keras_attn.data.scoring import PAD_ID
        from keras_attn.zoo.tasks.base import rows_replaced

        x, labels = batch[0], batch[1]
        return (x, rows_replaced(labels, keep, PAD_ID)) + tuple(batch[2:])

    def make_model(self, preset, overrides):
        from keras_attn.data.scoring import PAD_ID
        from keras_attn.models.transformer import build_transformer

        return build_transformer(preset, vocabulary_size=len(self.vocabulary),
                                 pad_id=PAD_ID, **overrides)

    def assume_data_sizes(self):
        self.vocabulary = [None] * self.data["vocabulary_size"]  # the size asked for

    def compile_arguments(self, model):
        from keras_attn.training import LabelSmoothedCrossEntropy
        from keras_attn.training import MaskedTokenAccuracy

        config = model.transformer_config
        smoothing = self.recipe["training"]["label_smoothing"]
        return {
            "loss": LabelSmoothedCrossEntropy(smoothing, pad_id=config.pad_id),
            "metrics": [MaskedTokenAccuracy(pad_id=config.pad_id)],
        }

    def _translator(self, model, max_length=None):
        from keras_attn.data.scoring import END_ID
        from keras_attn.data.scoring import START_ID
        from keras_attn.models.transformer.decoding import TransformerTranslator

        return TransformerTranslator(
            model, START_ID, END_ID,
            beam_width=self.evaluation["beam_width"], alpha=self.evaluation["alpha"],
            max_length=max_length,
        )

    def _join_characters(self):
        join = self.evaluation["join_characters"]
        return self.embedded if join is None else join

    def evaluate(self, model):
        from keras_attn.data import translation

        self.prepare()
        pairs = self.test_pairs[: self.evaluation["max_examples"]]
        sources = translation.encode_sources(self.tokenizer, [s for s, _ in pairs])

        def detokenize(tokens):
            return translation.detokenize(self.tokenizer, tokens,
                                          join_characters=self._join_characters())

        return self._score(model, sources, [t for _, t in pairs], detokenize)

    def _score(self, model, sources, references, detokenize):
        from keras_attn.data.scoring import evaluate_translations

        # The exported translator's length (it cannot know a source's length
        # when traced): a sentence that never ends is cut at the same place,
        # so model.keras and its exports score the same.
        length = model.transformer_config.max_sequence_length
        tokens, _ = self._translator(model, length).predict(
            sources, batch_size=self.batch_size, verbose=0)
        return evaluate_translations(detokenize(tokens), references,
                                     tokenize=self.evaluation["tokenize"])

    def evaluate_served(self, serve):
        from keras_attn.data import translation
        from keras_attn.data.scoring import evaluate_translations

        self.prepare()
        pairs = self.test_pairs[: self.evaluation["max_examples"]]
        sources = translation.encode_sources(self.tokenizer, [s for s, _ in pairs])
        texts = []
        for start in range(0, len(sources), self.batch_size):
            rows = sources[start:start + self.batch_size]
            rows = rows[:, : max(1, int((rows != translation.PAD_ID).sum(1).max()))]
            texts += translation.detokenize(self.tokenizer, serve({"source_ids": rows})["tokens"],
                                            join_characters=self._join_characters())
        return evaluate_translations(texts, [t for _, t in pairs],
                                     tokenize=self.evaluation["tokenize"])

    def test_data(self):
        return None  # evaluated by decoding (`prepared_tables`), not by batches

    def prepared_tables(self):
        from keras_attn.data import translation

        self.prepare()
        pairs = self.test_pairs[: self.evaluation["max_examples"]]
        return {"test_sources": translation.encode_sources(self.tokenizer, [s for s, _ in pairs]),
                "test_references": np.array([t for _, t in pairs])}

    def evaluate_prepared(self, model, prepared):
        from keras_attn.data.scoring import detokenize_ids

        tables = prepared.tables

        def detokenize(tokens):
            return detokenize_ids(tokens, self.vocabulary, self._join_characters())

        return self._score(model, tables["test_sources"],
                           [str(text) for text in tables["test_references"]], detokenize)

    def prepared_state(self):
        return dict(super().prepared_state(), vocabulary=list(self.vocabulary))

    def use_prepared(self, state):
        from keras_attn.data.scoring import PAD_ID
        from keras_attn.models.transformer.transformer_config import get_transformer_config

        self.vocabulary = state["vocabulary"]
        overrides = dict(self.recipe["model"]["overrides"], vocabulary_size=len(self.vocabulary),
                         pad_id=PAD_ID)
        self.model_config = get_transformer_config(self.recipe["model"]["preset"], **overrides)
        super().use_prepared(state)


    def export(self, model, path, format="saved_model", precision="float32"):
        from keras_attn.data import translation
        from keras_attn.export import export_translator

        self.check_export_format(format, precision)
        vocabulary = None
        if format != "saved_model":  # the SavedModel's vocab.txt is the run directory's
            self.prepare()
            vocabulary = list(self.vocabulary)
        return export_translator(
            model, path, translation.START_ID, translation.END_ID,
            beam_width=self.evaluation["beam_width"], alpha=self.evaluation["alpha"],
            format=format, precision=precision, vocabulary=vocabulary,
        )

    def assets(self):
        self.prepare()
        return {"vocab.txt": "\n".join(self.vocabulary) + "\n"}

    def example_inputs(self):
        from keras_attn.data import translation

        self.prepare()
        sentences = [s for s, _ in self.test_pairs[:4]]
        return {"source_ids": translation.encode_sources(self.tokenizer, sentences)}

    def _outputs(self, tokens, scores):
        """Tokens up to and including [END], to the longest such row (the
        eager and the served search pad to different lengths after it), and
        the scores."""
        from keras_attn.data import translation

        tokens = np.asarray(tokens)
        stops = []
        for ids in tokens:
            ends = np.flatnonzero(ids == translation.END_ID)
            stops.append(ends[0] + 1 if len(ends) else len(ids))
        cut = np.zeros((len(tokens), max(stops)), tokens.dtype)
        for row, (ids, stop) in enumerate(zip(tokens, stops)):
            cut[row, :stop] = ids[:stop]
        return {"tokens": cut, "scores": np.asarray(scores, "float32")}

    def reference_outputs(self, model, inputs):
        import keras

        # The SavedModel searches up to max_sequence_length tokens.
        length = model.transformer_config.max_sequence_length
        tokens, scores = self._translator(model, length)(inputs["source_ids"])
        return self._outputs(*(keras.ops.convert_to_numpy(x) for x in (tokens, scores)))

    def served_outputs(self, loaded, inputs):
        outputs = loaded.serve(inputs["source_ids"])
        return self._outputs(outputs["tokens"], outputs["scores"])
