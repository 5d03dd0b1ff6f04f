"""BERT's WordPiece tokenizer of a Hugging Face directory as keras-hub's
`WordPieceTokenizer` (`load_hf_bert_tokenizer`), from `vocab.txt`
(transformers 4's layout) or `tokenizer.json` (what transformers 5's
`BertTokenizer.save_pretrained` writes instead), with the options of
`tokenizer_config.json`.

The files are read strictly: a malformed entry, a token listed twice, or a
setting keras-hub's tokenizer does not compute is a `ValueError` naming the
file, the key and the value, never a tokenizer that gives other ids.
"""

import os

from keras_attn.convert._checkpoint import refuse
from keras_attn.convert._checkpoint import read_config

_VOCAB, _JSON, _SETTINGS = "vocab.txt", "tokenizer.json", "tokenizer_config.json"

# BertTokenizer's case, accent and Chinese-character options
# (tokenizer_config.json), each with its name in tokenizer.json's
# BertNormalizer and the default of both; strip_accents None follows the case.
_OPTIONS = {"do_lower_case": ("lowercase", True), "strip_accents": ("strip_accents", None),
            "tokenize_chinese_chars": ("handle_chinese_chars", True)}
# The special tokens BertTokenizer reads, with its defaults.
_SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]"}
# tensorflow-text's FastWordpieceTokenizer (keras-hub's) makes a word of more
# than 100 UTF-8 bytes the unknown token, where the tokenizers library does so
# past `max_input_chars_per_word` characters (default 100).
_WORD_LIMIT = 100


def _flag(file, key, value, nullable=False):
    """`value` if it is a boolean (or None where `nullable`)."""
    if isinstance(value, bool) or (nullable and value is None):
        return value
    refuse(file, key, value, "must be true or false" + (" or null" if nullable else ""))


def _token_name(file, key, value):
    """A special token's text: a string, or an AddedToken's `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        refuse(file, key, value, "a special token is a non-empty string")
    return value


def _read_vocab_txt(file):
    """One token a line, blank lines included: transformers' `load_vocab`
    numbers every line, so a blank one is a token (the empty string, which
    no word matches) and the ids after it count it."""
    try:
        with open(file, encoding="utf-8") as stream:
            tokens = [line.rstrip("\n") for line in stream]
    except UnicodeDecodeError as error:
        raise ValueError(f"{file} is not UTF-8 text ({error}). Received: file={file!r}") from None
    first = {}
    for index, token in enumerate(tokens):
        if token in first:  # transformers would keep the second id, leaving the first unused
            refuse(file, f"line {index + 1}", token,
                    f"each token is listed once; this one is on line {first[token] + 1} too")
        first[token] = index
    return tokens


def _vocab_from_json(file, model):
    """The WordPiece model's `{token: id}` as a list (index = id): every id
    a non-negative integer, each once, none missing."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        refuse(file, "model.vocab", type(vocab).__name__,
                "the vocabulary must be a non-empty object of token: id")
    for token, token_id in vocab.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            refuse(file, f"model.vocab[{token!r}]", token_id, "an id is an integer")
    tokens = [None] * len(vocab)
    for token, token_id in vocab.items():
        if not 0 <= token_id < len(vocab) or tokens[token_id] is not None:
            if 0 <= token_id < len(vocab):
                why = f"{tokens[token_id]!r} has it too"
            else:
                why = f"no token has id {min(set(range(len(vocab))) - set(vocab.values()))}"
            refuse(file, f"model.vocab[{token!r}]", token_id,
                    f"the ids of {len(vocab)} tokens are 0 to {len(vocab) - 1}, each once: {why}")
        tokens[token_id] = token
    return tokens


def _check_added_tokens(file, spec, ids):
    """tokenizer.json's added tokens (BERT's special tokens) each hold its
    vocabulary id; a token past the vocabulary is refused (the model has no
    row for it, and keras-hub's tokenizer would not know it)."""
    added = spec.get("added_tokens") or []
    if not isinstance(added, list):
        refuse(file, "added_tokens", type(added).__name__, "the added tokens are a list")
    for token in added:
        content = token.get("content") if isinstance(token, dict) else None
        if not isinstance(content, str) or not content:
            refuse(file, "added_tokens[...]", token, "an added token needs a content and an id")
        if content not in ids:
            refuse(file, f"added_tokens[{content!r}].id", token.get("id"),
                    "an added token past model.vocab has no row in the model and is unknown to "
                    "keras-hub's tokenizer")
        if ids[content] != token.get("id"):
            refuse(file, f"added_tokens[{content!r}].id", token.get("id"),
                    f"model.vocab gives {content!r} the id {ids[content]}")


def _check_post_processor(file, processor, ids):
    """The special tokens the post-processor adds (`[CLS]`, `[SEP]`) hold
    their vocabulary ids (a packer builds its rows from those)."""
    if processor is None:
        return
    kind = processor.get("type") if isinstance(processor, dict) else None
    if kind == "BertProcessing":  # {"sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}
        pairs = {key: processor.get(key) for key in ("cls", "sep")}
        for key, pair in pairs.items():
            if (not isinstance(pair, list) or len(pair) != 2
                    or ids.get(pair[0], -1) != pair[1]):
                refuse(file, f"post_processor.{key}", pair,
                        "a [token, id] pair whose id is the vocabulary's")
    elif kind == "TemplateProcessing":
        specials = processor.get("special_tokens")
        if not isinstance(specials, dict):
            refuse(file, "post_processor.special_tokens", specials,
                    "an object of token: {ids, tokens}")
        for name, entry in specials.items():
            tokens = entry.get("tokens") if isinstance(entry, dict) else None
            token_ids = entry.get("ids") if isinstance(entry, dict) else None
            if (not isinstance(tokens, list) or not isinstance(token_ids, list)
                    or [ids.get(token, -1) for token in tokens] != token_ids):
                refuse(file, f"post_processor.special_tokens[{name!r}].ids", token_ids,
                        f"the vocabulary's ids of {tokens!r}")
    else:
        refuse(file, "post_processor.type", kind,
                "BERT's post-processor is TemplateProcessing or BertProcessing")


def _from_tokenizer_json(file):
    """`(vocabulary, options, model settings)` of a WordPiece tokenizer.json:
    options in tokenizer_config.json's names (`do_lower_case`, ...), the
    model's unknown token and suffix indicator."""
    spec = read_config(os.path.dirname(file), os.path.basename(file))
    model = spec.get("model")
    if not isinstance(model, dict):
        refuse(file, "model", model, "a tokenizer.json holds its model (WordPiece for BERT)")
    if model.get("type") != "WordPiece":
        refuse(file, "model.type", model.get("type"),
                "BERT's tokenizer is a WordPiece model (load_hf_bpe_tokenizer reads a BPE one)")
    vocabulary = _vocab_from_json(file, model)
    limit = model.get("max_input_chars_per_word", _WORD_LIMIT)
    if limit != _WORD_LIMIT or isinstance(limit, bool):
        refuse(file, "model.max_input_chars_per_word", limit,
                f"keras-hub's tokenizer makes longer words than {_WORD_LIMIT} the unknown token, "
                "no other length")
    prefix = model.get("continuing_subword_prefix", "##")
    if not isinstance(prefix, str) or not prefix:
        refuse(file, "model.continuing_subword_prefix", prefix,
                "the prefix of a word's later pieces is a non-empty string")
    normalizer = spec.get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        refuse(file, "normalizer.type",
                normalizer.get("type") if isinstance(normalizer, dict) else normalizer,
                "keras-hub's WordPieceTokenizer normalises as BERT's BertNormalizer only")
    if _flag(file, "normalizer.clean_text", normalizer.get("clean_text", True)) is False:
        refuse(file, "normalizer.clean_text", False,
                "keras-hub's WordPieceTokenizer always drops control characters")
    options = {}
    for option, (key, default) in _OPTIONS.items():
        options[option] = _flag(file, f"normalizer.{key}", normalizer.get(key, default),
                                nullable=option == "strip_accents")
    pre_tokenizer = spec.get("pre_tokenizer")
    if isinstance(pre_tokenizer, dict) and pre_tokenizer.get("type") == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
        pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizer
    kind = pre_tokenizer.get("type") if isinstance(pre_tokenizer, dict) else pre_tokenizer
    if kind != "BertPreTokenizer":
        refuse(file, "pre_tokenizer.type", kind,
                "keras-hub's WordPieceTokenizer splits words as BertPreTokenizer only")
    ids = {token: index for index, token in enumerate(vocabulary)}
    _check_added_tokens(file, spec, ids)
    _check_post_processor(file, spec.get("post_processor"), ids)
    unk = model.get("unk_token", "[UNK]")
    if not isinstance(unk, str) or unk not in ids:
        refuse(file, "model.unk_token", unk, "the unknown token must be in the vocabulary")
    return vocabulary, options, {"unk_token": unk, "suffix_indicator": prefix}


def _from_settings(file):
    """The options and special tokens `tokenizer_config.json` names."""
    settings = read_config(os.path.dirname(file), os.path.basename(file))
    options = {option: _flag(file, option, settings[option], nullable=option == "strip_accents")
               for option in _OPTIONS if option in settings}
    tokens = {key: _token_name(file, key, settings[key]) for key in _SPECIAL if key in settings}
    return options, tokens


def _effective(options, option):
    """An option's value; strip_accents None follows the case."""
    value = options.get(option)
    if option == "strip_accents" and value is None:
        return options.get("do_lower_case")
    return value


def _same_vocabulary(vocab_file, tokens, json_file, vocabulary):
    """vocab.txt beside tokenizer.json must hold the same tokens in the same
    order (transformers 5 reads tokenizer.json, transformers 4 vocab.txt)."""
    if tokens != vocabulary:
        index = next((i for i, (a, b) in enumerate(zip(tokens, vocabulary)) if a != b),
                     min(len(tokens), len(vocabulary)))
        theirs = vocabulary[index] if index < len(vocabulary) else None
        mine = tokens[index] if index < len(tokens) else None
        refuse(vocab_file, f"line {index + 1}", mine,
                f"{json_file} holds the same vocabulary as vocab.txt, or one of them only; "
                f"its id {index} is {theirs!r}")


def _guess_lowercase(path, vocabulary):
    """`do_lower_case` of `config.json` (some old checkpoints), else a
    vocabulary without an upper-case letter (outside `[...]` tokens) means
    an uncased model."""
    if os.path.exists(os.path.join(path, "config.json")):
        value = read_config(path).get("do_lower_case")
        if value is not None:
            return _flag(os.path.join(path, "config.json"), "do_lower_case", value)
    plain = [t for t in vocabulary if not (t.startswith("[") and t.endswith("]"))]
    return not any(ch.isupper() for token in plain for ch in token)


def wordpiece_tokenizer(path, sequence_length=None, lowercase=None):
    """`load_hf_bert_tokenizer` (see its docstring)."""
    import keras_hub

    path = os.fspath(path)
    files = {name: os.path.join(path, name) for name in (_VOCAB, _JSON, _SETTINGS)}
    found = {name: os.path.exists(file) for name, file in files.items()}
    if not (found[_VOCAB] or found[_JSON]):
        raise ValueError(
            f"{path} holds neither vocab.txt nor tokenizer.json, the files of BERT's WordPiece "
            f"tokenizer. Received: path={path!r}")
    options, model = {}, {"unk_token": "[UNK]", "suffix_indicator": "##"}
    if found[_JSON]:  # transformers 5 reads the vocabulary from it where it is
        vocabulary, options, model = _from_tokenizer_json(files[_JSON])
        if found[_VOCAB]:
            _same_vocabulary(files[_VOCAB], _read_vocab_txt(files[_VOCAB]), files[_JSON],
                             vocabulary)
    else:
        vocabulary = _read_vocab_txt(files[_VOCAB])
    named, tokens = _from_settings(files[_SETTINGS]) if found[_SETTINGS] else ({}, {})
    merged = dict(options, **named)
    for option in options:  # the two files of one tokenizer must agree
        if _effective(options, option) != _effective(merged, option):
            refuse(files[_SETTINGS], option, merged[option],
                    f"{files[_JSON]}'s normalizer gives {option} "
                    f"{_effective(options, option)!r}; the two files must agree")
    unk = tokens.get("unk_token", model["unk_token"])
    if found[_JSON] and unk != model["unk_token"]:
        refuse(files[_SETTINGS], "unk_token", unk,
                f"{files[_JSON]}'s model.unk_token is {model['unk_token']!r}; the two files "
                "must agree")
    ids = set(vocabulary)
    for key, token in tokens.items():
        if token not in ids:
            refuse(files[_SETTINGS], key, token,
                    f"the vocabulary ({_JSON if found[_JSON] else _VOCAB}) does not hold it")
    if unk not in ids:
        refuse(files[_VOCAB], "unk_token", unk,
                "BertTokenizer's unknown token (by default) must be in the vocabulary")
    if lowercase is None:
        lowercase = merged.get("do_lower_case")
    if lowercase is None:
        lowercase = _guess_lowercase(path, vocabulary)
    strip_accents = merged.get("strip_accents")
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary,
        sequence_length=sequence_length,
        lowercase=bool(lowercase),
        strip_accents=bool(lowercase) if strip_accents is None else strip_accents,
        split_on_cjk=merged.get("tokenize_chinese_chars", True),
        suffix_indicator=model["suffix_indicator"],
        oov_token=unk,
    )
