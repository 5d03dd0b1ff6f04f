import json
import os

import numpy as np
import pytest

from keras_attn.convert.bert import load_hf_bert
from keras_attn.convert.bert import load_hf_bert_backbone
from keras_attn.convert.bert import load_hf_bert_tokenizer
from test_case import to_numpy

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "##s", "a", "run", "##ning", ".", ","]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
    )
    model = transformers.BertModel(config).eval()
    path = str(tmp_path_factory.mktemp("hf_bert"))
    model.save_pretrained(path)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab += [f"[unused{i}]" for i in range(100 - len(vocab))]
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    return path, model


def test_outputs_equal_transformers(hf_dir):
    import torch

    path, hf_model = hf_dir
    model, tokenizer = load_hf_bert(path)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (3, 11)).astype("int32")
    segments = np.zeros_like(ids)
    segments[:, 6:] = 1
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 4:] = 0
    with torch.no_grad():
        hf = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                      token_type_ids=torch.tensor(segments, dtype=torch.long),
                      attention_mask=torch.tensor(mask, dtype=torch.long))
    out = model({"token_ids": ids, "segment_ids": segments, "padding_mask": mask})
    real = mask.astype(bool)
    np.testing.assert_allclose(to_numpy(out["sequence_output"])[real],
                               hf.last_hidden_state.numpy()[real], atol=1e-4)
    np.testing.assert_allclose(to_numpy(out["pooled_output"]), hf.pooler_output.numpy(),
                               atol=1e-4)
    assert model.bert_config.max_sequence_length == 64
    # the cat ##s sat , run ##ning .
    assert to_numpy(tokenizer(["The cats sat, RUNNING."])).tolist()[0] == [
        5, 6, 11, 7, 16, 13, 14, 15]


@pytest.mark.backend_independent
def test_tokenizer_equals_transformers(hf_dir):
    import transformers

    path, _ = hf_dir
    ours = load_hf_bert_tokenizer(path)
    theirs = transformers.BertTokenizer(os.path.join(path, "vocab.txt"), do_lower_case=True)
    for text in ["The cats sat, RUNNING.", "a dog on the mat", "Zebras sat."]:
        expected = theirs(text, add_special_tokens=False)["input_ids"]
        assert to_numpy(ours(text)).tolist() == expected, text


@pytest.mark.backend_independent
def test_tokenizer_case_from_vocabulary(hf_dir, tmp_path):
    path, _ = hf_dir
    tokenizer = load_hf_bert_tokenizer(path, sequence_length=6)
    assert to_numpy(tokenizer("the mat")).tolist() == [5, 9, 0, 0, 0, 0]
    with open(os.path.join(path, "vocab.txt")) as f:
        vocab = f.read()
    (tmp_path / "vocab.txt").write_text(vocab.replace("\ncat\n", "\nCat\n"))
    cased = load_hf_bert_tokenizer(str(tmp_path))
    assert cased.lowercase is False


def _copy(path, dst, edit_tensors=None, edit_config=None):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    tensors = load_file(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return str(dst)


@pytest.mark.backend_independent
def test_mismatched_tensor_is_named_and_nothing_loads(hf_dir, tmp_path, monkeypatch):
    path, _ = hf_dir
    name = "encoder.layer.1.intermediate.dense.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:60]

    bad = _copy(path, tmp_path, edit_tensors=shrink)
    assigned = []
    import keras

    original = keras.Variable.assign
    monkeypatch.setattr(keras.Variable, "assign",
                        lambda self, value: assigned.append(self.path) or original(self, value))
    good = load_hf_bert_backbone(path)
    assert len(assigned) == len(good.weights)  # the spy sees every assignment
    del assigned[:]
    # The tensor comes late in load order; no weight is assigned before the error.
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.intermediate\.dense\.weight"):
        load_hf_bert_backbone(bad)
    assert assigned == []


@pytest.mark.backend_independent
def test_config_that_does_not_match_the_tensors(hf_dir, tmp_path):
    path, _ = hf_dir

    def more_positions(config):
        config["max_position_embeddings"] = 128

    bad = _copy(path, tmp_path, edit_config=more_positions)
    with pytest.raises(ValueError, match=r"embeddings\.position_embeddings\.weight"):
        load_hf_bert_backbone(bad)


@pytest.mark.backend_independent
def test_missing_tensor_and_unsupported_activation(hf_dir, tmp_path):
    path, _ = hf_dir
    bad = _copy(path, tmp_path, edit_tensors=lambda t: t.pop("pooler.dense.bias"))
    with pytest.raises(ValueError, match=r"no tensor 'pooler\.dense\.bias'"):
        load_hf_bert_backbone(bad)
    (tmp_path / "relu").mkdir()
    bad = _copy(path, tmp_path / "relu",
                edit_config=lambda c: c.update(hidden_act="quick_gelu"))
    with pytest.raises(ValueError, match="Received: hidden_act='quick_gelu'"):
        load_hf_bert_backbone(bad)
