"""Image datasets for ViT: the offline digits and any tensorflow-datasets
image dataset, as `tf.data` pipelines of `(pixels, label)` batches.

Pixels stay in [0, 255] (uint8, or float32 after resizing or augmentation):
the model rescales them itself (see `keras_attn.models.vit.ViT`).

TensorFlow only: imported lazily, never by `import keras_attn`.
"""

import numpy as np
import tensorflow as tf

import keras

AUTOTUNE = tf.data.AUTOTUNE


def load_digits_arrays(image_size=16, num_channels=1, test_fraction=0.2, seed=0):
    """scikit-learn's 1,797 handwritten digits as uint8 images.

    The 8 x 8 images (values 0..16) are scaled to 0..255, resized bilinearly
    to `image_size` and repeated to `num_channels`. The split is stratified
    and fixed by `seed`.

    Args:
        image_size: side of the returned images (8 keeps the originals).
        num_channels: 1 (grey) or more (copies of the grey channel).
        test_fraction: share of the examples held out for testing.
        seed: seed of the split.

    Returns:
        `((x_train, y_train), (x_test, y_test))`: uint8 `(N, S, S, C)` images
        and int32 labels in 0..9.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if num_channels < 1:
        raise ValueError(
            f"`num_channels` must be at least 1. Received: num_channels={num_channels}"
        )
    digits = load_digits()
    images = digits.images.astype("float32")[..., None] * (255.0 / 16.0)  # (N, 8, 8, 1)
    if image_size != 8:
        images = tf.image.resize(images, (image_size, image_size), "bilinear").numpy()
    images = np.clip(np.round(images), 0, 255).astype("uint8")
    images = np.repeat(images, num_channels, axis=-1)  # (N, S, S, C)
    labels = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, stratify=labels, random_state=seed
    )
    return (x_train, y_train), (x_test, y_test)


def image_augmentation(zoom=0.2, translation=0.1, rotation=0.0, flip=False, seed=None):
    """Random augmentation built from Keras preprocessing layers.

    Args:
        zoom: at most this share of the side is cropped away and the crop
            resized back (a random resized crop, keeping the aspect ratio
            and the whole image in view at 0). 0 turns it off.
        translation: shift of at most this share of the side. 0: off.
        rotation: rotation of at most this share of a full turn. 0: off.
        flip: random horizontal flips. Right for natural images; wrong for
            digits and text, whose mirror image is another symbol.
        seed: seed of the random layers.

    Returns:
        A `keras.Sequential` mapping `(B, H, W, C)` float pixels to the same
        shape; the identity when everything is off.
    """
    layers = []
    # Empty areas are filled with 0: the background of the digits.
    if zoom:
        layers.append(
            keras.layers.RandomZoom((-zoom, 0.0), fill_mode="constant", seed=seed, name="random_zoom")
        )
    if translation:
        layers.append(
            keras.layers.RandomTranslation(
                translation, translation, fill_mode="constant", seed=seed, name="random_translation"
            )
        )
    if rotation:
        layers.append(
            keras.layers.RandomRotation(rotation, fill_mode="constant", seed=seed, name="random_rotation")
        )
    if flip:
        layers.append(keras.layers.RandomFlip("horizontal", seed=seed, name="random_flip"))
    return keras.Sequential(layers, name="image_augmentation")


def make_image_pipeline(
    images, labels, batch_size, training=False, augmentation=None, seed=0
):
    """A batched `tf.data.Dataset` of `(pixels, label)` from arrays.

    Args:
        images: `(N, H, W, C)` pixels in [0, 255].
        labels: `(N,)` integer labels.
        batch_size: examples per batch.
        training: shuffle each epoch and apply `augmentation`.
        augmentation: a layer (e.g. from `image_augmentation`) applied to
            each training batch; None for none.
        seed: seed of the shuffle.
    """
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    return _batch(dataset, batch_size, training, augmentation, seed, len(images))


def _batch(dataset, batch_size, training, augmentation, seed, shuffle_buffer):
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size)
    if training and augmentation is not None:
        dataset = dataset.map(
            lambda x, y: (augmentation(tf.cast(x, "float32"), training=True), y),
            num_parallel_calls=AUTOTUNE,
        )
    return dataset.prefetch(AUTOTUNE)


def load_digits_dataset(
    image_size=16,
    num_channels=1,
    batch_size=64,
    augmentation="default",
    seed=0,
):
    """The digits as `(train, test)` tf.data pipelines.

    Args:
        image_size: side of the images.
        num_channels: channels of the images.
        batch_size: examples per batch.
        augmentation: `"default"` (zoom and shift, no flips: a mirrored digit
            is not the same digit), None for none, or any layer.
        seed: seed of the split, the shuffle and the augmentation.

    Returns:
        `(train, test)` datasets of `(pixels, label)` batches.
    """
    (x_train, y_train), (x_test, y_test) = load_digits_arrays(
        image_size, num_channels, seed=seed
    )
    if isinstance(augmentation, str):
        if augmentation != "default":
            raise ValueError(
                "`augmentation` must be 'default', None or a layer. "
                f"Received: augmentation={augmentation!r}"
            )
        augmentation = image_augmentation(zoom=0.15, translation=0.1, seed=seed)
    train = make_image_pipeline(x_train, y_train, batch_size, True, augmentation, seed)
    test = make_image_pipeline(x_test, y_test, batch_size)
    return train, test


def load_tfds_image_dataset(
    name,
    data_dir=None,
    split="train",
    image_size=None,
    batch_size=32,
    training=False,
    augmentation=None,
    image_key="image",
    label_key="label",
    download=True,
    seed=0,
):
    """Any tensorflow-datasets image classification dataset, batched.

    Args:
        name: a tfds name (`"cifar10"`, `"imagenette/160px"`, `"mnist"`...).
        data_dir: where tfds keeps its data; None for its default.
        split: a tfds split (`"train"`, `"test[:10%]"`...).
        image_size: resize every image to this square side (needed when the
            images differ in size); None keeps them.
        batch_size: examples per batch.
        training: shuffle and apply `augmentation`.
        augmentation: a layer applied to training batches, or None.
        image_key: the image feature.
        label_key: the label feature.
        download: let tfds download and prepare the data when missing.
        seed: seed of the shuffle.

    Returns:
        `(dataset, info)`: batches of `(pixels, label)` with pixels in
        [0, 255] (uint8, float32 once resized), and the `tfds.core.DatasetInfo`
        (`info.features[label_key].num_classes`).
    """
    import tensorflow_datasets as tfds

    dataset, info = tfds.load(
        name, split=split, data_dir=data_dir, with_info=True, download=download
    )
    for arg, key in (("image_key", image_key), ("label_key", label_key)):
        if key not in info.features:
            raise ValueError(
                f"Dataset {name!r} has no feature {key!r}; its features are "
                f"{sorted(info.features)}. Received: {arg}={key!r}"
            )

    def select(example):
        image = example[image_key]
        if image_size is not None:
            image = tf.image.resize(image, (image_size, image_size), "bilinear")
        return image, tf.cast(example[label_key], "int32")

    dataset = dataset.map(select, num_parallel_calls=AUTOTUNE)
    return _batch(dataset, batch_size, training, augmentation, seed, 4 * batch_size), info
