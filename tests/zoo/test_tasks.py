import keras
import numpy as np
import pytest
import tensorflow as tf

from _tiny import SMALL
from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.training.schedules import LinearWarmupDecay
from keras_attn.training.schedules import TransformerSchedule
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task
from keras_attn.zoo.tasks.base import build_optimizer
from keras_attn.zoo.tasks.base import build_schedule

pytestmark = pytest.mark.tf_only


def _task(name, extra=()):
    return make_task(load_recipe(recipe_path(name), tiny_overrides(name) + list(extra)))


def _batches(dataset):
    return [[np.asarray(t) for t in tf.nest.flatten(batch)] for batch in dataset]


def _same(a, b):
    return len(a) == len(b) and all(
        len(x) == len(y) and all(u.shape == v.shape and np.array_equal(u, v) for u, v in zip(x, y))
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("name", sorted(SMALL))
def test_train_dataset_fn_is_a_pure_function_of_recipe_and_epoch(name):
    # Two task objects stand for the interrupted and the resumed process.
    task, again = _task(name).prepare(), _task(name).prepare()
    # One pass is what steps_per_epoch counts when the recipe leaves it out.
    dataset = task.train_dataset_fn(1)
    batches = int(dataset.cardinality())
    assert (batches if batches >= 0 else len(list(dataset))) == task.batches_per_epoch
    # The first batches are enough, and cheap.
    first = _batches(dataset.take(4))
    assert _same(first, _batches(again.train_dataset_fn(1).take(4)))
    # What the trainer does on resuming after 2 steps of epoch 1.
    assert _same(first[2:], _batches(again.train_dataset_fn(1).skip(2).take(2)))
    # Another epoch: another order (and other augmentation / masks).
    assert not _same(first, _batches(task.train_dataset_fn(2).take(4)))


def test_even_batches_fill_short_batches_with_their_own_examples():
    from keras_attn.zoo.tasks.base import even_batches

    x = np.arange(7 * 2).reshape(7, 2)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, np.arange(7))).batch(3)
    batches = _batches(even_batches(dataset, 2))  # batches of 3, 3, 1 -> 4, 4, 2
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 0], [3, 4, 5, 3], [6, 6]]
    np.testing.assert_array_equal(batches[0][0], x[[0, 1, 2, 0]])
    single = _batches(even_batches(tf.data.Dataset.range(5).map(lambda i: (i, i)).batch(5), 4))
    assert single[0][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    # The fillers weigh nothing (tests/zoo/test_filler_rows.py).
    assert single[0][2].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]


def test_image_epochs_differ_in_augmentation_not_only_order():
    task = _task("vit_tiny_digits", ["data.validation_fraction=0"]).prepare()
    plain = _task("vit_tiny_digits", ["data.augmentation.zoom=0", "data.augmentation.translation=0",
                                      "data.validation_fraction=0"]).prepare()
    augmented, original = next(iter(task.train_dataset_fn(0))), next(iter(plain.train_dataset_fn(0)))
    np.testing.assert_array_equal(augmented[1], original[1])  # same order (same seed, epoch)
    assert not np.allclose(np.asarray(augmented[0]), np.asarray(original[0], "float32"))


def test_models_take_their_sizes_from_the_data():
    vit = _task("vit_tiny_digits")
    assert vit.build_model().output_shape == (None, 10)
    bert = _task("bert_tiny_pydoc")
    backbone = bert.build_model().backbone
    assert backbone.bert_config.vocabulary_size == len(bert.vocabulary) <= 300
    conformer = _task("conformer_tiny_digits")
    assert conformer.build_model().vocabulary_size == 10


def test_bert_sequence_longer_than_the_model_is_refused():
    task = _task("bert_tiny_pydoc", ["data.sequence_length=64",
                                     "model.overrides.max_sequence_length=32"])
    with pytest.raises(ValueError, match=r"`data.sequence_length`.*Received: "
                                         r"data.sequence_length=64"):
        task.prepare()


def test_precision_comes_from_the_recipe():
    model = _task("vit_tiny_digits", ["training.precision=mixed_bfloat16"]).build_model()
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert all(v.dtype == "float32" for v in model.trainable_variables)


def _training(name, *overrides):
    return load_recipe(recipe_path(name), list(overrides))["training"]


def _rates(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_schedules_follow_the_recipe():
    # vit_tiny_digits: cosine, 10% warmup to 0.002 (examples/vit_classify.py's).
    cosine = build_schedule(_training("vit_tiny_digits"), total_steps=100, hidden_dim=64)
    np.testing.assert_allclose(_rates(cosine, [0, 5, 10, 55, 100]),
                               [0.0, 0.001, 0.002, 0.001, 0.0], atol=1e-8)
    linear = build_schedule(
        _training("vit_tiny_digits", 'training.schedule={"name": "linear", "warmup_steps": 20}'),
        total_steps=120, hidden_dim=64)
    assert isinstance(linear, LinearWarmupDecay)
    np.testing.assert_allclose(_rates(linear, [10, 20, 70, 120]), [0.001, 0.002, 0.001, 0.0],
                               atol=1e-8)
    constant = build_schedule(_training("vit_tiny_digits", 'training.schedule={"name": "constant"}'),
                              total_steps=10, hidden_dim=64)
    assert constant == 0.002
    # transformer_numbers: the paper's schedule, scaled by 0.4.
    paper = build_schedule(_training("transformer_numbers"), total_steps=10_000, hidden_dim=128)
    assert isinstance(paper, TransformerSchedule)
    np.testing.assert_allclose(float(paper(1000)), 0.4 * (128 * 1000) ** -0.5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"Received: training.schedule.warmup_steps=200"):
        build_schedule(_training("vit_tiny_digits", "training.schedule.warmup_steps=200"),
                       total_steps=100, hidden_dim=64)


def test_optimizers_follow_the_recipe():
    adamw = build_optimizer(_training("vit_tiny_digits"), total_steps=100, hidden_dim=64)
    assert isinstance(adamw, keras.optimizers.AdamW) and adamw.weight_decay == 0.05
    adam = build_optimizer(_training("transformer_numbers", "training.optimizer.clipnorm=1.0"),
                           total_steps=100, hidden_dim=128)
    assert type(adam) is keras.optimizers.Adam
    assert (adam.beta_1, adam.beta_2, adam.epsilon, adam.clipnorm) == (0.9, 0.98, 1e-9, 1.0)


def _tfds_task(name, data, *extra):
    import json

    return _task(name, [f"data={json.dumps(data)}", *extra])


def test_tfds_image_classification_with_mock_data():
    import tensorflow_datasets as tfds

    data = {"dataset": "tfds:mnist", "augmentation": {"zoom": 0.1}}
    with tfds.testing.mock_data(num_examples=24):
        task = _tfds_task("vit_tiny_digits", data, "model.overrides.image_size=28",
                          "model.overrides.patch_size=7", "training.batch_size=8").prepare()
        assert task.num_classes == 10 and task.batches_per_epoch == 3  # the 24 mock images
        first = _batches(task.train_dataset_fn(0).take(2))
        assert _same(first, _batches(task.train_dataset_fn(0).take(2)))
        assert first[0][0].shape == (8, 28, 28, 1)
        model = task.compile(task.build_model())
        model.fit(task.train_dataset_fn(0).take(1), verbose=0, shuffle=False)
        assert 0.0 <= task.evaluate(model)["accuracy"] <= 1.0


def test_tfds_translation_with_mock_data():
    import tensorflow_datasets as tfds

    data = {"dataset": "tfds:ted_hrlr_translate/pt_to_en", "source_language": "pt",
            "vocabulary_size": 100}
    with tfds.testing.mock_data(num_examples=12):
        task = _tfds_task("transformer_numbers", data, "evaluation.tokenize=13a").prepare()
        assert task._languages == ("pt", "en")
        assert task.batches_per_epoch == 1  # max(1, 12 mock pairs // batch 16)
        first = _batches(task.train_dataset_fn(0))
        assert _same(first, _batches(task.train_dataset_fn(0)))
        model = task.compile(task.build_model())
        metrics = task.evaluate(model)
        assert set(metrics) == {"bleu", "exact_match"}


def test_a_tfds_dataset_that_is_not_prepared_is_named(tmp_path):
    data = {"dataset": "tfds:mnist", "data_dir": str(tmp_path)}
    task = _tfds_task("vit_tiny_digits", data, "model.overrides.image_size=28",
                      "model.overrides.patch_size=7")
    with pytest.raises(ValueError, match=r"`data.dataset`.*data.download=true.*"
                                         r"Received: data.dataset='tfds:mnist'"):
        task.prepare()


def test_a_portable_export_of_a_beam_search_speech_recipe_is_refused_before_loading():
    task = _task("conformer_tiny_digits", ["evaluation.strategy=beam_search"])
    task.check_export_format("saved_model")
    with pytest.raises(ValueError, match="strategy is 'beam_search'. Received: format='onnx'"):
        task.check_export_format("onnx")
    with pytest.raises(ValueError, match="Received: format='tflite'"):
        task.check_export_format("tflite")
