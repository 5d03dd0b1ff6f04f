"""`keras-attn train` of a `*_topics` recipe with `training.pretrained` = a
Hugging Face ModernBERT or RoBERTa directory (a tiny one saved here by
transformers, with its byte-level BPE tokenizer) on a `files:` CSV folder of
three topics: the model starts from the checkpoint's encoder, the texts are
packed with the checkpoint's own special tokens and padding id (transformers'
ids), the run trains, evaluates and writes its results, its SavedModel
(token ids in) and the tokenizer's files; a recipe whose family or model
section contradicts the checkpoint is refused by name."""

import csv
import json
import os

import numpy as np
import pytest

import keras_attn.cli as cli
from _tiny import ROOT
from _tiny import train_from_checkpoint
from keras_attn.zoo.recipe import load_recipe
from keras_attn.zoo.tasks import make_task

pytestmark = pytest.mark.tf_only

TOPICS = {"pets": ["the cat sat on the mat", "a dog ran after the cat", "my cat likes fish",
                   "the dog sleeps all day"],
          "money": ["stocks fell on monday", "the bank raised its rates", "prices rose again",
                    "the market closed higher"],
          "weather": ["rain falls all week", "a cold wind from the north", "the sun is out",
                      "snow on the hills today"]}
TEXTS = [text for texts in TOPICS.values() for text in texts]
LENGTH = 16
RUN = ["model.overrides={}", f"data.sequence_length={LENGTH}", "training.batch_size=8",
       "training.epochs=1", "training.schedule={\"name\": \"constant\"}",
       "training.jit_compile=false", "data.validation_fraction=0"]


def topic_folder(tmp_path):
    folder = tmp_path / "topics"
    folder.mkdir()
    rows = [(text, topic) for topic, texts in TOPICS.items() for text in texts]
    for split, split_rows in (("train", rows * 2), ("test", rows[::2])):
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([("text", "label")] + split_rows)
    return folder


def hf_directory(tmp_path, family):
    """A tiny `...ForMaskedLM` of `family` with random weights and a byte-level
    BPE tokenizer trained on `TEXTS`, saved by transformers; its tokenizer."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors
    from tokenizers import trainers

    roberta = family == "roberta"
    specials = (["<s>", "<pad>", "</s>", "<unk>", "<mask>"] if roberta
                else ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory = tmp_path / family
    directory.mkdir()
    sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32)
    if roberta:
        bpe.model.save(str(directory))  # vocab.json, merges.txt
        tokenizer = transformers.RobertaTokenizer(str(directory / "vocab.json"),
                                                  str(directory / "merges.txt"))
        config = transformers.RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=40,
                                            pad_token_id=tokenizer.pad_token_id, **sizes)
        model = transformers.RobertaForMaskedLM(config)
    else:  # ModernBERT's tokenizer.json: [CLS] text [SEP]
        bpe.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[(token, bpe.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            pad_token="[PAD]", mask_token="[MASK]")
        ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
               (("pad_token_id", "[PAD]"), ("cls_token_id", "[CLS]"), ("sep_token_id", "[SEP]"),
                ("bos_token_id", "[CLS]"), ("eos_token_id", "[SEP]"))}
        config = transformers.ModernBertConfig(vocab_size=len(tokenizer),
                                               max_position_embeddings=64, local_attention=16,
                                               global_attn_every_n_layers=1, **ids, **sizes)
        model = transformers.ModernBertForMaskedLM(config)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory, tokenizer


def topics_recipe(tmp_path, name, folder):
    """The `name` recipe (a `*_topics` one) on the `files:` folder."""
    family = "modernbert" if name.startswith("modernbert") else "bert"
    with open(os.path.join(ROOT, "models", family, f"{name}.json"), encoding="utf-8") as handle:
        recipe = json.load(handle)
    recipe["data"] = {"dataset": f"files:{folder}"}
    for key in ("expected", "$schema"):
        recipe.pop(key, None)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(recipe))
    return str(path)


def fine_tune(tmp_path, monkeypatch, name, family, embedding, export):
    """Trains the recipe on the checkpoint through `keras-attn train`
    (without its SavedModel unless `export`), and checks the run's task (the
    one the command made): its model started from the checkpoint's encoder,
    its rows are transformers' ids. Returns the directory and the recipe."""
    from safetensors.numpy import load_file

    directory, tokenizer = hf_directory(tmp_path, family)
    recipe = topics_recipe(tmp_path, name, topic_folder(tmp_path))
    run = tmp_path / "run"
    task, start = train_from_checkpoint(
        monkeypatch, recipe, run, RUN + [f"training.pretrained={directory}"],
        lambda model: model.backbone.get_layer("token_embedding").get_weights()[0],
        no_export=not export)
    assert (run / "labels.txt").read_text().split() == sorted(TOPICS)
    assert not (run / "vocab.txt").exists()  # the tokenizer is the checkpoint's
    assert (run / "tokenizer.json").read_text() == (directory / "tokenizer.json").read_text()

    # The checkpoint's encoder under a new head of the three topics.
    np.testing.assert_array_equal(
        start, load_file(str(directory / "model.safetensors"))[embedding])
    assert task.class_names == sorted(TOPICS) and task.num_classes == 3
    # The rows are transformers' ids: its special tokens, its padding id.
    expected = tokenizer(task.splits["test"][0], padding="max_length", max_length=LENGTH)
    rows = task.arrays["test"][0]
    assert sorted(rows) == sorted(task.text_family.inputs)
    np.testing.assert_array_equal(rows["token_ids"], expected["input_ids"])
    np.testing.assert_array_equal(rows["padding_mask"], expected["attention_mask"])
    return directory, recipe, run


def test_keras_attn_train_fine_tunes_a_hugging_face_modernbert(tmp_path, monkeypatch):
    import keras
    import tensorflow as tf
    import transformers

    from keras_attn.export import TextClassifierArtifact

    directory, recipe, run = fine_tune(tmp_path, monkeypatch, "modernbert_tiny_topics",
                                       "modernbert", "model.embeddings.tok_embeddings.weight",
                                       export=True)
    # Both exports take raw strings with the checkpoint's tokenizer.json and
    # class names, and give model.keras's answers on transformers' ids.
    texts = ["the cat sat on the mat", "a film about a dog", "tiny", ""]
    ids = transformers.AutoTokenizer.from_pretrained(str(directory))(
        texts, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="np")
    inputs = {"token_ids": ids["input_ids"].astype("int32"),
              "padding_mask": ids["attention_mask"].astype("int32")}
    logits = keras.saving.load_model(str(run / "model.keras")).predict(inputs, verbose=0)
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
    assets = run / "saved_model" / "assets"
    assert (assets / "labels.txt").read_text().split() == sorted(TOPICS)
    assert (assets / "tokenizer.json").read_text() == (directory / "tokenizer.json").read_text()
    loaded = tf.saved_model.load(str(run / "saved_model"))
    np.testing.assert_allclose(loaded.serve(tf.constant(texts)).numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(loaded.serve_ids(inputs["token_ids"], inputs["padding_mask"]),
                               expected, atol=1e-6)

    assert cli.main(["export", str(run), "--format", "onnx", "--output",
                     str(tmp_path / "onnx")]) == 0
    served = TextClassifierArtifact(str(tmp_path / "onnx"))(texts)
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)
    assert served["label"] == [sorted(TOPICS)[i] for i in expected.argmax(-1)]
    with pytest.raises(ValueError, match=r"^Recipe key `model.overrides` must be empty with "
                                         r"training.pretrained"):
        make_task(load_recipe(recipe, [f"training.pretrained={directory}"])).prepare()


def test_keras_attn_train_fine_tunes_a_hugging_face_roberta(tmp_path, monkeypatch):
    directory, _, _ = fine_tune(tmp_path, monkeypatch, "roberta_tiny_topics", "roberta",
                                "roberta.embeddings.word_embeddings.weight", export=False)
    # A RoBERTa checkpoint is the bert family's: a modernbert recipe refuses it.
    modernbert = topics_recipe(tmp_path, "modernbert_tiny_topics", tmp_path / "topics")
    with pytest.raises(ValueError, match=r"^Recipe key `family` must be 'bert' to fine-tune "
                                         r".*RoBERTa directory.*Received: family='modernbert'"):
        make_task(load_recipe(modernbert, RUN + [f"training.pretrained={directory}"])).prepare()
