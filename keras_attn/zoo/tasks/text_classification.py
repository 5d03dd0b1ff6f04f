"""text_classification: a `BertSequenceClassifier` on sentences and their
labels.

Data: embedded: the sentences of four help topics of the documentation
inside CPython (`specialnames`, `compound`, `debugger`, `string-methods`;
label = the topic: examples/bert_finetune.py's default), a stratified test
split and validation share drawn with the seed; files: a folder of CSV /
JSONL tables with a test set (`keras_attn.data.
load_text_classification_files`' layout, the columns `data.text_key` and
`data.label_key`); tfds: a text set with a
class label. The examples are held in memory; training batches of epoch e
are a permutation keyed by (seed, e), packed `[CLS] text [SEP]`. The
vocabulary is learned from the training texts, or is the pretrained
backbone's (`training.pretrained`). Metric: test accuracy. Export: raw
strings in, class probabilities out (`keras_attn.export.
export_text_classifier`; ONNX and LiteRT take the token ids); the run
directory gets `vocab.txt` and `labels.txt`. A Hugging Face RoBERTa, XLM-R
or ModernBERT directory as `training.pretrained` brings its own tokenizer:
the rows are packed with its special tokens and padding id, the run
directory gets its tokenizer files instead of `vocab.txt`, and the export
carries the directory's `tokenizer.json` (raw strings in, every format:
`keras_attn.export.TextClassifierArtifact` serves ONNX and LiteRT without
TensorFlow; the SavedModel runs keras-hub's tokenizer, whose ops need
`import tensorflow_text` before `tf.saved_model.load`).

Family `modernbert` (a recipe in models/modernbert/): a
`ModernBertSequenceClassifier` (`[CLS]` pooling) on the same rows without
`segment_ids`, the vocabulary learned as for BERT or a modernbert masked_lm
run's (`training.pretrained`).
"""

import os
from typing import Literal

import numpy as np

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks._bert_text import BertTextData
from keras_attn.zoo.tasks._bert_text import BertTextTask

# examples/bert_finetune.py's default data: label = the topic.
TOPICS = ("specialnames", "compound", "debugger", "string-methods")


class TextClassificationData(BertTextData):
    """Embedded: 1,394 sentences of four CPython help topics, label = the
    topic; tfds: any set with a text and a class label; files: a folder with
    `train.csv|jsonl`, `test.*` and optionally `validation.*`, each row a
    text and a label (a class id, or a name: sorted names are the ids)."""

    test_fraction: float = field(0.2, gt=0, lt=1, only="embedded",
                                 description="The stratified test split (drawn with "
                                             "training.seed).")
    text_key: str = field("text", only="tfds or files",
                          description="The feature (files: the column or field) with the text.")
    label_key: str = field("label", only="tfds or files",
                           description="The feature (files: the column or field) with the label.")

    def table_fields(self):
        from keras_attn.data import files

        return {self.text_key: files.TEXT, self.label_key: files.LABEL}


class TextClassificationEvaluation(schema.Evaluation):
    metric: Literal["accuracy"] = field("accuracy", description="Test accuracy "
                                                                "(`Model.evaluate`).")


def load_topic_sentences():
    """`(texts, labels, class_names)`: the sentences of the four `TOPICS`."""
    from pydoc_data.topics import topics

    from keras_attn.data import text

    texts, labels = [], []
    for label, key in enumerate(TOPICS):
        sentences = text.split_sentences(topics[key])
        texts += sentences
        labels += [label] * len(sentences)
    return texts, np.asarray(labels, "int32"), list(TOPICS)


class TextClassification(BertTextTask):
    name = "text_classification"
    Data = TextClassificationData
    Evaluation = TextClassificationEvaluation
    embedded_data = "sentences of 4 CPython help topics"
    metric_names = {"accuracy": "accuracy"}

    def _embedded_splits(self):
        from sklearn.model_selection import train_test_split

        texts, labels, class_names = load_topic_sentences()
        self._set_classes(class_names)
        x, x_test, y, y_test = train_test_split(
            texts, labels, test_size=self.data["test_fraction"], stratify=labels,
            random_state=self.seed)
        splits = {"train": (x, y), "test": (x_test, y_test), "validation": None}
        if self.data["validation_fraction"]:
            x, x_val, y, y_val = train_test_split(
                x, y, test_size=self.data["validation_fraction"], stratify=y,
                random_state=self.seed)
            splits.update(train=(x, y), validation=(x_val, y_val))
        return splits

    def _files_splits(self):
        from keras_attn.data import files

        keys = [self.data["text_key"], self.data["label_key"]]
        rows = files.table_rows(self.files, {keys[0]: files.TEXT, keys[1]: files.LABEL},
                                self.data["validation_fraction"], self.seed)
        labels, class_names = files.row_labels(rows, keys[1], self.files)
        self._set_classes(class_names)
        return {split: None if r is None else ([str(row[keys[0]]) for row in r], labels[split])
                for split, r in rows.items()}

    def _tfds_splits(self):
        text_key, label_key = self.data["text_key"], self.data["label_key"]
        features = self._tfds_features({"text_key": text_key, "label_key": label_key})
        if not hasattr(features[label_key], "num_classes"):
            raise ValueError(f"Recipe key `data.label_key` must name a class label of "
                             f"{self.tfds_name}. Received: data.label_key={label_key!r}")
        self._set_classes(features[label_key].names)
        return self._tfds_columns(text_key, label_key,
                                  lambda texts: [t.decode("utf-8") for t in texts],
                                  lambda labels: np.asarray(labels, "int32"))

    def _training_texts(self, texts):
        return texts

    def _batches(self, texts, labels, batch_size):
        from keras_attn.data import text

        return text.classification_dataset(texts, labels, self.tokenizer,
                                           self.data["sequence_length"], batch_size)

    def compile_arguments(self, model):
        import keras

        # BertSequenceClassifier's "auto" loss and accuracy, as means over
        # the rows' weights: a filler row of weight 0 (several replicas,
        # `even_batches`) counts in neither; without weights, the same.
        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"),
            "metrics": None,
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def assume_data_sizes(self):
        self.vocabulary = [None] * self.data["vocabulary_size"]  # the size asked for
        self.pretrained = self.training.get("pretrained")
        if self.embedded:
            self.num_classes = len(TOPICS)
        elif self.files:
            self._files_splits()
        else:
            import tensorflow_datasets as tfds

            features = tfds.builder(self.tfds_name).info.features
            self.num_classes = features[self.data["label_key"]].num_classes

    def build_head(self, backbone):
        return self.text_family.sequence_classifier(backbone, self.num_classes)

    # === Export: raw strings (SavedModel) or token ids (ONNX, LiteRT) ===

    def export(self, model, path, format="saved_model", precision="float32"):
        from keras_attn.export import export_text_classifier

        self.check_export_format(format, precision)
        self.prepare()
        if self.hf_tokenizer():
            # The checkpoint's tokenizer.json travels with the export (a
            # server without TensorFlow tokenizes with it). Without one
            # (vocab.json and merges.txt alone), a SavedModel of token ids.
            file = os.path.join(self.pretrained, "tokenizer.json")
            if not os.path.isfile(file):
                return self._export_token_ids(model, path, format)
            self.tokenizer.hf_tokenizer_file = os.path.abspath(file)
        return export_text_classifier(model, self.tokenizer, path,
                                      sequence_length=self.data["sequence_length"],
                                      format=format, precision=precision,
                                      class_names=self.class_names)

    def evaluate_served(self, serve):
        """Accuracy of an export fed the test set's token ids (the inputs
        ONNX and LiteRT take; a SavedModel's `serve_ids`): its raw-string
        `serve` is checked against the Keras model by `example_inputs`."""
        correct = total = 0
        for x, labels in self.test_data():
            ids = {name: np.asarray(x[name], "int32") for name in self.input_names()}
            probabilities = np.asarray(serve(ids)["probabilities"])
            correct += int(np.sum(probabilities.argmax(-1) == np.asarray(labels)))
            total += len(labels)
        return {"accuracy": correct / total}

    def _export_token_ids(self, model, path, format):
        """The SavedModel of a model whose Hugging Face tokenizer has no
        `tokenizer.json` (RoBERTa's `vocab.json` and `merges.txt` alone),
        which `export_text_classifier` refuses (a server could not
        tokenize as the model was trained): token ids in (`serve_ids`,
        also `serve`, the family's inputs: `(B, T)` int32), probabilities
        out, labels.txt in its assets; the run directory holds the
        tokenizer's files. ONNX and LiteRT refused by name."""
        import tensorflow as tf

        from keras_attn.export.portable import labels_text
        from keras_attn.export.saved_model import export_saved_model

        if format != "saved_model":
            raise ValueError(
                f"The {self.text_family.title} checkpoint {self.pretrained} "
                f"(training.pretrained) has no tokenizer.json, which an ONNX or LiteRT export "
                f"carries for its server; such a run exports a SavedModel of token ids only. "
                f"Write the file with transformers: AutoTokenizer.from_pretrained(d)."
                f"save_pretrained(d). Received: format={format!r}")
        names = self.input_names()

        def serve_ids(*ids):
            logits = model(dict(zip(names, ids)), training=False)
            return tf.nn.softmax(tf.cast(logits, "float32"), axis=-1)

        specs = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
        return export_saved_model(model, path, input_signature=specs, serving_fn=serve_ids,
                                  extra_endpoints={"serve_ids": (serve_ids, specs)},
                                  assets={"labels.txt": labels_text(self.class_names)})

    def example_inputs(self):
        """Test texts; the token ids of them for a model exported with token
        ids in (`_export_token_ids`)."""
        self.prepare()
        texts = {"text": np.array(self.splits["test"][0][:8], dtype=object)}
        return self._token_ids(texts) if self._ids_export() else texts

    def _ids_export(self):
        return self.hf_tokenizer() and not os.path.isfile(
            os.path.join(self.pretrained, "tokenizer.json"))

    def _token_ids(self, inputs):
        names = self.input_names()
        if "text" not in inputs:
            return {name: inputs[name] for name in names}
        from keras_attn.data import text

        # The tokenizer's own special tokens and padding (text.text_form).
        packed = text.pack_pairs(self.tokenizer, self.data["sequence_length"])(
            list(inputs["text"]))
        packed = dict(zip(("token_ids", "segment_ids", "padding_mask"), packed))
        return {name: np.asarray(packed[name]) for name in names}

    def reference_outputs(self, model, inputs):
        import keras

        self.prepare()
        logits = model.predict(self._token_ids(inputs), verbose=0)
        return {"probabilities": np.asarray(keras.ops.softmax(logits.astype("float32"), -1))}

    def served_outputs(self, loaded, inputs):
        if "text" in inputs:
            return {"probabilities": np.asarray(loaded.serve(list(inputs["text"])))}
        return {"probabilities": np.asarray(
            loaded.serve_ids(*(inputs[n] for n in self.input_names())))}
