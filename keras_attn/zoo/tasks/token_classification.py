"""token_classification: a `BertTokenClassifier` tagging words (named
entities, parts of speech).

Data: files: a folder of CSV / JSONL tables with a test set
(`keras_attn.data.load_token_classification_files`' layout: words and one
tag per word, JSON lists or white-space separated strings); tfds: a set of
word and tag sequences (conll2003: `tokens`, `ner`). There is no embedded
data set (no tagged text ships with the packages this one needs). The
examples are held in memory; training batches of epoch e are a permutation
keyed by (seed, e). Words are split into WordPieces, a word's tag on its
first piece; the other pieces, `[CLS]`, `[SEP]` and padding weigh 0
(`keras_attn.data.text.token_classification_dataset`). Metric: the
accuracy over words (their first pieces). Export: a SavedModel of token
ids in, per-token tag probabilities out (words to ids as the training
data; ONNX and LiteRT are not written for this task yet); the run
directory gets `vocab.txt` and `labels.txt`.
"""

from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks._bert_text import BertTextData
from keras_attn.zoo.tasks._bert_text import BertTextTask


def tag_field(tags_key, dataset):
    """The tags' feature or column: `data.tags_key`, or its default."""
    if tags_key is not None:
        return tags_key
    return "ner" if schema.dataset_kind(dataset) == "tfds" else "tags"


class TokenClassificationData(BertTextData):
    """No embedded data set; tfds: a set of word and tag sequences
    (conll2003: tokens_key "tokens", tags_key "ner"); files: a folder with
    `train.csv|jsonl`, `test.*` and optionally `validation.*`, each row
    words and one tag per word (JSON lists, or white-space separated in
    CSV; tag ids, or names: sorted names are the ids)."""

    tokens_key: str = field("tokens", only="tfds or files",
                            description="The feature (files: the column or field) with the "
                                        "words.")
    tags_key: Optional[str] = field(None, only="tfds or files",
                                    description='The feature (files: the column or field) with '
                                                'the tags (null: "ner" for tfds, "tags" for '
                                                'files).')

    def table_fields(self):
        from keras_attn.data import files

        return {self.tokens_key: files.WORDS, tag_field(self.tags_key, self.dataset): files.TAGS}

    @pydantic.model_validator(mode="after")
    def _no_embedded_data(self):
        if self.dataset == schema.EMBEDDED:
            raise schema.key_error("dataset", "is \"embedded\", which token_classification "
                                              "does not have: use your files "
                                              "(\"files:<path>\") or \"tfds:<name>\"",
                                   self.dataset)
        return self


class TokenClassificationEvaluation(schema.Evaluation):
    metric: Literal["accuracy"] = field(
        "accuracy", description="Test accuracy over words (each word's first WordPiece).")


class TokenClassification(BertTextTask):
    name = "token_classification"
    Data = TokenClassificationData
    Evaluation = TokenClassificationEvaluation
    embedded_data = None
    metric_names = {"accuracy": "word accuracy"}

    def _tag_field(self):
        return tag_field(self.data.get("tags_key"), self.data["dataset"])

    def _files_splits(self):
        from keras_attn.data import files

        words, tag_ids, class_names = files.tagged_rows(
            self.files, self.data["validation_fraction"], self.seed, self.data["tokens_key"],
            self._tag_field())
        self._set_classes(class_names)
        return {split: None if words[split] is None else (words[split], tag_ids[split])
                for split in words}

    def _tfds_splits(self):
        tokens_key, tags_key = self.data["tokens_key"], self._tag_field()
        features = self._tfds_features({"tokens_key": tokens_key, "tags_key": tags_key})
        feature = getattr(features[tags_key], "feature", None)
        if not hasattr(feature, "num_classes"):
            raise ValueError(f"Recipe key `data.tags_key` must name a sequence of class labels "
                             f"of {self.tfds_name}. Received: data.tags_key={tags_key!r}")
        self._set_classes(feature.names)
        return self._tfds_columns(
            tokens_key, tags_key, lambda rows: [[w.decode("utf-8") for w in row] for row in rows],
            lambda rows: [np.asarray(row, "int32") for row in rows])

    def _training_texts(self, examples):
        return [" ".join(words) for words in examples]

    def _batches(self, words, tags, batch_size):
        from keras_attn.data import text

        return text.token_classification_dataset(
            words, list(tags), self.tokenizer, self.data["sequence_length"], batch_size)

    def assume_data_sizes(self):
        self.vocabulary = [None] * self.data["vocabulary_size"]  # the size asked for
        self.pretrained = self.training.get("pretrained")
        if self.files:
            self._files_splits()
        else:
            import tensorflow_datasets as tfds

            features = tfds.builder(self.tfds_name).info.features
            self.num_classes = features[self._tag_field()].feature.num_classes

    def build_head(self, backbone):
        return self.text_family.token_classifier(backbone, self.num_classes)

    # === Export: token ids in, tag probabilities out ===

    def check_export_format(self, format, precision="float32"):
        super().check_export_format(format, precision)
        if format != "saved_model":
            raise ValueError(
                f"Recipes of task {self.name!r} are exported as a SavedModel (token ids in) "
                f"only; ONNX and LiteRT are not written for it yet. Received: format={format!r}")

    def export(self, model, path, format="saved_model", precision="float32"):
        import tensorflow as tf

        from keras_attn.export import export_saved_model

        self.check_export_format(format, precision)

        names = self.input_names()

        def serve(*inputs):
            logits = model(dict(zip(names, inputs)), training=False)
            return {"probabilities": tf.nn.softmax(tf.cast(logits, "float32"), axis=-1)}

        signature = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
        return export_saved_model(model, path, input_signature=signature, serving_fn=serve)

    def evaluate_served(self, serve):
        correct = total = 0.0
        for x, tags, weights in self.test_data():
            inputs = {name: np.asarray(x[name], "int32") for name in self.input_names()}
            predicted = np.asarray(serve(inputs)["probabilities"]).argmax(-1)
            weights = np.asarray(weights)
            correct += float(np.sum((predicted == np.asarray(tags)) * weights))
            total += float(np.sum(weights))
        return {"accuracy": correct / total}

    def example_inputs(self):
        self.prepare()
        x, _, _ = next(iter(self.test_data()))
        return {name: np.asarray(x[name], "int32")[:4] for name in self.input_names()}

    def reference_outputs(self, model, inputs):
        import keras

        logits = model.predict(dict(inputs), verbose=0)
        return {"probabilities": np.asarray(keras.ops.softmax(logits.astype("float32"), -1))}

    def served_outputs(self, loaded, inputs):
        outputs = loaded.serve(*(inputs[name] for name in self.input_names()))
        return {"probabilities": np.asarray(outputs["probabilities"])}
