"""keras_attn -> Hugging Face: directories transformers loads with no
missing or unexpected key and the same outputs, and HF -> keras_attn -> HF
round trips that give the same tensors bit for bit."""

import json
import os

import numpy as np
import pytest

from _families import FAMILIES
from keras_attn.convert import load_hf_bert_task
from keras_attn.convert import load_hf_vit
from keras_attn.convert import save_hf_bert
from keras_attn.convert import save_hf_vit
from test_case import to_numpy

# Writing and reading the files is NumPy and Python, the same on every backend;
# the models' outputs on JAX are held against transformers' in
# test_bert_convert.py and test_vit_convert.py: tested once, on TensorFlow.
pytestmark = pytest.mark.backend_independent

# Two non-default BERTs: heads of width 8 and 5, three segments, another epsilon.
BERT_CONFIGS = [
    dict(vocabulary_size=61, num_layers=2, num_heads=3, hidden_dim=24, intermediate_dim=40,
         max_sequence_length=24, num_segments=3, layer_norm_epsilon=1e-6),
    dict(vocabulary_size=47, num_layers=1, num_heads=4, hidden_dim=20, intermediate_dim=36,
         max_sequence_length=16, num_segments=2, layer_norm_epsilon=1e-12,
         activation="gelu_approximate"),
]
BERT_KINDS = {
    "BertBackbone": "BertModel",
    "BertSequenceClassifier": "BertForSequenceClassification",
    "BertTokenClassifier": "BertForTokenClassification",
    "BertPretrainer": "BertForPreTraining",
}


def _bert(kind, config, seed=0):
    import keras

    from keras_attn.models import bert

    keras.utils.set_random_seed(seed)
    backbone = FAMILIES["bert"].backbone(**config)  # every size the config's
    if kind == "BertBackbone":
        model = backbone
    elif kind == "BertPretrainer":
        model = bert.BertPretrainer(backbone)
    else:
        model = getattr(bert, kind)(backbone, num_classes=5, dropout=0.2)
    # The heads and biases start at zero or one: draw every weight so that a
    # misplaced one shows.
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    return model


def _bert_batch(config):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config["vocabulary_size"], (3, 9)).astype("int32")
    segments = rng.integers(0, config["num_segments"], (3, 9)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def _loaded(cls_name, path, **kwargs):
    import transformers

    model, info = getattr(transformers, cls_name).from_pretrained(
        path, output_loading_info=True, **kwargs)
    assert {k: v for k, v in info.items() if v} == {}, info  # nothing missing or unexpected
    return model.eval()


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("kind", sorted(BERT_KINDS))
def test_saved_bert_loads_in_transformers_with_equal_outputs(kind, index, tmp_path):
    import torch

    config = BERT_CONFIGS[index]
    model = _bert(kind, config, seed=index)
    path = save_hf_bert(model, tmp_path / "hf")
    hf = _loaded(BERT_KINDS[kind], path)
    batch = _bert_batch(config)
    real = batch["padding_mask"].astype(bool)
    torch_inputs = dict(input_ids=torch.tensor(batch["token_ids"], dtype=torch.long),
                        token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                        attention_mask=torch.tensor(batch["padding_mask"], dtype=torch.long))
    with torch.no_grad():
        theirs = hf(**torch_inputs)
    if kind == "BertPretrainer":
        positions = np.array([[0, 4, 8], [1, 2, 5], [0, 1, 2]], "int32")
        ours = model({**batch, "mask_positions": positions})
        expected = np.take_along_axis(theirs.prediction_logits.numpy(), positions[..., None], 1)
        np.testing.assert_allclose(to_numpy(ours["mlm"]), expected, atol=1e-4)
        np.testing.assert_allclose(to_numpy(ours["nsp"]),
                                   theirs.seq_relationship_logits.numpy(), atol=1e-4)
    elif kind == "BertBackbone":
        ours = model(batch)
        np.testing.assert_allclose(to_numpy(ours["sequence_output"])[real],
                                   theirs.last_hidden_state.numpy()[real], atol=1e-4)
        np.testing.assert_allclose(to_numpy(ours["pooled_output"]),
                                   theirs.pooler_output.numpy(), atol=1e-4)
    else:
        ours = to_numpy(model(batch))
        expected = theirs.logits.numpy()
        if kind == "BertTokenClassifier":
            ours, expected = ours[real], expected[real]
        np.testing.assert_allclose(ours, expected, atol=1e-4)
    with open(os.path.join(path, "config.json")) as f:
        written = json.load(f)
    assert written["num_attention_heads"] == config["num_heads"]
    assert written["type_vocab_size"] == config["num_segments"]
    assert written["hidden_act"] == ("gelu_pytorch_tanh" if index else "gelu")


@pytest.mark.parametrize("kind", sorted(BERT_KINDS))
def test_hf_bert_round_trip_is_bit_exact(kind, tmp_path):
    import torch
    import transformers
    from safetensors.numpy import load_file

    torch.manual_seed(0)
    hf_config = transformers.BertConfig(
        vocab_size=53, hidden_size=18, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=30, max_position_embeddings=20, type_vocab_size=3, num_labels=4,
        layer_norm_eps=1e-7, hidden_act="gelu_new")
    original = getattr(transformers, BERT_KINDS[kind])(hf_config)
    original.save_pretrained(tmp_path / "original")
    model = load_hf_bert_task(str(tmp_path / "original"))
    assert type(model).__name__ == kind
    save_hf_bert(model, tmp_path / "again")
    before = load_file(tmp_path / "original" / "model.safetensors")
    after = load_file(tmp_path / "again" / "model.safetensors")
    if kind == "BertTokenClassifier":
        assert not any("pooler" in name for name in before)
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name


def test_saved_tokenizer_tokenizes_as_ours_in_transformers(tmp_path):
    import keras_hub
    import transformers

    words = ["the", "cat", "sat", "on", "mat", "##s", "run", "##ning", ".", ","]
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    vocabulary += [f"[unused{i}]" for i in range(47 - len(vocabulary))]
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=True,
                                                        strip_accents=True)
    path = save_hf_bert(_bert("BertBackbone", BERT_CONFIGS[1]), tmp_path / "hf",
                        tokenizer=tokenizer)
    theirs = transformers.BertTokenizer.from_pretrained(path)
    for text in ["The cats sat, RUNNING.", "the mat", "Zebras sät."]:
        expected = theirs(text, add_special_tokens=False)["input_ids"]
        assert to_numpy(tokenizer(text)).tolist() == expected, text
    with pytest.raises(ValueError, match="tokenizer.*47.*vocabulary_size is 61"):
        save_hf_bert(_bert("BertBackbone", BERT_CONFIGS[0]), tmp_path / "other",
                     tokenizer=tokenizer)
    assert not (tmp_path / "other").exists()


VIT_CONFIGS = [
    dict(image_size=12, patch_size=4, num_channels=1, hidden_dim=24, num_layers=2, num_heads=3,
         intermediate_dim=40, layer_norm_epsilon=1e-6, num_classes=7),
    dict(image_size=16, patch_size=8, num_channels=3, hidden_dim=20, num_layers=1, num_heads=4,
         intermediate_dim=28, layer_norm_epsilon=1e-12, num_classes=None),
]


def _vit(config, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    model = FAMILIES["vit"].build(**config)  # every size the config's
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    return model


@pytest.mark.parametrize("index", [0, 1])
def test_saved_vit_loads_in_transformers_with_equal_outputs(index, tmp_path):
    import torch

    config = VIT_CONFIGS[index]
    model = _vit(config, seed=index)
    path = save_hf_vit(model, tmp_path / "hf")
    size, channels = config["image_size"], config["num_channels"]
    images = np.random.default_rng(2).integers(0, 256, (3, size, size, channels)).astype("float32")
    pixels = torch.tensor((images / 127.5 - 1).transpose(0, 3, 1, 2))
    if config["num_classes"]:
        hf = _loaded("ViTForImageClassification", path)
        with torch.no_grad():
            expected = hf(pixel_values=pixels).logits.numpy()
    else:
        hf = _loaded("ViTModel", path, add_pooling_layer=False)
        with torch.no_grad():
            expected = hf(pixel_values=pixels).last_hidden_state[:, 0].numpy()
    np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4)
    with open(os.path.join(path, "preprocessor_config.json")) as f:
        assert json.load(f)["image_mean"] == [0.5] * channels


def test_hf_vit_round_trip_is_bit_exact(tmp_path):
    import torch
    import transformers
    from safetensors.numpy import load_file

    torch.manual_seed(0)
    hf_config = transformers.ViTConfig(
        image_size=12, patch_size=6, num_channels=2, hidden_size=18, num_hidden_layers=2,
        num_attention_heads=3, intermediate_size=30, num_labels=4)
    transformers.ViTForImageClassification(hf_config).save_pretrained(tmp_path / "original")
    save_hf_vit(load_hf_vit(str(tmp_path / "original")), tmp_path / "again")
    before = load_file(tmp_path / "original" / "model.safetensors")
    after = load_file(tmp_path / "again" / "model.safetensors")
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        assert np.array_equal(after[name], value), name


def test_what_the_other_format_cannot_express_is_refused_before_writing(tmp_path):
    from keras_attn.models import enable_lora

    gap = _vit(dict(VIT_CONFIGS[0], pooling="gap"))
    with pytest.raises(ValueError, match="pooling='gap'"):
        save_hf_vit(gap, tmp_path / "gap")
    adapted = _bert("BertSequenceClassifier", BERT_CONFIGS[1])
    enable_lora(adapted, 2)
    with pytest.raises(ValueError, match="LoRA.*merge_lora"):
        save_hf_bert(adapted, tmp_path / "lora")
    with pytest.raises(ValueError, match="no activation 'mish'.*Received: activation='mish'"):
        save_hf_bert(_bert("BertBackbone", dict(BERT_CONFIGS[1], activation="mish")),
                     tmp_path / "mish")
    with pytest.raises(ValueError, match="model=ViT"):
        save_hf_bert(_vit(VIT_CONFIGS[1]), tmp_path / "vit_as_bert")
    assert os.listdir(tmp_path) == []  # no directory, no staging left


def test_an_existing_directory_is_replaced_only_when_asked(tmp_path):
    import re

    model = _vit(VIT_CONFIGS[0])
    written = ["config.json", "model.safetensors", "preprocessor_config.json"]
    # A directory keras_attn did not write: refused, overwrite or not, and kept.
    target = tmp_path / "hf"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    (target / "config.json").write_text('{"model_type": "vit"}')
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=re.escape(
                f"`directory` {target} is not empty and is not a Hugging Face directory "
                f"written by keras_attn (config.json, model.safetensors and only the other "
                f"files it writes: ")
                + r".*" + re.escape("(it has no model.safetensors): it holds 'config.json', "
                                    "'notes.txt'. Nothing was changed")):
            save_hf_vit(model, target, overwrite=overwrite)
        assert (target / "notes.txt").read_text() == "mine"
        assert sorted(os.listdir(target)) == ["config.json", "notes.txt"]
    # An earlier directory it wrote: replaced only with overwrite=True, and a
    # sibling named like a leftover (hf.old) is not touched.
    earlier = tmp_path / "earlier"
    save_hf_vit(model, earlier)
    (tmp_path / "earlier.old").mkdir()
    (tmp_path / "earlier.old" / "keep.txt").write_text("kept")
    with pytest.raises(ValueError, match="overwrite=True"):
        save_hf_vit(model, earlier)
    second = _vit(VIT_CONFIGS[0], seed=1)
    save_hf_vit(second, earlier, overwrite=True)
    assert sorted(os.listdir(earlier)) == written
    np.testing.assert_array_equal(
        to_numpy(load_hf_vit(str(earlier)).weights[0]), to_numpy(second.weights[0]))
    assert (tmp_path / "earlier.old" / "keep.txt").read_text() == "kept"
    # The same directory with one file more than keras_attn writes: refused.
    (earlier / "README.md").write_text("card")
    with pytest.raises(ValueError, match="keras_attn does not write 'README.md'"):
        save_hf_vit(model, earlier, overwrite=True)
    assert (earlier / "README.md").read_text() == "card"
    assert sorted(os.listdir(tmp_path)) == ["earlier", "earlier.old", "hf"]  # no leftovers


def test_a_task_checkpoint_that_does_not_fit_is_refused(tmp_path):
    model = _bert("BertSequenceClassifier", BERT_CONFIGS[1])
    path = save_hf_bert(model, tmp_path / "hf")
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.update(num_labels=7, id2label={str(i): str(i) for i in range(7)})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match=r"'classifier.weight' has shape \(5, 20\).*\(7, 20\)"):
        load_hf_bert_task(path)
    config.update(num_labels=5, architectures=["BertForQuestionAnswering"])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="Received: architectures=\\['BertForQuestionAnswering'\\]"):
        load_hf_bert_task(path)
    # A classifier's tensors under a masked LM's name: its head is missing.
    config.update(architectures=["BertForMaskedLM"])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="no tensor 'cls.predictions.transform.dense.weight'"):
        load_hf_bert_task(path)


def test_bad_arguments_are_refused_by_name(tmp_path):
    from keras_attn.models.bert import build_bert

    with pytest.raises(ValueError, match="model=BertBackbone"):
        save_hf_vit(_bert("BertBackbone", BERT_CONFIGS[1]), tmp_path / "bert_as_vit")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=f"`directory` must be a directory; {tmp_path}/file is "
                                         "a file"):
        save_hf_vit(_vit(VIT_CONFIGS[1]), tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(ValueError, match="Received: activation='no_such'"):
        build_bert("bert_tiny", num_layers=1, activation="no_such")
