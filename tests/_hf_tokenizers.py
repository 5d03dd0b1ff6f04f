"""Tiny Hugging Face tokenizers of each kind keras_attn reads, saved by
transformers' `save_pretrained` (tests/convert/test_hf_tokenizer.py and
tests/data/test_user_files.py): BERT's WordPiece, RoBERTa's byte-level BPE,
ModernBERT's byte-level BPE (a tokenizers-library file with `[CLS]` /
`[SEP]`) and XLM-R's SentencePiece.

    directory = save_tokenizer(tmp_path, "roberta")
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
"""

import io
import json

KINDS = ("bert", "roberta", "modernbert", "xlm_roberta")
CORPUS = ["the cat sat on the mat", "a great film and a great story", "dull and far too long",
          "the quick brown fox jumps over the lazy dog", "wonderful acting, I loved it"]


def _bert(folder):
    import transformers

    words = sorted({w for line in CORPUS for w in line.replace(",", " ").split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "##s", "##ing"] + words
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return transformers.BertTokenizer(str(folder / "vocab.txt"))


def roberta_files(folder, merges):
    """RoBERTa's `vocab.json` and `merges.txt` in `folder`: the 256 byte
    symbols, `merges` and their tokens, `<s>` `<pad>` `</s>` `<unk>` first
    and `<mask>` last; a `RobertaTokenizer` over them."""
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for token in list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges]:
        vocabulary.setdefault(token, len(vocabulary))
    vocabulary["<mask>"] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return transformers.RobertaTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def _roberta(folder):
    return roberta_files(folder, ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at",
                                  "o n", "Ġ on", "Ġ g", "r e", "Ġg re", "Ġgre at"])


def _modernbert(folder):
    import transformers
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors
    from tokenizers import trainers

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS * 5, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]")


def _xlm_roberta(folder):
    import sentencepiece
    import transformers

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 8), model_writer=proto, vocab_size=60, unk_id=0,
        bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
    (folder / "sentencepiece.bpe.model").write_bytes(proto.getvalue())
    return transformers.XLMRobertaTokenizer.from_pretrained(str(folder))


def save_tokenizer(tmp_path, kind):
    """The directory transformers' `save_pretrained` writes for a tiny
    tokenizer of `kind` (one of `KINDS`)."""
    source = tmp_path / f"{kind}_source"
    source.mkdir(parents=True, exist_ok=True)
    tokenizer = {"bert": _bert, "roberta": _roberta, "modernbert": _modernbert,
                 "xlm_roberta": _xlm_roberta}[kind](source)
    directory = tmp_path / kind
    tokenizer.save_pretrained(str(directory))
    return str(directory)
