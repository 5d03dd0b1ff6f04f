"""The zoo's text_classification and token_classification tasks: recipes on
files the test writes (a CSV folder, a JSON Lines folder) train a tiny model
whose loss goes down, are evaluated, and export a SavedModel that serves the
Keras model's outputs; a pretrained backbone (a masked_lm run, a Hugging
Face directory) is fine-tuned with its vocabulary; bad keys are refused by
name before anything trains."""

import csv
import json
import os

import numpy as np
import pytest

from _families import FAMILIES
from keras_attn.errors import RecipeError
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPICS = os.path.join(ROOT, "models", "bert", "bert_tiny_topics.json")
# One small block, a few steps: the code paths of the recipe in seconds.
TINY = ["model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
        "model.overrides.num_heads=2", "model.overrides.intermediate_dim=32",
        "data.vocabulary_size=120", "data.sequence_length=16", "training.batch_size=8",
        "training.epochs=2", "training.optimizer.learning_rate=0.01",
        "training.schedule={\"name\": \"constant\"}", "training.jit_compile=false"]
REVIEWS = [("a great film, I loved it", "good"), ("dull and far too long", "bad"),
           ("wonderful acting and a great story", "good"), ("I want those hours back", "bad"),
           ("great fun from start to end", "good"), ("a boring, tired plot", "bad")] * 4
TAGGED = [(["John", "lives", "in", "Paris"], ["B-PER", "O", "O", "B-LOC"]),
          (["Mary", "visited", "Berlin", "yesterday"], ["B-PER", "O", "B-LOC", "O"]),
          (["Paris", "is", "lovely"], ["B-LOC", "O", "O"]),
          (["Anna", "met", "John", "in", "Rome"], ["B-PER", "O", "B-PER", "O", "B-LOC"])] * 6


def write_recipe(tmp_path, task, data, name="my_text"):
    """bert_tiny_topics with `task` and `data`, saved as `<name>.json`."""
    with open(TOPICS, encoding="utf-8") as handle:
        recipe = json.load(handle)
    recipe.update(name=name, task=task, data=data)
    recipe.pop("$schema")
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(recipe))
    return str(path)


def review_folder(tmp_path):
    folder = tmp_path / "reviews"
    folder.mkdir()
    for split, rows in (("train", REVIEWS), ("test", REVIEWS[:6])):
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([("review", "label")] + rows)
    return folder


def tag_folder(tmp_path):
    folder = tmp_path / "tags"
    folder.mkdir()
    for split, rows in (("train", TAGGED), ("test", TAGGED[:4])):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"tokens": words, "tags": tags}) + "\n" for words, tags in rows))
    return folder


def train_and_serve(recipe, run):
    """Trains `recipe` (exporting its SavedModel), checks that the training
    loss went down, that the reloaded SavedModel serves the Keras model's
    probabilities on the task's example inputs and scores results.json's
    test accuracy. Returns the task, the inputs and the served outputs."""
    import tensorflow as tf

    from keras_attn import zoo

    results = zoo.train(recipe, TINY, output=str(run), verbose=0)
    history = json.loads((run / "checkpoints" / "history.json").read_text())
    assert history["loss"][-1] < history["loss"][0], history["loss"]
    assert results["metric"] == "accuracy" and 0.0 <= results["value"] <= 1.0
    assert (run / "vocab.txt").is_file() and (run / "labels.txt").is_file()
    _, task, model, _ = zoo.load_run(str(run))
    loaded = tf.saved_model.load(str(run / "saved_model"))
    inputs = task.example_inputs()
    expected = task.reference_outputs(model, inputs)["probabilities"]
    served = task.served_outputs(loaded, inputs)["probabilities"]
    np.testing.assert_allclose(served, expected, atol=1e-5)
    # What `keras-attn evaluate RUN --exported RUN/saved_model` reports.
    metrics = task.evaluate_served(lambda batch: task.served_outputs(loaded, batch))
    assert metrics["accuracy"] == pytest.approx(results["value"], abs=1e-6)
    return task, inputs, served


@pytest.mark.slow
def test_text_classification_from_a_csv_folder_trains_evaluates_and_serves_raw_strings(
        tmp_path, capsys):
    recipe = write_recipe(tmp_path, "text_classification", {
        "dataset": f"files:{review_folder(tmp_path)}", "text_key": "review",
        "validation_fraction": 0.0})
    run = tmp_path / "run"
    task, inputs, served = train_and_serve(recipe, run)
    assert task.no_validation_note() in capsys.readouterr().out  # said before training
    assert task.class_names == ["bad", "good"]  # names sorted: ids 0, 1
    assert (run / "labels.txt").read_text() == "bad\ngood\n"
    # ... and inside the export, which a deployment copies without the run;
    # TensorFlow Serving's signature answers by name, the label as text.
    import tensorflow as tf

    assert (run / "saved_model" / "assets" / "labels.txt").read_text() == "bad\ngood\n"
    loaded = tf.saved_model.load(str(run / "saved_model"))
    answer = loaded.signatures["serving_default"](text=tf.constant(["a great film", "dull"]))
    assert sorted(answer) == ["label", "logits", "probabilities"]
    np.testing.assert_allclose(answer["probabilities"].numpy(),
                               loaded.serve(tf.constant(["a great film", "dull"])).numpy())
    assert [x.decode() for x in answer["label"].numpy()] == [
        task.class_names[i] for i in answer["logits"].numpy().argmax(-1)]
    assert len(task.splits["train"][0]) == 24 and task.splits["validation"] is None
    assert list(inputs) == ["text"] and served.shape == (6, 2)  # raw strings in
    # `keras-attn export RUN --format hf`: the names as id2label, which
    # transformers reads.
    import transformers

    from keras_attn import zoo

    path, _ = zoo.export(str(run), format="hf")
    config = transformers.AutoConfig.from_pretrained(path)
    assert config.id2label == {0: "bad", 1: "good"}
    assert config.label2id == {"bad": 0, "good": 1}


@pytest.mark.slow
def test_token_classification_from_jsonl_trains_evaluates_and_serves(tmp_path):
    recipe = write_recipe(tmp_path, "token_classification", {
        "dataset": f"files:{tag_folder(tmp_path)}", "validation_fraction": 0.0})
    run = tmp_path / "run"
    task, inputs, served = train_and_serve(recipe, run)
    assert task.class_names == ["B-LOC", "B-PER", "O"]
    assert task.splits["validation"] is None
    assert served.shape == inputs["token_ids"].shape + (3,)
    # Accuracy over words: each word's first piece weighs 1; [CLS], [SEP],
    # padding, the other pieces and the words cut at 16 tokens weigh 0.
    _, _, weights = next(iter(task.test_data()))
    for words, row in zip([w for w, _ in TAGGED[:4]], np.asarray(weights)):
        starts = 1 + np.cumsum([0] + [len(task.tokenizer(w)) for w in words[:-1]])
        assert np.flatnonzero(row).tolist() == [s for s in starts if s < 15]
    with pytest.raises(ValueError, match=r"SavedModel \(token ids in\) only.*format='onnx'"):
        task.check_export_format("onnx")


def test_without_a_validation_file_a_seeded_share_of_train_is_held_out(tmp_path):
    data = {"text_classification": {"dataset": f"files:{review_folder(tmp_path)}",
                                    "text_key": "review", "validation_fraction": 0.25},
            "token_classification": {"dataset": f"files:{tag_folder(tmp_path)}",
                                     "validation_fraction": 0.25}}
    for task_name, section in data.items():
        recipe = load_recipe(write_recipe(tmp_path, task_name, section))
        splits = make_task(recipe)._files_splits()
        assert [len(splits[s][0]) for s in ("train", "validation")] == [18, 6]  # of 24
        again = make_task(recipe)._files_splits()
        assert again["validation"][0] == splits["validation"][0], task_name
        other = make_task(load_recipe(write_recipe(tmp_path, task_name, section),
                                      ["training.seed=1"]))._files_splits()
        assert other["validation"][0] != splits["validation"][0], task_name


def test_a_run_without_validation_says_so_and_how_to_get_one(tmp_path):
    # The loaders hold out nothing by default (validation_fraction=0.0):
    # `fit` then runs without validation, which the run's log says.
    folder = review_folder(tmp_path)
    recipe = load_recipe(write_recipe(tmp_path, "text_classification", {
        "dataset": f"files:{folder}", "text_key": "review", "validation_fraction": 0.0}))
    assert make_task(recipe).no_validation_note() == (
        "No validation set: the epoch lines show training metrics only (for one, set "
        "data.validation_fraction (now 0.0), or put validation.csv or validation.jsonl "
        f"beside the training data in {folder}).")
    recipe = load_recipe(TOPICS, ["data.validation_fraction=0"])  # embedded: no file
    assert make_task(recipe).no_validation_note().endswith(
        "(for one, set data.validation_fraction (now 0.0)).")


def _fake_masked_lm_run(folder, task="masked_lm"):
    """A directory as a finished masked_lm run leaves it: recipe.json,
    model.keras (a BertPretrainer) and vocab.txt."""
    from keras_attn.data import text
    from keras_attn.models.bert import BertPretrainer

    folder.mkdir()
    vocabulary = text.train_wordpiece_vocabulary([t for t, _ in REVIEWS], 80)
    # The table's BERT, one block 16 wide (the classifier's 2 * 16 + 2
    # weights, below), recorded as the run's preset and overrides; the
    # vocabulary is vocab.txt's, which the task reads.
    bert = FAMILIES["bert"]
    overrides = {k: v for k, v in bert.tiny.items() if k != "vocabulary_size"}
    overrides.update(num_layers=1, hidden_dim=16)
    backbone = bert.backbone(vocabulary_size=len(vocabulary), **overrides)
    BertPretrainer(backbone).save(str(folder / "model.keras"))
    (folder / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    (folder / "recipe.json").write_text(json.dumps(
        {"task": task, "model": {"preset": bert.preset, "overrides": overrides}}))
    return backbone, vocabulary


def test_a_pretrained_backbone_brings_its_weights_and_vocabulary(tmp_path):
    from keras_attn.convert import save_hf_bert
    from keras_attn.data import text

    backbone, vocabulary = _fake_masked_lm_run(tmp_path / "pretrained")
    save_hf_bert(backbone, str(tmp_path / "hf"), tokenizer=text.make_tokenizer(vocabulary))
    # The same directory with its weights in two shards and their index.
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in os.listdir(tmp_path / "hf"):
        if name != "model.safetensors":
            (sharded / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    names, weight_map = sorted(tensors), {}
    for index, part in enumerate((names[::2], names[1::2])):
        file = f"model-0000{index + 1}-of-00002.safetensors"
        save_file({name: tensors[name] for name in part}, str(sharded / file))
        weight_map.update({name: file for name in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    data = {"dataset": f"files:{review_folder(tmp_path)}", "text_key": "review"}
    embeddings = backbone.get_layer("token_embedding").get_weights()[0]
    for source in ("pretrained", "hf", "sharded"):
        recipe = write_recipe(tmp_path, "text_classification", data)
        task = make_task(load_recipe(recipe, [
            f"training.pretrained={tmp_path / source}", "data.sequence_length=16",
            "model.overrides={}"]))
        model = task.build_model()
        assert task.vocabulary == vocabulary, source
        np.testing.assert_array_equal(
            model.backbone.get_layer("token_embedding").get_weights()[0], embeddings)
        assert model.count_params() == backbone.count_params() + 2 * 16 + 2


@pytest.mark.parametrize("pretrained, message", [
    ("nothing_here", r"must be a finished run directory of the masked_lm task"),
    ("translation_run", r"names a run of the 'translation' task"),
])
def test_a_pretrained_directory_that_is_not_a_backbone_is_refused(tmp_path, pretrained,
                                                                  message):
    (tmp_path / "nothing_here").mkdir()
    run = tmp_path / "translation_run"
    run.mkdir()
    for name in ("model.keras", "vocab.txt"):
        (run / name).write_text("")
    (run / "recipe.json").write_text(json.dumps({"task": "translation"}))
    recipe = write_recipe(tmp_path, "text_classification", {
        "dataset": f"files:{review_folder(tmp_path)}", "text_key": "review"})
    path = tmp_path / pretrained
    task = make_task(load_recipe(recipe, [f"training.pretrained={path}"]))
    with pytest.raises(ValueError, match=message) as error:
        task.prepare()
    assert str(error.value).startswith("Recipe key `training.pretrained`")
    assert str(error.value).endswith(f"Received: training.pretrained={str(path)!r}")


def test_the_embedded_recipe_validates_and_splits_the_topics_by_seed():
    from keras_attn.zoo.tasks.text_classification import TextClassification

    recipe = load_recipe(TOPICS)
    assert recipe["task"] == "text_classification" and recipe["data"]["dataset"] == "embedded"
    task = make_task(recipe)
    splits = task._embedded_splits()
    assert task.class_names == ["specialnames", "compound", "debugger", "string-methods"]
    sizes = {split: len(texts) for split, (texts, _) in splits.items()}
    assert sizes == {"train": 1003, "validation": 112, "test": 279}
    # Stratified: each topic's share of the test set is its share of all.
    counts = np.bincount(splits["test"][1], minlength=4)
    assert counts.tolist() == [96, 96, 44, 43]
    again = TextClassification(recipe)._embedded_splits()
    assert again["test"][0] == splits["test"][0]


DATASET = "data.dataset"


@pytest.mark.parametrize("task, data, key, message", [
    ("text_classification", {"dataset": "files:{tmp}/reviews"}, DATASET,
     r"has no column \['text'\]"),
    ("text_classification", {"dataset": "embedded", "text_key": "review"}, "data.text_key",
     "is for tfds or files datasets only"),
    ("text_classification", {"dataset": "files:{tmp}/reviews/train.csv",
                             "text_key": "review"}, DATASET, "needs a test set"),
    ("token_classification", {"dataset": "embedded"}, DATASET,
     "which token_classification does not have"),
    ("token_classification", {"dataset": "files:{tmp}/reviews"}, DATASET,
     r"has no column \['tokens', 'tags'\]"),
])
def test_bad_keys_are_refused_naming_the_key(tmp_path, task, data, key, message):
    review_folder(tmp_path)
    data = {k: v.format(tmp=tmp_path) for k, v in data.items()}
    with pytest.raises(RecipeError, match=message) as error:
        load_recipe(write_recipe(tmp_path, task, data))
    assert f"Recipe key `{key}`" in str(error.value)
    assert str(error.value).endswith(f"Received: {key}={data[key.split('.')[1]]!r}")


def test_prepared_files_data_is_refused_once_its_source_files_change(tmp_path):
    """`prepare` records the SHA-256 of each file a `files:` recipe reads:
    `train --data` refuses the snapshot once a file is edited, added or
    removed (it trained on the stale batches without a word), and a copy of
    the prepared data on a machine without the files still trains."""
    import shutil

    from keras_attn.zoo.prepared import PreparedData
    from keras_attn.zoo.prepared import prepare

    folder = review_folder(tmp_path)
    recipe_file = write_recipe(tmp_path, "text_classification", {
        "dataset": f"files:{folder}", "text_key": "review", "validation_fraction": 0.0})
    overrides = TINY[:-2]  # the data-defining keys the run gives again
    prepared = str(tmp_path / "prepared")
    prepare(recipe_file, overrides, output=prepared, verbose=False)
    recipe = load_recipe(recipe_file, overrides)
    PreparedData(prepared, recipe)  # unchanged: accepted
    with open(folder / "train.csv", "a", encoding="utf-8") as handle:
        handle.write("a late addition,good\n")
    (folder / "notes.txt").write_text("kept beside the tables")
    with pytest.raises(ValueError, match=(
            r"was prepared from other contents of .*reviews: notes.txt \(added\), "
            r"train.csv \(edited\) since `prepare` read them")):
        PreparedData(prepared, recipe)
    shutil.rmtree(folder)  # the data carried to a machine without the files
    assert PreparedData(prepared, recipe).steps_per_epoch == 3
