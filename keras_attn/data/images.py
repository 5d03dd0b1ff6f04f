"""Image datasets for ViT: the offline digits and any tensorflow-datasets
image dataset, as `tf.data` pipelines of `(pixels, label)` batches.

Pixels stay in [0, 255] (uint8, or float32 after resizing or augmentation):
the model rescales them itself (see `keras_attn.models.vit.ViT`).

TensorFlow only: imported lazily, never by `import keras_attn`.
"""

import numpy as np

import keras

from keras_attn._epochs import epoch_permutation
from keras_attn._epochs import epoch_seed
from keras_attn._base.quiet_tensorflow import tensorflow_module
from keras_attn._base.quiet_tensorflow import traced_as_written

tf = tensorflow_module()  # import tensorflow, its start-up notices held back

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


class StatelessAugmentation:
    """Random zoom-in, shift and flip drawn from stateless ops: a pure
    function of the pixels and a seed, so that an epoch's batches can be
    produced again (`keras_attn.training.resumable` resumes mid-epoch).

    The same transformations as `image_augmentation` (Keras' RandomZoom,
    RandomTranslation and RandomFlip, empty areas filled with 0), applied
    with one `ImageProjectiveTransformV3` per batch; every image of the
    batch gets its own draw.

    Args:
        zoom: at most this share of the side is cropped away (zoom in).
        translation: shift of at most this share of the side.
        flip: random horizontal flips.

    Call arguments:
        images: `(B, H, W, C)` pixels.
        seed: `(2,)` integer tensor; the same seed gives the same output.

    Returns:
        float32 `(B, H, W, C)`.
    """

    def __init__(self, zoom=0.0, translation=0.0, flip=False):
        for name, value in (("zoom", zoom), ("translation", translation)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value}")
        self.zoom, self.translation, self.flip = zoom, translation, flip

    def __bool__(self):
        return bool(self.zoom or self.translation or self.flip)

    def transforms(self, batch, height, width, seed):
        """The `(batch, 8)` projective transforms (Keras's and TensorFlow's
        layout) a call with this seed applies: a pure function of the seed
        and the batch's shape. `keras-attn prepare` stores them, so that a
        machine without TensorFlow applies the same ones
        (`keras.ops.image.affine_transform`)."""
        height, width = tf.cast(height, "float32"), tf.cast(width, "float32")
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)

        def uniform(i, low, high):
            return tf.random.stateless_uniform([batch], seeds[i], low, high)

        # Output pixel (x, y) samples the input at (scale x + x0, scale y + y0):
        # scale < 1 zooms in around the centre, (dx, dy) shifts the content.
        scale = 1.0 - self.zoom * uniform(0, 0.0, 1.0)
        dx = self.translation * width * uniform(1, -1.0, 1.0)
        dy = self.translation * height * uniform(2, -1.0, 1.0)
        x0 = (1.0 - scale) * (width - 1.0) / 2.0 - dx
        y0 = (1.0 - scale) * (height - 1.0) / 2.0 - dy
        a = scale
        if self.flip:  # mirror x: x_in -> (W - 1) - x_in
            mirrored = uniform(3, 0.0, 1.0) < 0.5
            a = tf.where(mirrored, -scale, scale)
            x0 = tf.where(mirrored, width - 1.0 - x0, x0)
        zeros = tf.zeros_like(scale)
        return tf.stack([a, zeros, x0, zeros, scale, y0, zeros, zeros], axis=1)  # (B, 8)

    def __call__(self, images, seed):
        images = tf.cast(images, "float32")
        shape = tf.shape(images)
        return tf.raw_ops.ImageProjectiveTransformV3(
            images=images,
            transforms=self.transforms(shape[0], shape[1], shape[2], seed),
            output_shape=shape[1:3],
            fill_value=0.0,
            interpolation="BILINEAR",
            fill_mode="CONSTANT",
        )


def make_image_pipeline(
    images, labels, batch_size, training=False, augmentation=None, seed=0, epoch=None
):
    """A batched `tf.data.Dataset` of `(pixels, label)` from arrays.

    Args:
        images: `(N, H, W, C)` pixels in [0, 255].
        labels: `(N,)` integer labels.
        batch_size: examples per batch.
        training: shuffle each epoch and apply `augmentation`.
        augmentation: a layer (e.g. from `image_augmentation`) applied to
            each training batch; None for none. With `epoch`: a
            `StatelessAugmentation` (or None).
        seed: seed of the shuffle.
        epoch: None: one dataset for every epoch (reshuffled at each pass).
            An int: this epoch's batches only, a pure function of
            `(seed, epoch)` (order and augmentation), the same at every pass.
    """
    if training and epoch is not None:
        order = epoch_permutation(len(images), seed, epoch)
        images, labels = np.asarray(images)[order], np.asarray(labels)[order]
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    return _batch(dataset, batch_size, training, augmentation, seed, len(images), epoch,
                  shuffled=epoch is not None)


def decode_image_file(contents, num_channels):
    """The `(H, W, num_channels)` uint8 pixels of an image file's bytes
    (PNG, JPEG, GIF's first frame, BMP, whatever its name says).

    TensorFlow's GIF decoder gives RGB only: a GIF for a grey model is
    decoded in RGB and made grey (`tf.image.rgb_to_grayscale`).
    """
    def decode(channels):
        return tf.io.decode_image(contents, channels=channels, expand_animations=False)

    if num_channels != 1:
        return decode(num_channels)
    is_gif = tf.equal(tf.strings.substr(contents, 0, 3), b"GIF")
    return tf.cond(is_gif, lambda: tf.image.rgb_to_grayscale(decode(3)), lambda: decode(1))


def check_image_files(paths, num_channels, argument="path"):
    """Decodes each image file once, as `image_files_pipeline` will (in
    parallel, in `tf.data`); a `keras_attn.errors.DataFileError` naming the
    first file that does not decode (a truncated PNG or JPEG, a file that is
    no image), and how many do not."""
    from keras_attn.errors import DataFileError

    files = tf.constant(list(paths), tf.string)

    def decoded(index):
        # The shape depends on the pixels: the decoding cannot be pruned.
        return index, tf.shape(decode_image_file(tf.io.read_file(files[index]), num_channels))

    good = tf.data.Dataset.range(len(paths)).map(
        traced_as_written(decoded), num_parallel_calls=AUTOTUNE, deterministic=False
    ).ignore_errors()
    bad = sorted(set(range(len(paths))) - {int(i) for i, _ in good.as_numpy_iterator()})
    if not bad:
        return
    try:
        decode_image_file(tf.io.read_file(paths[bad[0]]), num_channels)
        reason = "it did not decode in tf.data"
    except tf.errors.OpError as error:
        # TensorFlow's message, without the op's "{{function_node ...}}" and "[Op:...]".
        reason = error.message.split("}}")[-1].split(" [Op:")[0].strip().rstrip(".")
    others = f" ({len(bad) - 1} other file{'s' if len(bad) > 2 else ''} too)" if bad[1:] else ""
    raise DataFileError(
        f"{paths[bad[0]]} does not decode as an image ({reason}){others}: a truncated or "
        f"damaged file, or one that is no image (PNG, JPEG, GIF, BMP): remove or replace it. "
        f"Received: {argument}={paths[bad[0]]!r}")


def image_files_pipeline(paths, labels, image_size, num_channels=3, batch_size=32,
                         training=False, augmentation=None, seed=0, epoch=None):
    """A batched `tf.data.Dataset` of `(pixels, label)` from image files.

    Each file (PNG, JPEG, GIF's first frame, BMP) is read and decoded by
    TensorFlow as the batches are made, given `num_channels` and resized
    bilinearly to `image_size` x `image_size`; pixels stay in [0, 255]
    (float32). Shuffling, augmentation and `epoch` as `make_image_pipeline`.

    Args:
        paths: the image files.
        labels: `(N,)` integer labels.
        image_size: the side of the batches' images.
        num_channels: 1 (grey) or 3 (RGB).
        batch_size, training, augmentation, seed, epoch: as
            `make_image_pipeline`.
    """
    paths, labels = list(paths), np.asarray(labels, "int32")
    if training and epoch is not None:
        order = epoch_permutation(len(paths), seed, epoch)
        paths, labels = [paths[i] for i in order], labels[order]

    def load(path, label):
        image = decode_image_file(tf.io.read_file(path), num_channels)
        image = tf.image.resize(image, (image_size, image_size), "bilinear")
        return tf.ensure_shape(image, (image_size, image_size, num_channels)), label

    dataset = tf.data.Dataset.from_tensor_slices((paths, labels))
    if training and epoch is None:  # shuffle the paths, not the decoded images
        dataset = dataset.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.map(traced_as_written(load), num_parallel_calls=AUTOTUNE)
    if epoch is not None:
        return _batch(dataset, batch_size, training, augmentation, seed, len(paths), epoch,
                      shuffled=True)
    dataset = dataset.batch(batch_size)
    if training and augmentation is not None:
        dataset = dataset.map(traced_as_written(lambda x, y: (_augment(augmentation, x), y)),
                              num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


def _batch(dataset, batch_size, training, augmentation, seed, shuffle_buffer, epoch=None,
           shuffled=False):
    if training and epoch is not None:
        if not shuffled:  # a stream: a seeded buffer, the same order at every pass
            dataset = dataset.shuffle(
                shuffle_buffer, seed=epoch_seed(seed, epoch), reshuffle_each_iteration=False
            )
        dataset = dataset.batch(batch_size)
        if augmentation:
            key = tf.constant([seed, epoch], tf.int64)
            dataset = dataset.enumerate().map(
                traced_as_written(lambda i, batch: (
                    augmentation(batch[0], tf.random.experimental.stateless_fold_in(key, i)),
                    batch[1],
                )),
                num_parallel_calls=AUTOTUNE,  # stateless: the order of the calls is free
            )
        return dataset.prefetch(AUTOTUNE)
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size)
    if training and augmentation is not None:
        dataset = dataset.map(
            traced_as_written(lambda x, y: (_augment(augmentation, tf.cast(x, "float32")), y)),
            num_parallel_calls=AUTOTUNE,
        )
    return dataset.prefetch(AUTOTUNE)


def _augment(augmentation, images):
    """`augmentation(images, training=True)` inside a tf.data map, on any backend.

    Keras's preprocessing layers use TensorFlow ops when they run inside
    tf.data whatever the backend, but a `keras.Sequential` of them does not
    (on JAX it hands the graph tensors to JAX): call its layers one by one."""
    layers = augmentation.layers if isinstance(augmentation, keras.Sequential) else [augmentation]
    for layer in layers:
        images = layer(images, training=True)
    return images


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


def checked_labels(labels, num_classes, name="label"):
    """Integer `labels` as int32, checked first in their own dtype (tfds
    labels are int64: a cast first would wrap 2**32 + 3 to a valid 3): a
    label outside `[0, num_classes)` (`[0, 2**31)` when None) fails the
    pipeline with an assertion naming `name`, never a clamp or a wrap."""
    high = 2 ** 31 if num_classes is None else int(num_classes)
    labels = tf.convert_to_tensor(labels)
    wide = tf.cast(labels, tf.int64)  # every integer label as it is (a uint64 past 2**63 < 0)
    message = f"`{name}` must lie in [0, {high}) (class ids)"
    checks = [
        tf.debugging.assert_greater_equal(wide, tf.constant(0, tf.int64), message=message),
        tf.debugging.assert_less(wide, tf.constant(high, tf.int64), message=message),
    ]
    with tf.control_dependencies(checks):
        return tf.cast(labels, "int32")


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
    epoch=None,
    num_channels=None,
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
        epoch: as `make_image_pipeline`: with an int, the training batches
            of that epoch only, the same at every pass.
        num_channels: None keeps the dataset's channels; 3 turns grey images
            into RGB (the channel copied).

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
        if num_channels is not None and image.shape[-1] != num_channels:
            image = tf.repeat(image, num_channels, axis=-1)  # grey -> num_channels copies
        return image, checked_labels(example[label_key], num_classes, label_key)

    num_classes = getattr(info.features[label_key], "num_classes", None)
    channels = info.features[image_key].shape[-1]
    if num_channels is not None and channels != num_channels and channels != 1:
        raise ValueError(
            f"Dataset {name!r} has {channels}-channel images; only grey images can be "
            f"turned into {num_channels} channels. Received: num_channels={num_channels}"
        )
    dataset = dataset.map(traced_as_written(select), num_parallel_calls=AUTOTUNE)
    dataset = _batch(dataset, batch_size, training, augmentation, seed, 4 * batch_size, epoch)
    return dataset, info
