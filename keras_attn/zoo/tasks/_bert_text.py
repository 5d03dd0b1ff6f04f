"""What the two BERT fine-tuning tasks (text_classification,
token_classification) share: the keys of their data, the vocabulary (learned
from the training texts, or a pretrained backbone's: a masked_lm run
directory or a Hugging Face BERT directory), the splits held in memory and
the epochs as permutations keyed by (seed, epoch).

A subclass reads its examples (`_embedded_splits`, `_files_splits`,
`_tfds_splits`: `{split: (inputs, labels) or None}` with `inputs` a list),
says which texts the vocabulary is learned from (`_training_texts`) and
gives its pipeline (`_batches`), through which every example is tokenized
and packed once, at load time; the epochs are permutations of those rows.
"""

import json
import os
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import pretrained_source

PRETRAINED = "training.pretrained"
BERT_INPUTS = ("token_ids", "segment_ids", "padding_mask")
MODERNBERT_INPUTS = ("token_ids", "padding_mask")
MODERNBERT = "modernbert"
_RUN_FILES = ("recipe.json", "model.keras", "vocab.txt")
_HF_FILES = ("config.json", "model.safetensors", "vocab.txt")


class BertTextData(schema.TfdsSplits):
    """The data keys both tasks take."""

    takes_files = True

    sequence_length: int = field(128, ge=8, le=schema.MAX_SIZE, description="Tokens per example, `[CLS]` and "
                                                        "`[SEP]` included (truncated, padded).")
    vocabulary_size: int = field(4000, ge=16, le=schema.MAX_SIZE, description="WordPieces learned from the "
                                                         "training texts (the model gets the "
                                                         "learned size; unused with "
                                                         "training.pretrained, whose "
                                                         "vocabulary is used).")
    validation_fraction: float = field(
        0.1, ge=0, le=0.99, description="Share of the training examples held out for "
                                        "validation (seeded; files: when there is no "
                                        "validation file; tfds: when validation_split is "
                                        "null).")
    validation_split: Optional[str] = field(None, only="tfds",
                                            description="The validation split (null: none).")

    def table_fields(self):
        """The columns (fields) a files: dataset's rows need: `{name: kind}`
        (`keras_attn.data.files.TEXT`, `LABEL`, `WORDS`, `TAGS`)."""
        raise NotImplementedError

    @pydantic.model_validator(mode="after")
    def _readable_tables(self):
        if schema.dataset_kind(self.dataset) == "files":
            from keras_attn.data import files

            schema.check_files(self.dataset, files.check_table_files, self.table_fields(),
                               "path", ("train", "test"))
        return self


class BertTextTraining(schema.Training):
    pretrained: Optional[str] = field(
        None, description="null: a new backbone (model.preset + overrides) and a vocabulary "
                          "learned from the training texts. A directory: fine-tune its "
                          "backbone with its vocabulary (model.overrides must then be "
                          "empty): a finished run of the masked_lm task of the recipe's "
                          "family (recipe.json, model.keras, vocab.txt) or, for the bert "
                          "family, a Hugging Face BERT directory (config.json, "
                          "model.safetensors, vocab.txt).")


def _lines(path):
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.rstrip("\n")]


def pretrained_kind(path):
    """"run" (a finished masked_lm run) or "hf" (a Hugging Face BERT
    directory) for `training.pretrained`; a `ValueError` naming the key
    otherwise."""
    return pretrained_source(path, PRETRAINED, "masked_lm", _RUN_FILES, _HF_FILES,
                             "Hugging Face BERT", "a backbone")


def vocabulary_pad_id(vocabulary):
    """The `[PAD]` id of a learned vocabulary (its special tokens' order
    when the sizes are assumed before the vocabulary is learned)."""
    if vocabulary[0] is None:  # assume_data_sizes: the learned order
        # Imported here: keras_attn.data.text imports TensorFlow, which a
        # run from prepared files does without.
        from keras_attn.data.text import SPECIAL_TOKENS

        return SPECIAL_TOKENS.index("[PAD]")
    return vocabulary.index("[PAD]")


def text_model_config(modernbert, preset, overrides, vocabulary):
    """The family's config of `preset` with `overrides` and the
    vocabulary's size (ModernBERT's `pad_id` the vocabulary's `[PAD]`); a
    BERT config with RoBERTa's positions (`padding_id`) must count them past
    that `[PAD]`: a `ValueError` naming the key otherwise."""
    overrides = dict(overrides, vocabulary_size=len(vocabulary))
    if modernbert:
        from keras_attn.models.modernbert import get_modernbert_config

        return get_modernbert_config(preset, **overrides, pad_id=vocabulary_pad_id(vocabulary))
    from keras_attn.models.bert import get_bert_config

    config = get_bert_config(preset, **overrides)
    pad_id = None if config.padding_id is None else vocabulary_pad_id(vocabulary)
    if config.padding_id is not None and config.padding_id != pad_id:
        raise ValueError(
            f"Recipe key `model.overrides.padding_id` must be the learned vocabulary's [PAD] "
            f"id, {pad_id} (RoBERTa's positions are counted past it; preset {preset!r} has "
            f"its own vocabulary's). Received: padding_id={config.padding_id}")
    return config


def take(values, indices):
    """The `indices` of a list or an array, as its kind."""
    if isinstance(values, np.ndarray):
        return values[indices]
    return [values[i] for i in indices]


class BertTextTask(Task):
    """The base of the BERT fine-tuning tasks (in memory, deterministic).
    A subclass that also builds ModernBERT names it in `other_families`
    (`{MODERNBERT: ("vocabulary_size", "pad_id")}`) and gives its model
    (`modernbert_model_class`): its rows then have no `segment_ids`."""

    family = "bert"
    Training = BertTextTraining
    set_fields = ("vocabulary_size",)
    model_class = None  # BertSequenceClassifier / BertTokenClassifier
    modernbert_model_class = None  # ModernBertSequenceClassifier

    @property
    def modernbert(self):
        return self.model_family == MODERNBERT

    def input_names(self):
        """The model's inputs (and the prepared rows' keys)."""
        return MODERNBERT_INPUTS if self.modernbert else BERT_INPUTS

    def _config(self, preset, overrides):
        return text_model_config(self.modernbert, preset, overrides, self.vocabulary)

    def _pad_id(self):
        return vocabulary_pad_id(self.vocabulary)

    # === Data ===

    def load_data(self):
        if self.embedded:
            splits = self._embedded_splits()
        elif self.files:
            splits = self._files_splits()
        else:
            splits = self._tfds_splits()
        self.splits = splits
        self.pretrained = self.training.get("pretrained")
        if self.pretrained:
            self._load_pretrained_vocabulary()
        else:
            from keras_attn.data import text

            self.vocabulary = text.train_wordpiece_vocabulary(
                self._training_texts(splits["train"][0]), self.data["vocabulary_size"])
            self.tokenizer = text.make_tokenizer(self.vocabulary)
            self.model_config = self._config(self.recipe["model"]["preset"],
                                             self.recipe["model"]["overrides"])
        length = self.data["sequence_length"]
        if self.model_config.max_sequence_length < length:
            raise ValueError(
                "Recipe key `data.sequence_length` must be at most the model's "
                f"max_sequence_length={self.model_config.max_sequence_length}. "
                f"Received: data.sequence_length={length}")
        self.batches_per_epoch = batch_count(len(splits["train"][0]), self.batch_size)
        self.arrays = self._encode_splits(splits)

    def _encode_splits(self, splits):
        """`{split: tuple of NumPy arrays (x dict, labels[, weights]) or
        None}`: every split's examples tokenized and packed in one pass of
        the task's pipeline (traced once), so that an epoch only permutes
        rows."""
        import keras

        present = [split for split in ("train", "validation", "test")
                   if splits.get(split) is not None]
        inputs = [example for split in present for example in splits[split][0]]
        labels = [label for split in present for label in splits[split][1]]
        if isinstance(splits["train"][1], np.ndarray):
            labels = np.asarray(labels, "int32")
        batches = [keras.tree.map_structure(np.asarray, batch)
                   for batch in self._batches(inputs, labels, batch_size=1024)]
        if self.modernbert:  # no segment ids
            batches = [({name: batch[0][name] for name in MODERNBERT_INPUTS}, *batch[1:])
                       for batch in batches]
        rows = keras.tree.map_structure(lambda *parts: np.concatenate(parts), *batches)
        arrays, start = dict.fromkeys(("train", "validation", "test")), 0
        for split in present:
            end = start + len(splits[split][0])
            arrays[split] = keras.tree.map_structure(lambda a: a[start:end], rows)
            start = end
        return arrays

    def _array_batches(self, arrays, order=None):
        import keras
        import tensorflow as tf

        if order is not None:
            arrays = keras.tree.map_structure(lambda a: a[order], arrays)
        return tf.data.Dataset.from_tensor_slices(arrays).batch(self.batch_size)

    def _load_pretrained_vocabulary(self):
        path = self.pretrained
        kind = pretrained_kind(path)
        overrides = self.recipe["model"]["overrides"]
        if overrides:
            raise ValueError(
                f"Recipe key `model.overrides` must be empty with {PRETRAINED} (the backbone "
                f"is the pretrained one). Received: model.overrides={overrides!r}")
        if kind == "run":
            from keras_attn.data import text

            with open(os.path.join(path, "recipe.json"), encoding="utf-8") as handle:
                theirs = json.load(handle)
            family = theirs.get("family", "bert")
            if family != self.model_family:
                raise ValueError(
                    f"Recipe key `{PRETRAINED}` names a run of the {family!r} family; this "
                    f"recipe's family is {self.model_family!r}. Received: "
                    f"{PRETRAINED}={path!r}")
            self.vocabulary = _lines(os.path.join(path, "vocab.txt"))
            self.tokenizer = text.make_tokenizer(self.vocabulary)
            self.model_config = self._config(theirs["model"]["preset"],
                                             theirs["model"].get("overrides", {}))
        elif self.modernbert:
            raise ValueError(
                f"Recipe key `{PRETRAINED}` of a modernbert recipe must be a masked_lm run "
                "of the modernbert family (a Hugging Face ModernBERT directory has a BPE "
                f"tokenizer, which this task does not read). Received: {PRETRAINED}={path!r}")
        else:
            from keras_attn.convert.bert import bert_config_from_hf
            from keras_attn.convert.bert import load_hf_bert_tokenizer

            self.tokenizer = load_hf_bert_tokenizer(path)
            self.vocabulary = list(self.tokenizer.get_vocabulary())
            self.model_config = bert_config_from_hf(path)

    def _split_rows(self, splits):
        """`splits` with a seeded `validation_fraction` of train held out
        when there is no validation set."""
        from keras_attn.data import files

        fraction = self.data["validation_fraction"]
        if splits.get("validation") is None and fraction:
            inputs, labels = splits["train"]
            kept, held = files.hold_out(len(inputs), fraction, self.seed)
            splits["train"] = (take(inputs, kept), take(labels, kept))
            splits["validation"] = (take(inputs, held), take(labels, held))
        return splits

    def _tfds_rows(self, split, keys):
        """The `keys` features of a tfds split, as lists."""
        import tensorflow_datasets as tfds

        dataset = tfds.load(self.tfds_name, split=split, data_dir=self.data["data_dir"],
                            download=False)
        columns = {key: [] for key in keys}
        for example in dataset.as_numpy_iterator():
            for key in keys:
                columns[key].append(example[key])
        return columns

    def _tfds_features(self, keys):
        """The data set's features, each of `keys` (`{recipe key: feature}`)
        checked to be one of them."""
        features = self.tfds_builder().info.features
        for key, name in keys.items():
            if name not in features:
                raise ValueError(f"Recipe key `data.{key}` must name a feature of "
                                 f"{self.tfds_name} ({sorted(features)}). "
                                 f"Received: data.{key}={name!r}")
        return features

    def _tfds_columns(self, inputs_key, labels_key, inputs, labels):
        """`{split: (inputs(column), labels(column)) or None}` of the
        recipe's tfds splits (validation held out as `_split_rows` does)."""
        names = {"train": self.data["train_split"], "validation": self.data["validation_split"],
                 "test": self.data["test_split"]}
        splits = {}
        for split, name in names.items():
            columns = None if name is None else self._tfds_rows(name, (inputs_key, labels_key))
            splits[split] = None if name is None else (inputs(columns[inputs_key]),
                                                       labels(columns[labels_key]))
        return self._split_rows(splits)

    def _set_classes(self, names):
        self.class_names = list(names)
        self.num_classes = len(self.class_names)

    def train_dataset_fn(self, epoch):
        from keras_attn._epochs import epoch_permutation

        self.prepare()
        order = epoch_permutation(len(self.splits["train"][0]), self.seed, epoch)
        return self._array_batches(self.arrays["train"], order)

    def _held_out(self, split):
        self.prepare()
        if self.arrays[split] is None:
            return None
        return self._array_batches(self.arrays[split])

    def validation_data(self):
        return self._held_out("validation")

    def test_data(self):
        return self._held_out("test")

    # === Prepared data: the batches as the pipelines make them ===

    def prepared_state(self):
        import dataclasses

        return dict(super().prepared_state(), vocabulary=list(self.vocabulary),
                    class_names=list(self.class_names),
                    config=dataclasses.asdict(self.model_config))

    def use_prepared(self, state):
        if self.modernbert:
            from keras_attn.models.modernbert import ModernBertConfig as config_class
        else:
            from keras_attn.models.bert import BertConfig as config_class

        self.vocabulary = state["vocabulary"]
        self.class_names = state["class_names"]
        self.num_classes = len(self.class_names)
        self.model_config = config_class(**state["config"])
        self.pretrained = self.training.get("pretrained")
        super().use_prepared(state)

    # === Model ===

    def make_model(self, preset, overrides):
        from keras_attn.models.bert import build_bert

        if self.pretrained:
            backbone = self._pretrained_backbone()
        elif self.modernbert:
            from keras_attn.models.modernbert import build_modernbert

            backbone = build_modernbert(preset, vocabulary_size=len(self.vocabulary),
                                        pad_id=self._pad_id(), **overrides)
        else:
            backbone = build_bert(preset, vocabulary_size=len(self.vocabulary), **overrides)
        model_class = self.modernbert_model_class if self.modernbert else self.model_class
        return model_class(backbone, num_classes=self.num_classes)

    def _pretrained_backbone(self):
        import keras

        path = self.pretrained
        if pretrained_kind(path) == "hf":
            from keras_attn.convert.bert import load_hf_bert_backbone

            return load_hf_bert_backbone(path)
        return keras.saving.load_model(os.path.join(path, "model.keras"),
                                       compile=False).backbone

    def compile_arguments(self, model):
        return {}  # the BERT task models' own losses and metrics ("auto")

    def evaluate(self, model):
        return self.evaluate_batches(model, self.test_data())

    def assets(self):
        """vocab.txt, and labels.txt: the class of each output index."""
        self.prepare()
        return {"vocab.txt": "\n".join(self.vocabulary) + "\n",
                "labels.txt": "\n".join(self.class_names) + "\n"}
