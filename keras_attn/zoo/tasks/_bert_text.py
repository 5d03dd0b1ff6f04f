"""What the two BERT fine-tuning tasks (text_classification,
token_classification) share: the keys of their data, the vocabulary (learned
from the training texts, or a pretrained backbone's: a masked_lm run
directory or a Hugging Face directory of a text family, read by the family
its config.json's model_type names, with its own tokenizer), the splits
held in memory and the epochs as permutations keyed by (seed, epoch).

A subclass reads its examples (`_embedded_splits`, `_files_splits`,
`_tfds_splits`: `{split: (inputs, labels) or None}` with `inputs` a list),
says which texts the vocabulary is learned from (`_training_texts`) and
gives its pipeline (`_batches`), through which every example is tokenized
and packed once, at load time; the epochs are permutations of those rows.
"""

from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.families import FAMILIES
from keras_attn.zoo.families import PRETRAINED
from keras_attn.zoo.families import hf_family
from keras_attn.zoo.families import task_families
from keras_attn.zoo.families import text_family
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import pretrained_source

_RUN_FILES = ("recipe.json", "model.keras", "vocab.txt")
# The tokenizer's files are the family's (`TextFamily.hf_tokenizer_files`).
_HF_FILES = ("config.json", "model.safetensors")


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
                          "family (recipe.json, model.keras, vocab.txt) or a Hugging Face "
                          "directory of the recipe's family (config.json, model.safetensors "
                          "and its tokenizer; bert: BERT, RoBERTa, XLM-R; modernbert: "
                          "ModernBERT; config.json's model_type tells), fine-tuned with its "
                          "own tokenizer (token_classification: BERT's alone).")


def pretrained_kind(path):
    """"run" (a finished masked_lm run) or "hf" (a Hugging Face directory
    of a text family) for `training.pretrained`; a `ValueError` naming the
    key otherwise."""
    titles = [family.title for family in FAMILIES.values()]
    what = f"Hugging Face {', '.join(titles[:-1])} or {titles[-1]}"
    return pretrained_source(path, PRETRAINED, "masked_lm", _RUN_FILES, _HF_FILES, what,
                             "a backbone")


def take(values, indices):
    """The `indices` of a list or an array, as its kind."""
    if isinstance(values, np.ndarray):
        return values[indices]
    return [values[i] for i in indices]


class TextFamilyTask(Task):
    """A task of the text encoder families (`keras_attn.zoo.families`):
    the recipe's family object (`self.text_family`) builds its config and
    models. The families that build the task are those naming it in their
    `tasks` (`family`, the bert family, the task's own): its `set_fields`
    and `other_families` are theirs."""

    family = "bert"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            families = task_families(cls.name)
            cls.set_fields = families.pop(cls.family)
            cls.other_families = families

    def __init__(self, recipe):
        super().__init__(recipe)
        self.text_family = text_family(self.model_family)


class BertTextTask(TextFamilyTask):
    """The base of the BERT fine-tuning tasks (in memory, deterministic);
    a subclass gives its model (`build_head(backbone)`, asking
    `self.text_family`)."""

    Training = BertTextTraining

    def input_names(self):
        """The model's inputs (and the prepared rows' keys)."""
        return self.text_family.inputs

    def _config(self, preset, overrides):
        return self.text_family.model_config(preset, overrides, self.vocabulary)

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
        # The family's inputs (the pipelines make BERT's: ModernBERT has no
        # segment ids).
        batches = [({name: batch[0][name] for name in self.input_names()}, *batch[1:])
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

    def _pretrained_kind(self):
        """`pretrained_kind` of `training.pretrained`; for a Hugging Face
        directory, `text_family` becomes the family that reads it (its
        `model_type`'s: RoBERTa's for a bert recipe)."""
        path = self.training["pretrained"]
        kind = pretrained_kind(path)
        if kind == "hf":
            self.text_family = hf_family(path, self.model_family, self.name)
        return kind

    def hf_tokenizer(self):
        """Whether the task tokenizes with a Hugging Face source's tokenizer
        other than WordPiece (RoBERTa's, ModernBERT's byte-level BPE,
        XLM-R's SentencePiece), not a WordPiece vocabulary."""
        return (bool(self.training.get("pretrained")) and self._pretrained_kind() == "hf"
                and self.text_family.tokenizer_kind != "wordpiece")

    def _load_pretrained_vocabulary(self):
        path = self.pretrained
        kind = self._pretrained_kind()
        overrides = self.recipe["model"]["overrides"]
        if overrides:
            raise ValueError(
                f"Recipe key `model.overrides` must be empty with {PRETRAINED} (the backbone "
                f"is the pretrained one). Received: model.overrides={overrides!r}")
        self.tokenizer, self.vocabulary, self.model_config = \
            self.text_family.read_pretrained(path, kind)

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
        self.vocabulary = state["vocabulary"]
        self.class_names = state["class_names"]
        self.num_classes = len(self.class_names)
        self.model_config = self.text_family.config_from_dict(state["config"])
        self.pretrained = self.training.get("pretrained")
        super().use_prepared(state)

    # === Model ===

    def make_model(self, preset, overrides):
        if self.pretrained:
            kind = self._pretrained_kind()
            backbone = self.text_family.pretrained_backbone(self.pretrained, kind)
        else:
            backbone = self.text_family.backbone(preset, overrides, self.vocabulary)
        return self.build_head(backbone)

    def build_head(self, backbone):
        """The task's model of `backbone` (`self.num_classes` classes)."""
        raise NotImplementedError

    def compile_arguments(self, model):
        return {}  # the BERT task models' own losses and metrics ("auto")

    def evaluate(self, model):
        return self.evaluate_batches(model, self.test_data())

    def assets(self):
        """vocab.txt (a Hugging Face directory's tokenizer other than
        WordPiece: its own files), and labels.txt: the class of each output
        index."""
        self.prepare()
        labels = {"labels.txt": "\n".join(self.class_names) + "\n"}
        if self.hf_tokenizer():
            return {**self.text_family.hf_tokenizer_assets(self.pretrained), **labels}
        return {"vocab.txt": "\n".join(self.vocabulary) + "\n", **labels}
