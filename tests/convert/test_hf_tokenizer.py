"""`load_hf_tokenizer`: one call for the tokenizer of any supported Hugging
Face text directory, against transformers' `AutoTokenizer` on the directory
`save_pretrained` wrote (tests/_hf_tokenizers.py), and a directory of no
supported kind refused naming it and what it holds."""

import json

import pytest

from _hf_tokenizers import KINDS
from _hf_tokenizers import save_tokenizer
from keras_attn.convert import load_hf_tokenizer
from test_case import to_numpy

pytestmark = pytest.mark.backend_independent

TEXT = "the cat sat on the great mat, I loved it"


@pytest.mark.parametrize("kind", KINDS)
def test_ids_and_special_tokens_equal_auto_tokenizer(tmp_path, kind):
    import transformers

    directory = save_tokenizer(tmp_path, kind)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = load_hf_tokenizer(directory)
    assert to_numpy(ours(TEXT)).tolist() == theirs(TEXT, add_special_tokens=False)["input_ids"]
    assert (ours.start_token_id, ours.end_token_id, ours.pad_token_id) == (
        theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id)
    # The ids transformers puts between the two texts of a pair.
    first = len(theirs(TEXT)["input_ids"])
    pair = theirs(TEXT, TEXT)["input_ids"]
    assert list(ours.pair_separator_ids) == pair[first - 1:-first + 1]
    assert ours.second_segment_id == (1 if kind in ("bert", "modernbert") else 0)


def test_roberta_vocab_and_merges_alone_take_roberta_pair_form(tmp_path):
    """transformers 4's RoBERTa layout (vocab.json, merges.txt, no
    tokenizer.json): the kind from the files, `</s></s>` between a pair."""
    from _hf_tokenizers import _roberta

    _roberta(tmp_path)
    tokenizer = load_hf_tokenizer(tmp_path)
    assert tokenizer.start_token_id == 0 and tokenizer.pair_separator_ids == (2, 2)


def test_a_directory_of_no_supported_kind_is_refused_naming_what_it_holds(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevel"}}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match=rf"{tmp_path} holds no tokenizer of a supported kind.*"
                                         r"model.type='WordLevel'.*model_type='gpt_neox'"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found none of tokenizer.json"):
        load_hf_tokenizer(tmp_path / "empty")
    with pytest.raises(ValueError, match="is not a directory"):
        load_hf_tokenizer(tmp_path / "missing")
