"""RoBERTa and XLM-R from transformers' directories (random weights of an
untested size, every norm and bias moved off 1 and 0), the one-call
`load_hf`, and BERT masked-LM directories, held against transformers."""

import json
import os

import numpy as np
import pytest

from keras_attn.convert import load_hf
from keras_attn.convert import load_hf_bert_backbone
from keras_attn.convert import load_hf_roberta
from keras_attn.convert import load_hf_roberta_tokenizer
from keras_attn.convert import save_hf
from test_case import to_numpy

SIZE = dict(vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
            intermediate_size=40)


def _save(tmp_path_factory, cls_name, config_name, **extra):
    import torch
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**SIZE, **extra)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # norms and biases off 1 and 0, every table moved
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    path = str(tmp_path_factory.mktemp(cls_name))
    model.save_pretrained(path)
    return path, model


def _batch():
    """A row padded with RoBERTa's <pad> (1) on the right, one with padding
    inside (the positions after it count on from where they stopped: RoBERTa
    counts real tokens), and one full row."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, SIZE["vocab_size"], (3, 9)).astype("int32")
    ids[:, 0] = 0  # <s>
    ids[0, 6:] = 1
    ids[1, 2:4] = 1
    mask = (ids != 1).astype("int32")
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def _theirs(model, batch, **kwargs):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(batch["token_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["padding_mask"], dtype=torch.long),
                     **kwargs)


def _saved_back(model, path, tmp_path_factory):
    """save_hf(model) holds the tensors of `path` bit for bit, and
    transformers loads it with nothing missing or unexpected."""
    import transformers
    from safetensors.numpy import load_file

    out = save_hf(model, tmp_path_factory.mktemp("saved") / "hf")
    original = load_file(os.path.join(path, "model.safetensors"))
    written = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(written) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    with open(os.path.join(out, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    hf, info = getattr(transformers, architecture).from_pretrained(out, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    return hf.eval()


ROBERTA = dict(max_position_embeddings=14, type_vocab_size=1, layer_norm_eps=1e-5,
               pad_token_id=1)


@pytest.mark.parametrize("prefix", ["Roberta", "XLMRoberta"])
def test_roberta_models_equal_transformers(prefix, tmp_path_factory):
    batch = _batch()
    real = batch["padding_mask"].astype(bool)
    config = prefix + "Config"

    path, hf = _save(tmp_path_factory, prefix + "Model", config, **ROBERTA)
    model = load_hf(path)
    assert type(model).__name__ == "BertBackbone"
    assert (model.bert_config.padding_id, model.bert_config.max_sequence_length) == (1, 12)
    theirs, ours = _theirs(hf, batch), model(batch)
    np.testing.assert_allclose(to_numpy(ours["sequence_output"])[real],
                               theirs.last_hidden_state.numpy()[real], atol=1e-4)
    np.testing.assert_allclose(to_numpy(ours["pooled_output"]), theirs.pooler_output.numpy(),
                               atol=1e-4)
    back = _theirs(_saved_back(model, path, tmp_path_factory), batch)
    np.testing.assert_allclose(back.pooler_output.numpy(), theirs.pooler_output.numpy(),
                               atol=1e-6)

    path, hf = _save(tmp_path_factory, prefix + "ForMaskedLM", config, **ROBERTA)
    model = load_hf_roberta(path)
    assert (type(model).__name__, model.next_sentence) == ("BertPretrainer", False)
    positions = np.array([[0, 3, 5], [1, 4, 8], [1, 2, 8]], "int32")  # real tokens
    expected = np.take_along_axis(_theirs(hf, batch).logits.numpy(), positions[..., None], 1)
    ours = model({**batch, "mask_positions": positions})
    assert list(ours) == ["mlm"]
    np.testing.assert_allclose(to_numpy(ours["mlm"]), expected, atol=1e-4)
    back = _theirs(_saved_back(model, path, tmp_path_factory), batch).logits.numpy()
    np.testing.assert_allclose(np.take_along_axis(back, positions[..., None], 1), expected,
                               atol=1e-6)

    path, hf = _save(tmp_path_factory, prefix + "ForSequenceClassification", config,
                     num_labels=3, **ROBERTA)
    model = load_hf(path)
    assert type(model).__name__ == "BertSequenceClassifier"
    expected = _theirs(hf, batch).logits.numpy()
    np.testing.assert_allclose(to_numpy(model(batch)), expected, atol=1e-4)
    back = _theirs(_saved_back(model, path, tmp_path_factory), batch).logits.numpy()
    np.testing.assert_allclose(back, expected, atol=1e-6)


@pytest.mark.backend_independent
def test_load_hf_refuses_what_it_cannot_map_by_name(tmp_path):
    for architectures, model_type in ((["GPT2LMHeadModel"], "gpt2"),
                                      (["RobertaForQuestionAnswering"], "roberta")):
        (tmp_path / "config.json").write_text(json.dumps(
            {"architectures": architectures, "model_type": model_type}))
        with pytest.raises(ValueError, match=architectures[0]) as error:
            load_hf(tmp_path)
        assert str(tmp_path) in str(error.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'"):
        load_hf(tmp_path)



@pytest.mark.backend_independent
def test_save_hf_and_keras_hub_refuse_what_they_cannot_write(tmp_path):
    from keras_attn.convert import to_keras_hub
    from keras_attn.models.bert import BertPretrainer
    from keras_attn.models.bert import build_bert

    roberta = build_bert("roberta_base", vocabulary_size=50, num_layers=1, hidden_dim=8,
                         num_heads=2, intermediate_dim=16, max_sequence_length=8)
    with pytest.raises(ValueError, match="RoBERTa has no next-sentence head"):
        save_hf(BertPretrainer(roberta), tmp_path / "nsp")
    with pytest.raises(ValueError, match="Received: model=str"):
        save_hf("bert", tmp_path / "str")
    with pytest.raises(ValueError, match="Received: padding_id=1"):
        to_keras_hub(roberta)  # keras-hub's BertBackbone counts positions from 0
    assert sorted(os.listdir(tmp_path)) == []


def test_bert_masked_lm_directory_loads_as_a_backbone_and_as_its_task(tmp_path_factory):
    """A BertForMaskedLM has no pooler: the backbone loads without it (and says
    so), and load_hf gives its masked-LM head."""
    path, hf = _save(tmp_path_factory, "BertForMaskedLM", "BertConfig",
                     max_position_embeddings=12)
    batch = _batch()
    real = batch["padding_mask"].astype(bool)
    with pytest.warns(UserWarning) as record:
        backbone = load_hf_bert_backbone(path)
    messages = " ".join(str(warning.message) for warning in record)
    assert "no pooler" in messages and "not loaded into the backbone: cls.predictions" in messages
    theirs = _theirs(hf.bert, batch, token_type_ids=None)
    np.testing.assert_allclose(to_numpy(backbone(batch)["sequence_output"])[real],
                               theirs.last_hidden_state.numpy()[real], atol=1e-4)
    model = load_hf(path)
    positions = np.array([[0, 3, 5], [1, 4, 8], [1, 2, 8]], "int32")  # real tokens
    expected = np.take_along_axis(_theirs(hf, batch).logits.numpy(), positions[..., None], 1)
    np.testing.assert_allclose(to_numpy(model({**batch, "mask_positions": positions})["mlm"]),
                               expected, atol=1e-4)
    back = _theirs(_saved_back(model, path, tmp_path_factory), batch).logits.numpy()
    np.testing.assert_allclose(np.take_along_axis(back, positions[..., None], 1), expected,
                               atol=1e-6)


@pytest.mark.backend_independent
def test_roberta_tokenizer_equals_transformers(tmp_path):
    from _hf_tokenizers import roberta_files

    # A byte-level BPE vocabulary: the 256 byte symbols, a few merges.
    theirs = roberta_files(tmp_path, ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s",
                                      "Ġs at", "o n", "Ġ on", "Ġ Ġ"])
    ours = load_hf_roberta_tokenizer(str(tmp_path))
    # Two spaces before a word ("ĠĠ" is in the vocabulary): keras-hub's default
    # eager split (Llama 3's pattern) keeps them together, GPT-2's does not.
    for text in ["the cat sat on the mat.", "The Cat  sat!", "a <mask> sat", "héllo 12",
                 "a  b  c"]:
        expected = theirs(text, add_special_tokens=False)["input_ids"]
        assert to_numpy(ours(text)).tolist() == expected, text
    os.remove(tmp_path / "merges.txt")
    with pytest.raises(ValueError, match="merges.txt does not exist"):
        load_hf_roberta_tokenizer(str(tmp_path))


@pytest.mark.backend_independent
def test_xlm_roberta_tokenizer_equals_transformers(tmp_path):
    import io

    import sentencepiece
    import transformers

    from keras_attn.convert import load_hf_bpe_tokenizer
    from keras_attn.convert import load_hf_xlm_roberta_tokenizer

    # A tiny SentencePiece model in XLM-R's layout (<unk> <s> </s> first).
    text = ["the quick brown fox jumps over the lazy dog", "the earth is round",
            "a tokenizer splits words into pieces", "keras runs on three backends"] * 10
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=proto, vocab_size=60, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
    (tmp_path / "sentencepiece.bpe.model").write_bytes(proto.getvalue())
    theirs = transformers.XLMRobertaTokenizer.from_pretrained(str(tmp_path))
    # transformers 5 saves tokenizer.json alone: the same tokenizer, rebuilt.
    saved = tmp_path / "saved"
    theirs.save_pretrained(str(saved))
    assert not (saved / "sentencepiece.bpe.model").exists()
    for ours in (load_hf_xlm_roberta_tokenizer(str(tmp_path)),
                 load_hf_xlm_roberta_tokenizer(str(saved))):
        for sentence in ["the quick brown fox", "zebras quizzed xylophones",
                         "hello  world\tkeras", "Ünïcode café"]:  # unknown words and characters
            expected = theirs(sentence, add_special_tokens=False)["input_ids"]
            assert to_numpy(ours(sentence)).tolist() == expected, sentence
        assert ours.mask_token_id == theirs.mask_token_id
    with pytest.raises(ValueError, match="Unigram.*load_hf_xlm_roberta_tokenizer"):
        load_hf_bpe_tokenizer(str(saved))
    spec = json.loads((saved / "tokenizer.json").read_text())
    spec["normalizer"] = None
    (saved / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="json: SentencePiece's precompiled.*normalizer=None"):
        load_hf_xlm_roberta_tokenizer(str(saved))
    with pytest.raises(ValueError, match="sentencepiece.bpe.model does not exist, nor does"):
        load_hf_xlm_roberta_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_prefix_space": False}))
    with pytest.raises(ValueError, match="add_prefix_space=False"):
        load_hf_xlm_roberta_tokenizer(str(tmp_path))
