"""image_classification: a ViT on the embedded digits or a tfds image set.

Data: the images are resized to the model's `image_size` and given its
`num_channels`; pixels stay in [0, 255] (the model rescales them). Training
batches of epoch e: a permutation keyed by (seed, e) (a seeded buffer for
tfds), and zoom / shift / flip drawn by stateless ops keyed by seed, e and
the batch index. Metric: test accuracy. Export: uint8 images in, class
probabilities out (`keras_attn.export.export_image_classifier`).
"""

from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import process_positions
from keras_attn._base.quiet_tensorflow import traced_as_written

_SHARE = dict(ge=0, le=0.99)


class Augmentation(schema.Section):
    """Stateless, keyed by seed, epoch and batch."""

    zoom: float = field(0.0, **_SHARE, description="At most this share of the side cropped "
                                                   "away.")
    translation: float = field(0.0, **_SHARE, description="At most this share of the side "
                                                          "shifted.")
    flip: bool = field(False, description="Horizontal flips (wrong for digits).")


class ImageClassificationData(schema.TfdsSplits):
    """Embedded: scikit-learn's 1,797 8 x 8 digits, resized to the model's
    image_size and repeated to its num_channels; tfds: any image
    classification set (num_classes from its features); files: a folder
    with `train/`, `test/` and optionally `validation/`, each with one
    sub-folder of images per class (sorted names: the class ids)."""

    takes_files = True

    validation_fraction: float = field(
        0.1, **_SHARE, description="Share of the training images held out for validation "
                                   "(tfds: when validation_split is null, the end of "
                                   "train_split; files: when there is no validation/ "
                                   "folder).")
    test_fraction: float = field(0.2, gt=0, lt=1, only="embedded",
                                 description="The stratified test split (drawn with "
                                             "training.seed, as are every task's splits).")
    augmentation: Augmentation = field(Augmentation(), description="Training augmentation.")
    validation_split: Optional[str] = field(None, only="tfds",
                                            description="The validation split (null: none).")
    image_key: str = field("image", only="tfds", description="The feature with the image.")
    label_key: str = field("label", only="tfds", description="The feature with the label.")

    @pydantic.model_validator(mode="after")
    def _an_image_folder(self):
        if schema.dataset_kind(self.dataset) == "files":
            from keras_attn.data import files

            schema.check_files(self.dataset, files.check_image_folder, "path",
                               ("train", "test"))
        return self


PRETRAINED = "training.pretrained"
# config.json model_type of the Hugging Face image families the task fine-tunes.
_HF_MODEL_TYPES = ("vit", "dinov2_with_registers")


class ImageClassificationTraining(schema.Training):
    # Added after the task's first runs: left out while null, so that their
    # resolved recipes (fingerprints) are unchanged and they resume.
    null_left_out = ("lora", "pretrained")

    pretrained: Optional[str] = field(
        None, description="null: a new ViT (model.preset + overrides). A Hugging Face ViT "
                          "or DINOv2-with-registers directory (config.json, "
                          "model.safetensors, and its preprocessor_config.json): fine-tune "
                          "its encoder under the recipe's classes (its own head where it has "
                          "as many outputs, else a new one), at its image size and with its "
                          "processor's pixel normalisation. model.preset is not read and "
                          "model.overrides must be empty.")


def check_pretrained(path):
    """`training.pretrained` names a Hugging Face directory of a ViT or
    DINOv2 with registers; a `ValueError` naming the key otherwise."""
    import json
    import os

    weights = ("model.safetensors", "model.safetensors.index.json")
    config = os.path.join(path, "config.json")
    if not (os.path.isfile(config) and any(os.path.isfile(os.path.join(path, w))
                                           for w in weights)):
        raise ValueError(
            f"Recipe key `{PRETRAINED}` must be a Hugging Face ViT or DINOv2-with-registers "
            f"directory (config.json and model.safetensors, or its shards with "
            f"model.safetensors.index.json). Received: {PRETRAINED}={path!r}")
    with open(config, encoding="utf-8") as handle:
        model_type = json.load(handle).get("model_type")
    if model_type not in _HF_MODEL_TYPES:
        raise ValueError(
            f"Recipe key `{PRETRAINED}` names a Hugging Face directory of model_type "
            f"{model_type!r} ({config}); the image_classification task fine-tunes "
            f"{' or '.join(_HF_MODEL_TYPES)}. Received: {PRETRAINED}={path!r}")


class ImageClassificationEvaluation(schema.Evaluation):
    metric: Literal["accuracy"] = field(
        "accuracy", description="Test top-1 accuracy (`Model.evaluate`).")


class ImageClassification(Task):
    name = "image_classification"
    family = "vit"
    Data = ImageClassificationData
    Evaluation = ImageClassificationEvaluation
    Training = ImageClassificationTraining
    set_fields = ("num_classes",)
    class_names = None  # set with the data: the name of each output index
    embedded_data = "scikit-learn digits"
    metric_names = {"accuracy": "accuracy"}
    validation_file = "a validation/ folder (one sub-folder of images per class)"

    def load_data(self):
        from keras_attn.data import images
        from keras_attn.models.vit import replace_vit_config

        config = self._base_config()
        augmentation = self.data["augmentation"]
        self.augmentation = images.StatelessAugmentation(**augmentation)
        if self.embedded:
            self._load_digits(config)
        elif self.files:
            self._load_files(config)
        else:
            self._load_tfds(config)
        self.model_config = replace_vit_config(config, num_classes=self.num_classes)

    @property
    def pretrained(self):
        """`training.pretrained`: a Hugging Face directory, or None."""
        return self.training.get("pretrained")

    def _base_config(self):
        """The `ViTConfig` before the classes are known: the recipe's
        preset and overrides, or the checkpoint's (its image size, its
        processor's normalisation), read once."""
        from keras_attn.models.vit import get_vit_config

        if not self.pretrained:
            return get_vit_config(self.recipe["model"]["preset"],
                                  **self.recipe["model"]["overrides"])
        if getattr(self, "_checkpoint_config", None) is None:
            overrides = self.recipe["model"]["overrides"]
            if overrides:
                raise ValueError(
                    f"Recipe key `model.overrides` must be empty with {PRETRAINED} (the "
                    f"encoder is the checkpoint's). Received: model.overrides={overrides!r}")
            check_pretrained(self.pretrained)
            from keras_attn.convert import load_hf

            # The checkpoint's config as its converter reads it (config.json
            # and preprocessor_config.json), without its head.
            self._checkpoint_config = load_hf(self.pretrained).vit_config
        return self._checkpoint_config

    def model_note(self):
        if not self.pretrained:
            return None
        return (f"{PRETRAINED}: the encoder of the Hugging Face checkpoint {self.pretrained} "
                f"(its config and image processor; model.preset is not read) under a head "
                f"of this recipe's {self.num_classes} classes")

    def _load_digits(self, config):
        from sklearn.model_selection import train_test_split

        from keras_attn.data import images

        (x, y), self.test_arrays = images.load_digits_arrays(
            config.image_size, config.num_channels, self.data["test_fraction"], seed=self.seed
        )
        self.validation_arrays = None
        if self.data["validation_fraction"]:
            x, x_val, y, y_val = train_test_split(
                x, y, test_size=self.data["validation_fraction"], stratify=y,
                random_state=self.seed,
            )
            self.validation_arrays = (x_val, y_val)
        self.train_arrays = (x, y)
        self.num_classes = 10
        self.class_names = [str(digit) for digit in range(10)]
        self.batches_per_epoch = batch_count(len(x), self.batch_size)

    def _load_files(self, config):
        from keras_attn.data import files

        self.file_splits, class_names = files.image_files(
            self.files, self.data["validation_fraction"], self.seed,
            num_channels=config.num_channels)  # every image decoded once, refused by name
        self.num_classes, self.class_names = len(class_names), list(class_names)
        # The split names stand where tfds split strings do.
        self.splits = tuple(s if self.file_splits[s] else None for s in files.SPLITS)
        self.batches_per_epoch = batch_count(len(self.file_splits["train"][0]),
                                             self.batch_size)
        self._image_config = config

    def _tfds_splits(self):
        """(train, validation, test) split strings."""
        train, validation = self.data["train_split"], self.data["validation_split"]
        fraction = self.data["validation_fraction"]
        if validation is None and fraction:
            if "[" in train:
                raise ValueError(
                    "Recipe key `data.validation_split` must be set when train_split is "
                    "already sliced (validation_fraction slices it). "
                    f"Received: data.validation_split=None, data.train_split={train!r}"
                )
            percent = round(100 * (1 - fraction))
            train, validation = f"{train}[:{percent}%]", f"{train}[{percent}%:]"
        return train, validation, self.data["test_split"]

    def _load_tfds(self, config):
        features = self.tfds_builder().info.features
        key = self.data["label_key"]
        if key not in features or not hasattr(features[key], "num_classes"):
            raise ValueError(
                f"Recipe key `data.label_key` must name a class label of {self.tfds_name} "
                f"(features: {sorted(features)}). Received: data.label_key={key!r}"
            )
        self.num_classes = features[key].num_classes
        self.class_names = list(features[key].names)
        self.splits = self._tfds_splits()
        self.batches_per_epoch = batch_count(self.tfds_examples(self.splits[0]), self.batch_size)
        self._image_config = config

    def _tfds_dataset(self, split, **kwargs):
        from keras_attn.data import images

        config = self._image_config
        if self.files:
            return images.image_files_pipeline(
                *self.file_splits[split], config.image_size, config.num_channels,
                self.batch_size, seed=self.seed, **kwargs)
        dataset, _ = images.load_tfds_image_dataset(
            self.tfds_name, data_dir=self.data["data_dir"], split=split,
            image_size=config.image_size, batch_size=self.batch_size,
            image_key=self.data["image_key"], label_key=self.data["label_key"],
            download=False, seed=self.seed, num_channels=config.num_channels, **kwargs,
        )
        return dataset

    def train_dataset_fn(self, epoch):
        from keras_attn.data import images

        self.prepare()
        if self.embedded:
            x, y = self.train_arrays
            return images.make_image_pipeline(
                x, y, self.batch_size, training=True, augmentation=self.augmentation,
                seed=self.seed, epoch=epoch,
            )
        return self._tfds_dataset(self.splits[0], training=True,
                                  augmentation=self.augmentation, epoch=epoch)

    def _held_out(self, which):
        from keras_attn.data import images

        if self.embedded:
            arrays = self.validation_arrays if which == "validation" else self.test_arrays
            return None if arrays is None else images.make_image_pipeline(*arrays, self.batch_size)
        split = self.splits[1] if which == "validation" else self.splits[2]
        return None if split is None else self._tfds_dataset(split)

    def validation_data(self):
        self.prepare()
        return self._held_out("validation")

    def test_data(self):
        self.prepare()
        return self._held_out("test")

    # Prepared data: augmented batches are stored as the source pixels (uint8;
    # for the embedded digits once, as a table the batches index) and one
    # transform per image drawn by the pipeline's stateless ops, not as float
    # pixels: 60 epochs of the digits take 1.7 MiB instead of ~80.

    def prepared_tables(self):
        if self.embedded and self.augmentation:
            return {"train_images": self.train_arrays[0]}
        return {}

    def prepared_batches(self, split, epoch=None):
        if split != "train" or not self.augmentation:
            return super().prepared_batches(split, epoch)
        import tensorflow as tf

        from keras_attn._epochs import epoch_permutation

        self.prepare()
        key = tf.constant([self.seed, epoch], tf.int64)
        if self.embedded:
            # make_image_pipeline's order, as rows of the table.
            x, y = self.train_arrays
            order = epoch_permutation(len(x), self.seed, epoch)
            dataset = tf.data.Dataset.from_tensor_slices((order, y[order])).batch(self.batch_size)
            shape = tf.constant(x.shape[1:3], tf.int32)
            part = "index"
        else:
            dataset = self._tfds_dataset(self.splits[0], training=True, epoch=epoch)
            shape, part = None, "x"

        def with_transforms(i, batch):
            rows, labels = batch
            size = tf.shape(rows)[0]
            height, width = (shape[0], shape[1]) if shape is not None else (
                tf.shape(rows)[1], tf.shape(rows)[2])
            seed = tf.random.experimental.stateless_fold_in(key, i)
            return {part: rows, "y": labels,
                    "transforms": self.augmentation.transforms(size, height, width, seed)}

        return dataset.enumerate().map(traced_as_written(with_transforms))

    def process_train_dataset_fn(self, replicas, process, processes):
        if not (self.embedded and self.augmentation):
            return None
        import tensorflow as tf

        self.prepare()
        images = self.train_arrays[0]
        height, width = images.shape[1:3]

        def own_rows(batch):
            size = tf.shape(batch["y"])[0]
            positions = own_positions(size)
            rows = positions % size
            pixels = tf.cast(tf.gather(table, tf.gather(batch["index"], rows)), "float32")
            # Each image's own transform, drawn for the whole batch
            # (prepared_batches): images.StatelessAugmentation's op.
            x = tf.raw_ops.ImageProjectiveTransformV3(
                images=pixels, transforms=tf.gather(batch["transforms"], rows),
                output_shape=[height, width], fill_value=0.0, interpolation="BILINEAR",
                fill_mode="CONSTANT")
            return self.weightless_rows((x, tf.gather(batch["y"], rows)), positions < size)

        own_positions = process_positions(replicas, process, processes, arange=tf.range)
        table = tf.constant(images)
        return lambda epoch: self.prepared_batches("train", epoch).map(
            traced_as_written(own_rows), num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE)

    def finish_prepared(self, parts, tables):
        if "transforms" not in parts:
            return super().finish_prepared(parts, tables)
        import keras

        pixels = tables["train_images"][parts["index"]] if "index" in parts else parts["x"]
        # The op of images.StatelessAugmentation, with its transforms.
        x = keras.ops.image.affine_transform(
            pixels.astype("float32"), parts["transforms"], interpolation="bilinear",
            fill_mode="constant", fill_value=0.0)
        return keras.ops.convert_to_numpy(x), parts["y"]

    def prepared_state(self):
        return dict(super().prepared_state(), num_classes=self.num_classes,
                    class_names=list(self.class_names),
                    index_rows=len(self.prepared_tables().get("train_images", ())))

    def use_prepared(self, state):
        from keras_attn.models.vit import replace_vit_config

        self.num_classes = state["num_classes"]
        # Data prepared before the names were kept: the export carries none.
        self.class_names = state.get("class_names")
        self.model_config = replace_vit_config(self._base_config(),
                                               num_classes=self.num_classes)
        super().use_prepared(state)

    def make_model(self, preset, overrides):
        from keras_attn.models.vit import build_vit

        if self.pretrained:
            from keras_attn.convert import load_hf

            # The checkpoint's encoder; its own head where it has as many
            # outputs, else a new one (drawn from the recipe's seed).
            if self.class_names is None:  # data prepared before the names were kept
                return load_hf(self.pretrained, num_classes=self.num_classes)
            return load_hf(self.pretrained, class_names=list(self.class_names))
        return build_vit(preset, num_classes=self.num_classes, **overrides)

    def assume_data_sizes(self):
        import tensorflow_datasets as tfds

        if self.files:
            from keras_attn.data import files

            self.class_names = list(files.image_files(self.files)[1])
            self.num_classes = len(self.class_names)
            return

        feature = tfds.builder(self.tfds_name).info.features[self.data["label_key"]]
        self.num_classes, self.class_names = feature.num_classes, list(feature.names)

    def compile_arguments(self, model):
        import keras

        # Means over the rows' weights: a filler row of weight 0 (several
        # replicas, `even_batches`) counts in neither; without weights, the
        # plain means.
        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"),
            "metrics": None,  # not the model's "auto" accuracy beside the weighted one
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def evaluate(self, model):
        self.prepare()
        return self.evaluate_batches(model, self.test_data())

    def export(self, model, path, format="saved_model", precision="float32"):
        from keras_attn.export import export_image_classifier

        self.check_export_format(format, precision)
        self.prepare()
        return export_image_classifier(model, path, format=format, precision=precision,
                                       class_names=self.class_names)

    def assets(self):
        """labels.txt: the class of each output index (folder names, tfds
        label names, the digits "0".."9")."""
        self.prepare()
        return {} if self.class_names is None else {
            "labels.txt": "\n".join(self.class_names) + "\n"}

    def evaluate_served(self, serve):
        self.prepare()
        correct = total = 0
        for images, labels in self.test_data():
            probabilities = serve({"images": np.asarray(images).astype("uint8")})["probabilities"]
            labels = np.asarray(labels).reshape(-1)
            correct += int(np.sum(np.argmax(probabilities, axis=-1) == labels))
            total += len(labels)
        return {"accuracy": correct / total}

    def example_inputs(self):
        self.prepare()
        images, _ = next(iter(self._held_out("test")))
        return {"images": np.asarray(images)[:8].astype("uint8")}

    def reference_outputs(self, model, inputs):
        import keras

        logits = model.predict(inputs["images"].astype("float32"), verbose=0)
        return {"probabilities": np.asarray(keras.ops.softmax(logits.astype("float32"), -1))}

    def served_outputs(self, loaded, inputs):
        return {"probabilities": np.asarray(loaded.serve(inputs["images"]))}
