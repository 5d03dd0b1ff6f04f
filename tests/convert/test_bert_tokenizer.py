"""`load_hf_bert_tokenizer` against transformers 5's `BertTokenizer`: its
options (case, accents, Chinese characters), the `tokenizer.json` that
`save_pretrained` writes in place of `vocab.txt`, a blank vocabulary line
(a token: the ids after it stay transformers'), and malformed files."""

import json
import os
import shutil

import pytest

from keras_attn.convert.bert import load_hf_bert_tokenizer
from test_case import to_numpy

# Line 6 is blank: a token of its own in transformers (every later id counts it).
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "", "the", "The", "THE", "café",
         "cafe", "Café", "Cafe", "naïve", "naive", "Naïve", "中", "文", "中文", "##s", ".",
         ",", "ré", "##sume", "##sumé", "re"]
TEXT = "The café, Café naïve cafés 中文 THE résumé Naïve."

# (do_lower_case, strip_accents, tokenize_chinese_chars): every case and
# accent combination, and Chinese characters kept in their word both ways.
OPTIONS = [(lower, strip, True) for lower in (True, False) for strip in (True, False, None)]
OPTIONS += [(True, None, False), (False, False, False)]


def _saved(tmp_path, lower, strip, chinese):
    """transformers' ids of TEXT, and the directory `save_pretrained`
    wrote (`tokenizer.json`, `tokenizer_config.json`; no `vocab.txt`)."""
    import transformers

    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    theirs = transformers.BertTokenizer(str(vocab_file), do_lower_case=lower, strip_accents=strip,
                                        tokenize_chinese_chars=chinese)
    saved = tmp_path / "saved"
    theirs.save_pretrained(str(saved))
    assert not (saved / "vocab.txt").exists()
    return theirs(TEXT, add_special_tokens=False)["input_ids"], saved


def _ids(path):
    return to_numpy(load_hf_bert_tokenizer(str(path))(TEXT)).tolist()


@pytest.mark.backend_independent
@pytest.mark.parametrize("layout", ["vocab.txt", "tokenizer.json"])
@pytest.mark.parametrize("lower,strip,chinese", OPTIONS)
def test_ids_equal_transformers(tmp_path, layout, lower, strip, chinese):
    expected, saved = _saved(tmp_path, lower, strip, chinese)
    if layout == "vocab.txt":  # transformers 4's layout: vocab.txt + tokenizer_config.json
        (saved / "tokenizer.json").unlink()
        shutil.copy(tmp_path / "vocab.txt", saved / "vocab.txt")
    assert _ids(saved) == expected


@pytest.mark.backend_independent
def test_tokenizer_json_alone_equals_tokenizers_library(tmp_path):
    import tokenizers

    _, saved = _saved(tmp_path, False, True, False)
    (saved / "tokenizer_config.json").unlink()  # the normaliser's options are read
    theirs = tokenizers.Tokenizer.from_file(str(saved / "tokenizer.json"))
    assert _ids(saved) == theirs.encode(TEXT, add_special_tokens=False).ids


def _edit_json(name, edit):
    def apply(saved):
        with open(saved / name, encoding="utf-8") as stream:
            spec = json.load(stream)
        edit(spec)
        with open(saved / name, "w", encoding="utf-8") as stream:
            json.dump(spec, stream)
    return apply


def _vocab_txt(lines):
    def apply(saved):
        (saved / "tokenizer.json").unlink()
        (saved / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return apply


def _set(spec, keys, value):
    for key in keys[:-1]:
        spec = spec[key]
    spec[keys[-1]] = value


MALFORMED = {
    "not JSON": (lambda saved: (saved / "tokenizer.json").write_text("{"),
                 r"tokenizer\.json is not valid JSON"),
    "vocab entry type": (_edit_json("tokenizer.json", lambda s: _set(s, ["model", "vocab", "the"], "6")),
                         r"tokenizer\.json: .*Received: model\.vocab\['the'\]='6'"),
    "vocab list": (_edit_json("tokenizer.json", lambda s: _set(s, ["model", "vocab"], VOCAB)),
                   r"tokenizer\.json: .*Received: model\.vocab='list'"),
    "vocab gap": (_edit_json("tokenizer.json", lambda s: s["model"]["vocab"].pop("the")),
                  r"tokenizer\.json: .*no token has id 6\. Received: model\.vocab\['re'\]=25"),
    "no model": (_edit_json("tokenizer.json", lambda s: s.pop("model")),
                 r"tokenizer\.json: .*Received: model=None"),
    "model type": (_edit_json("tokenizer.json", lambda s: _set(s, ["model", "type"], "BPE")),
                   r"tokenizer\.json: .*Received: model\.type='BPE'"),
    "unk missing": (_edit_json("tokenizer.json", lambda s: _set(s, ["model", "unk_token"], "<unk>")),
                    r"tokenizer\.json: .*Received: model\.unk_token='<unk>'"),
    "word length": (_edit_json("tokenizer.json",
                               lambda s: _set(s, ["model", "max_input_chars_per_word"], 50)),
                    r"tokenizer\.json: .*Received: model\.max_input_chars_per_word=50"),
    "lowercase type": (_edit_json("tokenizer.json", lambda s: _set(s, ["normalizer", "lowercase"], 1)),
                       r"tokenizer\.json: .*Received: normalizer\.lowercase=1"),
    "clean_text": (_edit_json("tokenizer.json", lambda s: _set(s, ["normalizer", "clean_text"], False)),
                   r"tokenizer\.json: .*Received: normalizer\.clean_text=False"),
    "normalizer": (_edit_json("tokenizer.json", lambda s: _set(s, ["normalizer"], {"type": "NFC"})),
                   r"tokenizer\.json: .*Received: normalizer\.type='NFC'"),
    "pre_tokenizer": (_edit_json("tokenizer.json",
                                 lambda s: _set(s, ["pre_tokenizer"], {"type": "Whitespace"})),
                      r"tokenizer\.json: .*Received: pre_tokenizer\.type='Whitespace'"),
    "added token id": (_edit_json("tokenizer.json", lambda s: _set(s, ["added_tokens", 4, "id"], 40)),
                       r"tokenizer\.json: .*Received: added_tokens\['\[MASK\]'\]\.id=40"),
    "added token past vocab": (_edit_json("tokenizer.json", lambda s: s["added_tokens"].append(
        {"id": len(VOCAB), "content": "[NEW]", "special": True})),
        r"tokenizer\.json: .*Received: added_tokens\['\[NEW\]'\]\.id=26"),
    "post_processor id": (_edit_json("tokenizer.json", lambda s: _set(
        s, ["post_processor", "special_tokens", "[CLS]", "ids"], [7])),
        r"tokenizer\.json: .*Received: post_processor\.special_tokens\['\[CLS\]'\]\.ids=\[7\]"),
    "files disagree": (_edit_json("tokenizer_config.json", lambda s: _set(s, ["do_lower_case"], False)),
                       r"tokenizer_config\.json.*tokenizer\.json.*Received: do_lower_case=False"),
    "vocab.txt beside": (lambda saved: (saved / "vocab.txt").write_text(
        "\n".join(VOCAB[:5] + VOCAB[6:]) + "\n", encoding="utf-8"),
        r"vocab\.txt: .*tokenizer\.json.*its id 5 is ''\. Received: line 6='the'"),
    "setting type": (_edit_json("tokenizer_config.json", lambda s: _set(s, ["strip_accents"], "no")),
                     r"tokenizer_config\.json: .*Received: strip_accents='no'"),
    "special token": (_edit_json("tokenizer_config.json", lambda s: _set(s, ["mask_token"], "<mask>")),
                      r"tokenizer_config\.json: .*Received: mask_token='<mask>'"),
    "duplicated token": (_vocab_txt(VOCAB + ["the"]),
                         r"vocab\.txt: .*line 7 too\. Received: line 27='the'"),
    "two blank lines": (_vocab_txt(VOCAB + [""]), r"vocab\.txt: .*line 6 too\. Received: line 27=''"),
    "vocab.txt unk": (_vocab_txt(VOCAB[2:]), r"tokenizer_config\.json: .*Received: unk_token='\[UNK\]'"),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_is_named(tmp_path, case):
    edit, message = MALFORMED[case]
    _, saved = _saved(tmp_path, True, None, True)
    edit(saved)
    with pytest.raises(ValueError, match=message):
        load_hf_bert_tokenizer(str(saved))


@pytest.mark.backend_independent
def test_directory_without_tokenizer_files(tmp_path):
    with pytest.raises(ValueError, match=r"neither vocab\.txt nor tokenizer\.json"):
        load_hf_bert_tokenizer(str(tmp_path))


@pytest.mark.backend_independent
def test_save_hf_bert_writes_the_options_back(tmp_path):
    import transformers

    from keras_attn.convert.bert import save_hf_bert
    from keras_attn.models import build_bert
    from keras_attn.models import get_bert_config

    expected, saved = _saved(tmp_path, False, False, False)
    config = get_bert_config("bert_tiny", vocabulary_size=len(VOCAB), num_layers=1,
                             hidden_dim=8, num_heads=2, intermediate_dim=8,
                             max_sequence_length=16)
    out = save_hf_bert(build_bert(config), str(tmp_path / "out"),
                       tokenizer=load_hf_bert_tokenizer(str(saved)))
    assert _ids(out) == expected
    theirs = transformers.BertTokenizer.from_pretrained(out)
    assert theirs(TEXT, add_special_tokens=False)["input_ids"] == expected
