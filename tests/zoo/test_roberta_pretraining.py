"""masked_lm with `data.next_sentence: false` (models/bert/roberta_tiny_pydoc.json,
RoBERTa's objective): single segments, in document order, reach a
`BertPretrainer(next_sentence=False)` whose positions count past the
vocabulary's [PAD]; the metrics keep the BERT recipes' names; what cannot go
with it is refused by name."""

import json
import os

import numpy as np
import pytest

from keras_attn.errors import RecipeError
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDOC = os.path.join(ROOT, "models", "bert", "roberta_tiny_pydoc.json")
TINY = ["model.overrides=" + json.dumps({"num_layers": 1, "hidden_dim": 16, "num_heads": 2,
                                         "intermediate_dim": 24, "max_sequence_length": 64,
                                         "padding_id": 0}),
        "data.sequence_length=64", "data.max_documents=14", "data.vocabulary_size=1000",
        "training.batch_size=8", "training.jit_compile=false"]


def test_masked_lm_without_next_sentence_trains_a_masked_lm_on_single_segments():
    from keras_attn.data import text
    from keras_attn.models.bert import BertPretrainer

    with pytest.raises(RecipeError, match=r"`data.next_sentence`.*packing"):
        load_recipe(PYDOC, TINY + ["data.packing=true"])
    with pytest.raises(ValueError, match=r"`data.next_sentence`.*nsp_accuracy"):
        make_task(load_recipe(PYDOC, TINY + ["evaluation.metric=nsp_accuracy",
                                               "expected.metric=nsp_accuracy"]))
    wrong_pad = make_task(load_recipe(PYDOC, TINY + ["model.overrides.padding_id=1"]))
    wrong_pad.assume_data_sizes()
    with pytest.raises(ValueError, match=r"`model.overrides.padding_id` .* \[PAD\] id, 0"):
        wrong_pad._config()

    task = make_task(load_recipe(PYDOC, TINY)).prepare()
    # The test documents' sentences, in order, each in one example.
    documents = text.load_pydoc_corpus()[:8]
    texts = task.test_pairs[0]
    assert len(texts) < sum(map(len, documents))  # sentences joined
    assert " ".join(texts) == " ".join(s for document in documents for s in document)
    x, y, weights = next(iter(task.train_dataset_fn(0)))
    assert sorted(y) == sorted(weights) == ["mlm"]
    assert not np.asarray(x["segment_ids"]).any()  # one segment

    model = task.build_model()
    assert isinstance(model, BertPretrainer) and not model.next_sentence
    assert model.backbone.bert_config.padding_id == task.vocabulary.index("[PAD]") == 0
    task.compile(model)
    metrics = task.evaluate_batches(model, task.test_data().take(1))
    assert {"mlm_loss", "mlm_accuracy", "mlm_perplexity"} <= set(metrics)
    assert not any(name.startswith("nsp") for name in metrics)


def test_a_text_task_counts_roberta_positions_past_its_vocabularys_pad():
    # The check both text tasks share (text classification and token
    # classification take a RoBERTa preset too): roberta_base's own
    # padding_id (1, its BPE vocabulary's <pad>) is not a learned
    # vocabulary's [PAD] (0), so it is refused, not silently kept.
    from keras_attn.data.text import SPECIAL_TOKENS
    from keras_attn.zoo.families import text_family

    text_model_config = text_family("bert").model_config

    vocabulary = list(SPECIAL_TOKENS) + ["the", "cat"]
    tiny = {"num_layers": 1, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 24}
    with pytest.raises(ValueError, match=r"^Recipe key `model.overrides.padding_id` must be "
                                         r"the learned vocabulary's \[PAD\] id, 0 .*preset "
                                         r"'roberta_base'.*Received: padding_id=1$"):
        text_model_config("roberta_base", tiny, vocabulary)
    config = text_model_config("roberta_base", dict(tiny, padding_id=0), vocabulary)
    assert (config.padding_id, config.vocabulary_size) == (0, len(vocabulary))
    assert text_model_config("bert_tiny", tiny, vocabulary).padding_id is None
