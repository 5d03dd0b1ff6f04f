"""The masked_lm and text_classification tasks with a ModernBERT (a recipe
of family "modernbert", models/modernbert/): the recipe's family picks the
model, the batches are BERT's without segment ids or next-sentence targets
(the same tokens and masks), a step trains, the metrics keep the BERT
recipes' names, the classifier exports and serves raw strings, and a
pretrained masked_lm run of the other family is refused by name."""

import json
import os

import numpy as np
import pytest

from keras_attn.errors import RecipeError
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import families
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDOC = os.path.join(ROOT, "models", "modernbert", "modernbert_tiny_pydoc.json")
TOPICS = os.path.join(ROOT, "models", "modernbert", "modernbert_tiny_topics.json")
# One global and one local block 16 wide, a window of 8 on 32-token rows.
TINY = ["model.overrides.num_layers=2", "model.overrides.hidden_dim=16",
        "model.overrides.intermediate_dim=24", "model.overrides.global_every=2",
        "model.overrides.local_window=8", "data.sequence_length=32",
        "training.batch_size=8", "training.jit_compile=false"]
DATA = ["data.max_documents=16", "data.vocabulary_size=200"]
REVIEWS = [("a great film, I loved it", "good"), ("dull and far too long", "bad"),
           ("wonderful acting and a great story", "good"), ("I want those hours back", "bad"),
           ("great fun from start to end", "good"), ("a boring, tired plot", "bad")] * 4


def test_the_modernbert_family_has_the_two_text_tasks():
    assert families()["modernbert"] == ["masked_lm", "text_classification"]
    recipe = load_recipe(PYDOC)
    with pytest.raises(RecipeError, match=r"`evaluation.metric`.*'nsp_accuracy'"):
        load_recipe(PYDOC, ["evaluation.metric=nsp_accuracy"])  # no next sentence
    with pytest.raises(RecipeError, match=r"`model.overrides.pad_id` is set by the task"):
        load_recipe(PYDOC, ["model.overrides.pad_id=3"])
    assert recipe["model"]["overrides"]["local_window"] < recipe["data"]["sequence_length"]


@pytest.mark.slow
def test_masked_lm_feeds_modernbert_the_bert_tokens_and_masks_scored_by_their_names():
    from keras_attn.models.modernbert import ModernBertMaskedLM

    task = make_task(load_recipe(PYDOC, TINY + DATA + ["data.packing=false"])).prepare()
    x, targets, weights = (np.asarray(part) if not isinstance(part, dict) else
                           {k: np.asarray(v) for k, v in part.items()}
                           for part in next(iter(task.train_dataset_fn(0))))
    assert sorted(x) == ["padding_mask", "token_ids"]
    # The same recipe with a BERT: the same tokens, the same masks.
    bert = make_task(load_recipe(PYDOC, TINY + DATA + [
        "data.packing=false", "family=bert", "model.preset=bert_tiny", "model.overrides="
        + json.dumps({"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 24})])).prepare()
    bert_x, bert_y, bert_weights = next(iter(bert.train_dataset_fn(0)))
    np.testing.assert_array_equal(x["token_ids"], bert_x["token_ids"])
    np.testing.assert_array_equal(x["padding_mask"], bert_x["padding_mask"])
    positions = np.asarray(bert_x["mask_positions"])
    chosen = np.asarray(bert_weights["mlm"]) > 0
    rows = np.nonzero(chosen)[0]
    np.testing.assert_array_equal(targets[rows, positions[chosen]],
                                  np.asarray(bert_y["mlm"])[chosen])
    assert weights.sum() == chosen.sum() and weights[rows, positions[chosen]].all()

    model = task.build_model()
    assert isinstance(model, ModernBertMaskedLM)
    assert model.backbone.modernbert_config.pad_id == task.vocabulary.index("[PAD]")
    task.compile(model)
    metrics = task.evaluate_batches(model, task.test_data().take(1))
    assert {"mlm_loss", "mlm_accuracy", "mlm_perplexity"} <= set(metrics)
    assert not any(name.startswith("nsp") for name in metrics)


@pytest.mark.slow
def test_packed_masked_lm_rows_reach_modernbert_as_packed_inputs():
    task = make_task(load_recipe(PYDOC, TINY + DATA + ["data.sequence_length=128"])).prepare()
    x, targets, weights = next(iter(task.train_dataset_fn(0)))
    assert sorted(x) == ["packed_segment_ids", "padding_mask", "positions", "token_ids"]
    assert int(np.max(np.asarray(x["packed_segment_ids"]))) > 1  # rows hold several examples
    model = task.compile(task.build_model())
    assert np.isfinite(model.train_on_batch(x, targets, sample_weight=weights)[0])


def _review_recipe(tmp_path, extra=()):
    folder = tmp_path / "reviews"
    folder.mkdir(exist_ok=True)
    for split, rows in (("train", REVIEWS), ("test", REVIEWS[:6])):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"review": text, "label": label}) + "\n" for text, label in rows))
    with open(TOPICS, encoding="utf-8") as handle:
        recipe = json.load(handle)
    recipe.update(name="my_reviews", data={"dataset": f"files:{folder}", "text_key": "review"})
    path = tmp_path / "my_reviews.json"
    path.write_text(json.dumps(recipe))
    return load_recipe(path, TINY + ["data.vocabulary_size=80", "data.sequence_length=16",
                                     *extra])


@pytest.mark.slow
def test_text_classification_builds_a_modernbert_classifier_that_exports(tmp_path):
    import tensorflow as tf

    from keras_attn.models.modernbert import ModernBertSequenceClassifier

    task = make_task(_review_recipe(tmp_path)).prepare()
    assert sorted(task.arrays["train"][0]) == ["padding_mask", "token_ids"]
    model = task.compile(task.build_model())
    assert isinstance(model, ModernBertSequenceClassifier)
    x, labels = next(iter(task.train_dataset_fn(0)))
    assert np.isfinite(model.train_on_batch(x, labels)[0])
    assert set(task.evaluate(model)) >= {"accuracy", "loss"}

    task.export(model, str(tmp_path / "served"))
    loaded = tf.saved_model.load(str(tmp_path / "served"))
    inputs = task.example_inputs()
    np.testing.assert_allclose(task.served_outputs(loaded, inputs)["probabilities"],
                               task.reference_outputs(model, inputs)["probabilities"],
                               atol=1e-5)
    ids = task._token_ids(inputs)
    assert sorted(ids) == ["padding_mask", "token_ids"]
    np.testing.assert_allclose(task.served_outputs(loaded, ids)["probabilities"],
                               task.reference_outputs(model, ids)["probabilities"], atol=1e-5)


def test_a_pretrained_masked_lm_run_must_be_of_the_recipes_family(tmp_path):
    from keras_attn.data import text
    from keras_attn.models.modernbert import ModernBertMaskedLM
    from keras_attn.models.modernbert import build_modernbert

    run = tmp_path / "run"
    run.mkdir()
    vocabulary = text.train_wordpiece_vocabulary([t for t, _ in REVIEWS], 80)
    overrides = {"num_layers": 1, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 24,
                 "local_window": 8, "max_sequence_length": 32}
    backbone = build_modernbert("modernbert_base", vocabulary_size=len(vocabulary), pad_id=0,
                                **overrides)
    ModernBertMaskedLM(backbone).save(str(run / "model.keras"))
    (run / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    (run / "recipe.json").write_text(json.dumps({
        "family": "modernbert", "task": "masked_lm",
        "model": {"preset": "modernbert_base", "overrides": overrides}}))
    task = make_task(_review_recipe(tmp_path, [f"training.pretrained={run}",
                                               "model.overrides={}"]))
    model = task.build_model()
    assert task.vocabulary == vocabulary
    np.testing.assert_array_equal(model.backbone.token_embedding.get_weights()[0],
                                  backbone.token_embedding.get_weights()[0])
    # A BERT recipe cannot fine-tune it (nor a ModernBERT one a BERT run).
    recipe = _review_recipe(tmp_path)
    recipe.update(family="bert", model={"preset": "bert_tiny", "overrides": {}})
    recipe["training"]["pretrained"] = str(run)
    with pytest.raises(ValueError, match=r"names a run of the 'modernbert' family; this "
                                         r"recipe's family is 'bert'"):
        make_task(recipe).prepare()
