"""The recipe form `data.dataset: "files:<path>"`: a zoo task trained on
files the test writes, and bad files refused as recipe errors naming
`data.dataset` and its value before anything trains."""

import json
import os

import keras
import numpy as np
import pytest

from _tiny import recipe_path
from _tiny import tiny_overrides
from keras_attn.errors import RecipeError
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only


def files_recipe(tmp_path, name, data):
    """The small recipe `name` with `data` as its data section, written to
    `tmp_path` (same file name: a recipe's name is its stem)."""
    with open(recipe_path(name), encoding="utf-8") as handle:
        recipe = json.load(handle)
    recipe["data"] = data
    recipe.pop("expected", None)
    recipe.pop("$schema", None)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(recipe))
    return str(path)


def load(tmp_path, name, data, *extra):
    overrides = [o for o in tiny_overrides(name) if not o.startswith("data.")]
    return load_recipe(files_recipe(tmp_path, name, data), overrides + list(extra))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_images(folder, count):
    rng = np.random.default_rng(0)
    for label, brightness in (("dark", 40), ("light", 215)):
        os.makedirs(folder / label)
        for i in range(count):
            pixels = np.clip(rng.normal(brightness, 20, (20, 20, 3)), 0, 255).astype("uint8")
            keras.utils.save_img(str(folder / label / f"{i}.png"), pixels)


@pytest.mark.slow
def test_an_image_folder_trains_evaluates_and_reloads_through_the_zoo(tmp_path):
    from keras_attn.zoo import train

    write_images(tmp_path / "photos" / "train", 8)
    write_images(tmp_path / "photos" / "test", 2)
    recipe = files_recipe(tmp_path, "vit_tiny_digits", {
        "dataset": f"files:{tmp_path / 'photos'}", "validation_fraction": 0.25})
    overrides = [o for o in tiny_overrides("vit_tiny_digits") if not o.startswith("data.")]
    overrides.append("training.batch_size=4")
    results = train(recipe, overrides, output=str(tmp_path / "run"), export=False, verbose=0)
    assert 0.0 <= results["metrics"]["accuracy"] <= 1.0
    task = make_task(load_recipe(recipe, overrides)).prepare()
    assert task.num_classes == 2 and task.batches_per_epoch == 3  # 12 of 16 images, batch 4
    model = keras.saving.load_model(str(tmp_path / "run" / "model.keras"))
    images, _ = next(iter(task.test_data()))
    assert model.predict(images, verbose=0).shape == (4, 2)  # the 4 test images


def test_translation_and_speech_read_their_tables(tmp_path):
    from scipy.io import wavfile

    pairs = [{"en": "one cat", "fr": "un chat"}, {"en": "two dogs", "fr": "deux chiens"}] * 6
    os.makedirs(tmp_path / "pairs")
    write_jsonl(tmp_path / "pairs" / "train.jsonl", pairs)
    write_jsonl(tmp_path / "pairs" / "test.jsonl", pairs[:2])
    task = make_task(load(tmp_path, "transformer_numbers", {
        "dataset": f"files:{tmp_path / 'pairs'}", "vocabulary_size": 60,
        "target_language": "fr"})).prepare()
    batches = list(task.train_dataset_fn(0))
    assert task.test_pairs == [("one cat", "un chat"), ("two dogs", "deux chiens")]
    assert sum(int(labels.shape[0]) for _, labels in batches) == 12  # every training pair
    assert task.validation_data() is None  # no validation file

    os.makedirs(tmp_path / "speech")
    rows = []
    for i, words in enumerate(["yes", "no"] * 3):
        wavfile.write(str(tmp_path / "speech" / f"{i}.wav"), 16000,
                      np.zeros(4000, "int16") + i)
        rows.append({"audio": f"{i}.wav", "text": words})
    write_jsonl(tmp_path / "speech" / "train.jsonl", rows)
    write_jsonl(tmp_path / "speech" / "test.jsonl", rows[:2])
    task = make_task(load(tmp_path, "conformer_tiny_digits", {
        "dataset": f"files:{tmp_path / 'speech'}"})).prepare()
    assert task.vocabulary == tuple("enosy")
    inputs, labels = next(iter(task.train_dataset_fn(0)))
    assert int(inputs["waveform_length"][0]) == 4000


DATASET, TARGET, TEST = "data.dataset", "data.target_language", "data.test_fraction"


@pytest.mark.parametrize("name, data, key, message", [
    ("vit_tiny_digits", {"dataset": "files:{tmp}/nowhere"}, DATASET, "names no file or folder"),
    ("vit_tiny_digits", {"dataset": "files:{tmp}/bare"}, DATASET, "no class sub-folder"),
    ("vit_tiny_digits", {"dataset": "files:{tmp}/empty/cats"}, DATASET,
     "hold no image"),
    ("transformer_numbers", {"dataset": "files:{tmp}/t", "target_language": "fr"}, DATASET,
     "has no column"),
    ("transformer_numbers", {"dataset": "files:{tmp}/e", "target_language": "fr"}, DATASET,
     "holds no examples"),
    ("transformer_numbers", {"dataset": "files:{tmp}/t", "source_language": "text",
                             "target_language": "label"}, DATASET, "needs a test set"),
    ("transformer_numbers", {"dataset": "files:{tmp}/t"}, TARGET, "must name the target"),
    ("conformer_tiny_digits", {"dataset": "files:{tmp}/t"}, DATASET, "has no column"),
    ("vit_tiny_digits", {"dataset": "files:{tmp}/t", "test_fraction": 0.2}, TEST,
     "is for embedded datasets only"),
    ("bert_tiny_pydoc", {"dataset": "files:{tmp}/t"}, DATASET, "this task does not read"),
])
def test_bad_files_are_recipe_errors_naming_the_key_and_the_value(tmp_path, name, data, key,
                                                                  message):
    os.makedirs(tmp_path / "bare")
    os.makedirs(tmp_path / "empty" / "cats" / "tabby")  # a class folder without images
    os.makedirs(tmp_path / "t")
    (tmp_path / "t" / "train.csv").write_text("text,label\nhello,1\n")
    os.makedirs(tmp_path / "e")
    (tmp_path / "e" / "train.csv").write_text("en,fr\n")
    (tmp_path / "e" / "test.csv").write_text("en,fr\n")
    data = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in data.items()}
    with pytest.raises(RecipeError, match=message) as error:
        load(tmp_path, name, data)
    assert f"Recipe key `{key}`" in str(error.value)
    if key == DATASET:
        assert str(error.value).endswith(f"Received: data.dataset={data['dataset']!r}")


def test_a_files_recipe_refuses_a_test_label_the_training_set_lacks(tmp_path):
    from _tiny import ROOT
    from keras_attn.errors import DataFileError

    with open(os.path.join(ROOT, "models", "bert", "bert_tiny_topics.json"),
              encoding="utf-8") as handle:
        recipe = json.load(handle)
    recipe.pop("$schema")
    recipe.update(name="my_reviews", data={"dataset": f"files:{tmp_path / 'reviews'}",
                                           "sequence_length": 16, "validation_fraction": 0})
    (tmp_path / "my_reviews.json").write_text(json.dumps(recipe))
    os.makedirs(tmp_path / "reviews")
    (tmp_path / "reviews" / "train.csv").write_text("text,label\na,0\nb,1\nc,2\n")
    (tmp_path / "reviews" / "test.csv").write_text("text,label\nd,1\ne,5\n")
    task = make_task(load_recipe(str(tmp_path / "my_reviews.json")))
    with pytest.raises(DataFileError, match=r"test set has labels the training set does not "
                                            r"have: \[5\] \(first: .*test\.csv, line 3\)"):
        task.prepare()


def test_a_speech_clip_too_short_at_the_recipes_frame_step_is_refused(tmp_path):
    from scipy.io import wavfile

    from keras_attn.errors import DataFileError

    os.makedirs(tmp_path / "speech")
    # 1,600 samples: 2 CTC frames at the default frame_step 160, 4 at 80;
    # "aa" needs 3 (a blank between the a's).
    for name, samples in (("long.wav", 8000), ("short.wav", 1600)):
        wavfile.write(str(tmp_path / "speech" / name), 16000, np.full(samples, 100, "int16"))
    write_jsonl(tmp_path / "speech" / "train.jsonl",
                [{"audio": "long.wav", "text": "ab"}, {"audio": "short.wav", "text": "aa"}])
    write_jsonl(tmp_path / "speech" / "test.jsonl", [{"audio": "long.wav", "text": "ba"}])
    data = {"dataset": f"files:{tmp_path / 'speech'}"}
    with pytest.raises(DataFileError, match=r"train\.jsonl, line 2: .*short\.wav is too short "
                                            r"for its transcript.*CTC needs 3 to emit 'aa'"):
        make_task(load(tmp_path, "conformer_tiny_digits", data)).prepare()
    task = make_task(load(tmp_path, "conformer_tiny_digits", data,
                          "model.overrides.frame_step=80")).prepare()
    assert task.vocabulary == ("a", "b")
    # A FastConformer counts its 8x frames: at frame_step 80, 21 log-mel
    # frames give 3 after 8x (4 after 4x), and "aba" needs 3, "abab" 4.
    write_jsonl(tmp_path / "speech" / "train.jsonl",
                [{"audio": "long.wav", "text": "ab"}, {"audio": "short.wav", "text": "abab"}])
    with pytest.raises(DataFileError, match=r"short\.wav is too short.*3 CTC frame\(s\) "
                                            r"\(the model's log_mel frames every 80 samples, "
                                            r"then its 8x subsampling\)"):
        make_task(load(tmp_path, "conformer_tiny_digits", data, "model.overrides.frame_step=80",
                       'model.overrides.subsampling="fast"')).prepare()
