import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_attn.data import images as image_data

# The data pipelines alone (tf.data and NumPy, no model): the JAX pass would
# run the same thing again.
pytestmark = pytest.mark.backend_independent


def test_digits_arrays_shapes_split_and_range():
    (x_train, y_train), (x_test, y_test) = image_data.load_digits_arrays(
        image_size=16, num_channels=3, test_fraction=0.2
    )
    assert x_train.shape == (1437, 16, 16, 3) and x_test.shape == (360, 16, 16, 3)
    assert x_train.dtype == np.uint8 and x_train.max() == 255 and x_train.min() == 0
    # Grey copied to every channel; stratified: every digit in the test split.
    np.testing.assert_array_equal(x_train[..., 0], x_train[..., 2])
    assert set(y_test.tolist()) == set(range(10))
    assert len(y_train) + len(y_test) == 1797


def test_digits_at_native_size_are_the_sklearn_images():
    from sklearn.datasets import load_digits

    (x_train, _), (x_test, _) = image_data.load_digits_arrays(image_size=8)
    everything = np.concatenate([x_train, x_test])[..., 0].astype(int)
    expected = np.round(load_digits().images * 255 / 16).astype(int)
    # Same multiset of images: sort both by their bytes.
    key = lambda a: sorted(map(bytes, a.astype("uint8")))  # noqa: E731
    assert key(everything) == key(expected)


def test_digits_reject_zero_channels():
    with pytest.raises(ValueError, match=r"Received: num_channels=0"):
        image_data.load_digits_arrays(num_channels=0)


def test_digits_dataset_batches():
    train, test = image_data.load_digits_dataset(image_size=16, batch_size=32)
    x, y = next(iter(train))
    assert x.shape == (32, 16, 16, 1) and x.dtype == tf.float32  # augmented
    assert y.dtype == tf.int32
    x, _ = next(iter(test))
    assert x.dtype == tf.uint8  # test pixels are left as they are
    assert sum(int(b[1].shape[0]) for b in test) == 360


def test_digits_dataset_rejects_unknown_augmentation():
    with pytest.raises(ValueError, match=r"Received: augmentation='strong'"):
        image_data.load_digits_dataset(augmentation="strong")


def test_augmentation_is_configurable_and_changes_pixels():
    assert image_data.image_augmentation(0, 0, 0, flip=False).layers == []
    names = [l.name for l in image_data.image_augmentation(flip=True, rotation=0.1).layers]
    assert names == ["random_zoom", "random_translation", "random_rotation", "random_flip"]
    x = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 1)).astype("float32")
    out = np.asarray(image_data.image_augmentation(seed=1)(x, training=True))
    assert out.shape == x.shape and not np.allclose(out, x)
    np.testing.assert_array_equal(
        np.asarray(image_data.image_augmentation(seed=1)(x, training=False)), x
    )


def test_pipeline_without_training_keeps_order():
    x = np.arange(10 * 4, dtype="uint8").reshape(10, 2, 2, 1)
    y = np.arange(10)
    batches = list(image_data.make_image_pipeline(x, y, batch_size=4))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)


def test_tfds_dataset_by_name_with_mock_data(tmp_path):
    with tfds.testing.mock_data(num_examples=10):
        dataset, info = image_data.load_tfds_image_dataset(
            "cifar10", data_dir=str(tmp_path), split="train", image_size=16, batch_size=4
        )
        batches = list(dataset)
    assert info.features["label"].num_classes == 10
    assert [int(x.shape[0]) for x, _ in batches] == [4, 4, 2]
    x, y = batches[0]
    assert x.shape == (4, 16, 16, 3) and y.dtype == tf.int32
    assert 0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 255


def test_tfds_dataset_without_resize_keeps_uint8():
    with tfds.testing.mock_data(num_examples=3):
        dataset, _ = image_data.load_tfds_image_dataset("mnist", split="test", batch_size=3)
        x, _ = next(iter(dataset))
    assert x.shape == (3, 28, 28, 1) and x.dtype == tf.uint8


def test_tfds_dataset_rejects_a_missing_feature():
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match=r"Received: image_key='picture'"):
            image_data.load_tfds_image_dataset("cifar10", image_key="picture")


def _batches(dataset):
    return [(np.asarray(x), np.asarray(y)) for x, y in dataset]


def test_stateless_augmentation_is_a_function_of_the_seed():
    x = np.random.default_rng(0).uniform(0, 255, (6, 16, 16, 1)).astype("float32")
    augment = image_data.StatelessAugmentation(zoom=0.2, translation=0.1, flip=True)
    a = np.asarray(augment(x, tf.constant([1, 2])))
    np.testing.assert_array_equal(a, np.asarray(augment(x, tf.constant([1, 2]))))
    assert not np.allclose(a, np.asarray(augment(x, tf.constant([1, 3]))))
    assert not np.allclose(a[0], a[1])  # each image of a batch gets its own draw
    # Off: the identity. A flip only: every image either kept or mirrored.
    np.testing.assert_allclose(np.asarray(image_data.StatelessAugmentation()(x, [0, 0])), x)
    flipped = np.asarray(image_data.StatelessAugmentation(flip=True)(x, tf.constant([0, 5])))
    for out, image in zip(flipped, x):
        assert np.allclose(out, image, atol=1e-4) or np.allclose(out, image[:, ::-1], atol=1e-4)
    assert not bool(image_data.StatelessAugmentation())
    with pytest.raises(ValueError, match=r"Received: zoom=1.5"):
        image_data.StatelessAugmentation(zoom=1.5)


def test_stateless_zoom_and_shift_move_the_content():
    x = np.zeros((1, 9, 9, 1), "float32")
    x[0, 4, 4] = 255.0  # one lit pixel in the centre
    shift = image_data.StatelessAugmentation(translation=0.3)
    out = np.asarray(shift(x, tf.constant([0, 1])))[0, ..., 0]
    assert out.max() > 0 and not np.allclose(out, x[0, ..., 0])
    zoom = np.asarray(image_data.StatelessAugmentation(zoom=0.5)(x, tf.constant([0, 1])))
    assert zoom[0, 4, 4, 0] > 0  # zooming keeps the centre in place


def test_epoch_pipeline_is_a_pure_function_of_seed_and_epoch():
    x = np.random.default_rng(0).integers(0, 255, (20, 8, 8, 1)).astype("uint8")
    y = np.arange(20)
    augment = image_data.StatelessAugmentation(zoom=0.1, translation=0.1)

    def epoch(e, seed=0):
        return _batches(image_data.make_image_pipeline(
            x, y, 8, training=True, augmentation=augment, seed=seed, epoch=e))

    first = epoch(3)
    for (xa, ya), (xb, yb) in zip(first, epoch(3)):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert sorted(np.concatenate([b[1] for b in first]).tolist()) == list(range(20))
    assert not np.array_equal(first[0][1], epoch(4)[0][1])
    assert not np.array_equal(first[0][1], epoch(3, seed=1)[0][1])


def test_tfds_epoch_batches_repeat(tmp_path):
    def labels():
        with tfds.testing.mock_data(num_examples=12):
            dataset, _ = image_data.load_tfds_image_dataset(
                "mnist", split="train", batch_size=4, training=True, epoch=2, seed=1,
                num_channels=3, image_size=8,
            )
            return _batches(dataset)

    a, b = labels(), labels()
    assert a[0][0].shape == (4, 8, 8, 3)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
