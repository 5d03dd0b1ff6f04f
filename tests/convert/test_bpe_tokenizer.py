"""load_hf_bpe_tokenizer against the tokenizers library on the same
tokenizer.json: a tiny byte-level BPE trained here (the format ModernBERT
ships), special tokens, runs of spaces and newlines."""

import json

import numpy as np
import pytest

from keras_attn.convert import load_hf_bpe_tokenizer
from test_case import to_numpy

pytestmark = pytest.mark.backend_independent

CORPUS = ["The cat sat on the mat.", "It's 12345 o'clock (really)!", "héllo wörld, naïve café",
          "tabs\tand\n\nnewlines   spaces", "THE CAT'S HAT"]
# Runs of spaces and a newline are where keras-hub's default eager split
# (Llama 3's pattern) and GPT-2's byte-level one part.
TEXTS = ["The cat sat on the mat.", "IT'S  a [MASK] here", "héllo\n\n  wörld ",
         "[CLS]naïve café's 12345[SEP]", "x  \t y"]


def _tokenizer_json(directory, add_prefix_space=False):
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    path = str(directory / "tokenizer.json")
    tokenizer.save(path)
    return Tokenizer.from_file(path), path


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_ids_equal_the_tokenizers_library(add_prefix_space, tmp_path):
    theirs, _ = _tokenizer_json(tmp_path, add_prefix_space)
    ours = load_hf_bpe_tokenizer(tmp_path)
    for text in TEXTS:
        if add_prefix_space and "[" in text:
            continue  # the tokenizers library adds the space after each added token too
        expected = theirs.encode(text, add_special_tokens=False).ids
        assert to_numpy(ours(text)).tolist() == expected, text
    if add_prefix_space:
        return
    # The same ids in a batch and padded to a length.
    padded = load_hf_bpe_tokenizer(tmp_path, sequence_length=32)
    batch = to_numpy(padded(TEXTS[:2]))
    assert batch.shape == (2, 32)
    first = theirs.encode(TEXTS[0], add_special_tokens=False).ids
    np.testing.assert_array_equal(batch[0, :len(first)], first)


def test_at_most_ten_added_tokens_stay_whole_the_named_ones_first(tmp_path):
    """keras-hub's tf.data path keeps 10 added tokens whole (ModernBERT's
    file has dozens): those tokenizer_config.json names first, then the
    special ones; the others are tokenized as text, with a warning."""
    theirs, path = _tokenizer_json(tmp_path)
    theirs.add_special_tokens([f"[unused{i}]" for i in range(8)])  # 13 added tokens
    theirs.save(path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"sep_token": "[unused7]"}))
    with pytest.warns(UserWarning, match=r"3 more .*'\[unused4\]', '\[unused5\]', "
                                         r"'\[unused6\]'"):
        ours = load_hf_bpe_tokenizer(tmp_path)
    for text in ["a [MASK] b[unused7]", "[CLS] x [unused3]"]:
        expected = theirs.encode(text, add_special_tokens=False).ids
        assert to_numpy(ours(text)).tolist() == expected, text
    # Tokenized as text, not mangled: its pieces give the text back.
    ids = ours("[unused6]")
    assert len(to_numpy(ids)) > 1
    text = np.asarray(ours.detokenize(ids)).item()
    assert (text.decode() if isinstance(text, bytes) else text) == "[unused6]"


def test_settings_it_cannot_compute_are_refused_by_name(tmp_path):
    _, path = _tokenizer_json(tmp_path)
    with open(path, encoding="utf-8") as stream:
        spec = json.load(stream)

    def refused(change, match):
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(change(json.loads(json.dumps(spec))), stream)
        with pytest.raises(ValueError, match=match):
            load_hf_bpe_tokenizer(tmp_path)

    refused(lambda s: {**s, "model": {**s["model"], "type": "WordPiece"}},
            r"Received: model.type='WordPiece'")
    refused(lambda s: {**s, "model": {**s["model"], "dropout": 0.1}},
            r"Received: model.dropout=0.1")
    refused(lambda s: {**s, "pre_tokenizer": {"type": "Metaspace"}},
            r"Received: pre_tokenizer.type='Metaspace'")
    refused(lambda s: {**s, "normalizer": {"type": "Lowercase"}},
            r"Received: normalizer=\{'type': 'Lowercase'\}")
    def marked(s, **options):
        tokens = [{**t, **options} if t["content"] == "[MASK]" else t for t in s["added_tokens"]]
        return {**s, "added_tokens": tokens}

    refused(lambda s: marked(s, single_word=True),
            r"Received: added_tokens\['\[MASK\]'\].single_word=True")
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(marked(spec, lstrip=True), stream)
    with pytest.warns(UserWarning, match=r"spaces beside '\[MASK\]' \(lstrip\)"):
        load_hf_bpe_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="neither tokenizer.json nor vocab.json"):
        load_hf_bpe_tokenizer(tmp_path)
