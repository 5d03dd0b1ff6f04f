"""Byte-level BPE tokenizers of Hugging Face directories (ModernBERT's
`tokenizer.json`, RoBERTa's `vocab.json` and `merges.txt`) as keras-hub's
`BytePairTokenizer`.

The file is read strictly: a setting keras-hub's tokenizer does not compute
(another model than BPE, a pre-tokenizer other than GPT-2's byte-level
split, a normaliser, BPE dropout, word prefixes or suffixes) is a
`ValueError` naming the file, the key and the value, never a tokenizer that
gives other ids.
"""

import os
import warnings

from keras_attn.convert._checkpoint import refuse
from keras_attn.convert._checkpoint import read_config

_FILE = "tokenizer.json"

# BPE options of tokenizer.json and the one value keras-hub's BPE computes.
_BPE_FIXED = {"dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "byte_fallback": False, "ignore_merges": False}


def byte_pair_tokenizer(vocabulary, merges, sequence_length=None, add_prefix_space=False,
                        unsplittable_tokens=None):
    """keras-hub's `BytePairTokenizer` that splits words with GPT-2's
    byte-level pattern, in eager calls as in `tf.data`.

    keras-hub 0.32's eager calls go through a Python path whose word split
    is Llama 3's (two spaces before a word are one piece there, two in
    GPT-2's split), while its `tf.data` path splits runs of spaces as GPT-2,
    RoBERTa and ModernBERT do; the tokenizer is built on the second path
    for both (its constructor's `_allow_python_workflow=False`; a keras-hub
    without that path has only the second), so eager calls and `tf.data`
    give the same ids. A tokenizer saved and loaded again (`get_config`) is
    back on keras-hub's default. One difference stays on both paths: a run
    of line breaks right before a word (`"\\n\\nThe"`) is one piece in
    keras-hub (`"ĊĊ"` where the vocabulary has it), one piece a line break
    in GPT-2's split.
    """
    import keras_hub

    kwargs = dict(vocabulary=vocabulary, merges=merges, sequence_length=sequence_length,
                  add_prefix_space=add_prefix_space, unsplittable_tokens=unsplittable_tokens)
    try:
        return keras_hub.tokenizers.BytePairTokenizer(_allow_python_workflow=False, **kwargs)
    except (TypeError, ValueError):
        # A keras-hub without the Python path refuses the argument; any other
        # error is raised again by the plain call.
        return keras_hub.tokenizers.BytePairTokenizer(**kwargs)



def _read_json(file):
    """The JSON object of `file`; a `ValueError` naming it otherwise."""
    return read_config(os.path.dirname(file), os.path.basename(file))


def _byte_level(file, pre_tokenizer):
    """`add_prefix_space` of a GPT-2 byte-level pre-tokenizer (alone or the
    one step of a `Sequence`)."""
    if isinstance(pre_tokenizer, dict) and pre_tokenizer.get("type") == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
        if len(steps) == 1:
            pre_tokenizer = steps[0]
    kind = pre_tokenizer.get("type") if isinstance(pre_tokenizer, dict) else None
    if kind != "ByteLevel":
        refuse(file, "pre_tokenizer.type", kind,
                "keras-hub's BytePairTokenizer splits words as the ByteLevel pre-tokenizer "
                "(GPT-2's pattern) only")
    if not pre_tokenizer.get("use_regex", True):
        refuse(file, "pre_tokenizer.use_regex", False,
                "keras-hub's BytePairTokenizer always splits with GPT-2's pattern")
    return bool(pre_tokenizer.get("add_prefix_space", False))


def _merges(file, merges):
    """Merge rules as keras-hub's `"a b"` strings (tokenizer.json holds
    `"a b"` strings, or `["a", "b"]` pairs since tokenizers 0.20)."""
    rules = []
    for rule in merges:
        if isinstance(rule, str):
            pair = rule.split(" ")
        elif isinstance(rule, list) and all(isinstance(part, str) for part in rule):
            pair = rule
        else:
            pair = None
        if pair is None or len(pair) != 2 or not all(pair):
            refuse(file, "model.merges[...]", rule,
                    "each merge must be two tokens without spaces (keras-hub writes a rule "
                    "as 'a b')")
        rules.append(" ".join(pair))
    return rules


# keras-hub's `tf.data` path stands in "ĴA", "ĴB", ... for its unsplittable
# tokens (the decimal digits of each one's index as letters) and puts them back
# in index order: the stand-in of token 1 ("ĴB") is a prefix of those of
# tokens 10 to 19 ("ĴBA", ...), so only the first 10 come back whole.
_UNSPLITTABLE_LIMIT = 10


def _named_tokens(path):
    """The tokens `tokenizer_config.json` or `special_tokens_map.json` name
    (`cls_token`, `mask_token`, ...): the ones a model's inputs use."""
    named = []
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = os.path.join(path, name)
        if not os.path.exists(file):
            continue
        for key, value in _read_json(file).items():
            if isinstance(value, dict):
                value = value.get("content")
            if key.endswith("_token") and isinstance(value, str) and value not in named:
                named.append(value)
    return named


def _kept_whole(file, tokens, special, named):
    """At most `_UNSPLITTABLE_LIMIT` added tokens for keras-hub to keep
    whole: those the tokenizer's settings name first, then the special
    ones, then the others (each group in id order); a warning names the
    rest, which are tokenized as text."""
    ranked = sorted(range(len(tokens)),
                    key=lambda i: (tokens[i] not in named, not special[i], i))
    kept = [tokens[i] for i in ranked[:_UNSPLITTABLE_LIMIT]]
    left = [tokens[i] for i in ranked[_UNSPLITTABLE_LIMIT:]]
    if left:
        shown = ", ".join(repr(t) for t in left[:5]) + (", ..." if len(left) > 5 else "")
        warnings.warn(
            f"{file}: keras-hub's BytePairTokenizer keeps at most {_UNSPLITTABLE_LIMIT} added "
            f"tokens whole; {len(left)} more written in a text are tokenized as text: "
            f"{shown} (kept: {kept})", stacklevel=3)
    return kept


def _added_tokens(file, added, vocabulary, named=()):
    """The added tokens (special or not: the tokenizers library matches each
    in the raw text before the split) as keras-hub's unsplittable tokens,
    each given its id in `vocabulary` (at most `_UNSPLITTABLE_LIMIT`, see
    `_kept_whole`)."""
    tokens, special = [], []
    for token in added or []:
        content, token_id = token.get("content"), token.get("id")
        if not isinstance(content, str) or not content or not isinstance(token_id, int):
            refuse(file, "added_tokens[...]", token, "an added token needs a content and an id")
        if vocabulary.setdefault(content, token_id) != token_id:
            refuse(file, f"added_tokens[{content!r}].id", token_id,
                    f"the vocabulary gives {content!r} the id {vocabulary[content]}")
        if token.get("single_word"):
            refuse(file, f"added_tokens[{content!r}].single_word", True,
                    "keras-hub matches an added token anywhere in the text, inside words too")
        stripped = [side for side in ("lstrip", "rstrip") if token.get(side)]
        if stripped:
            warnings.warn(
                f"{file}: keras-hub's tokenizer does not strip the spaces beside "
                f"{content!r} ({', '.join(stripped)}): a space before it stays a token of its "
                "own, where the tokenizers library drops it", stacklevel=3)
        tokens.append(content)
        special.append(bool(token.get("special")))
    return _kept_whole(file, tokens, special, named)


def tokenizer_from_vocab_and_merges(path, sequence_length=None):
    """`load_hf_roberta_tokenizer`: `vocab.json` and `merges.txt`, the
    special tokens RoBERTa's vocabulary holds, `add_prefix_space` from
    `tokenizer_config.json` (default False)."""
    files = [os.path.join(path, name) for name in ("vocab.json", "merges.txt")]
    for file in files:
        if not os.path.exists(file):
            raise ValueError(
                f"{file} does not exist: RoBERTa's byte-level BPE tokenizer needs vocab.json "
                f"and merges.txt. Received: path={path!r}"
            )
    vocabulary = _read_json(files[0])
    settings_file = os.path.join(path, "tokenizer_config.json")
    settings = _read_json(settings_file) if os.path.exists(settings_file) else {}
    special = [t for t in ("<s>", "</s>", "<pad>", "<unk>", "<mask>") if t in vocabulary]
    with open(files[1], encoding="utf-8") as stream:
        merges = [line.rstrip() for line in stream if line.strip()]
    return byte_pair_tokenizer(
        vocabulary=vocabulary,
        merges=merges,
        sequence_length=sequence_length,
        add_prefix_space=bool(settings.get("add_prefix_space", False)),
        unsplittable_tokens=special or None,
    )


def _from_tokenizer_json(path, sequence_length):
    file = os.path.join(path, _FILE)
    spec = _read_json(file)
    model = spec.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE":
        refuse(file, "model.type", kind, "only a byte-pair-encoding model is read"
                + (" (XLM-R's Unigram: load_hf_xlm_roberta_tokenizer reads the directory's "
                   "sentencepiece.bpe.model)" if kind == "Unigram" else ""))
    for key, value in _BPE_FIXED.items():
        if model.get(key, value) not in (value, "" if value is None else value):
            refuse(file, f"model.{key}", model[key],
                    f"keras-hub's BytePairTokenizer computes {key}={value!r} only")
    normalizer = spec.get("normalizer")
    if normalizer is not None and (not isinstance(normalizer, dict)
                                   or normalizer.get("type") != "NFC"):
        refuse(file, "normalizer", normalizer,
                "keras-hub's BytePairTokenizer does not normalise the text (NFC alone is read, "
                "see load_hf_bpe_tokenizer)")
    add_prefix_space = _byte_level(file, spec.get("pre_tokenizer"))
    vocabulary = model.get("vocab")
    if not isinstance(vocabulary, dict) or not vocabulary:
        refuse(file, "model.vocab", type(vocabulary).__name__,
                "the vocabulary must be an object of token: id")
    vocabulary = dict(vocabulary)
    merges = _merges(file, model.get("merges") or [])
    unsplittable = _added_tokens(file, spec.get("added_tokens"), vocabulary,
                                 _named_tokens(path))
    return byte_pair_tokenizer(vocabulary, merges, sequence_length=sequence_length,
                               add_prefix_space=add_prefix_space,
                               unsplittable_tokens=unsplittable or None)


def load_hf_bpe_tokenizer(path, sequence_length=None):
    """The byte-level BPE tokenizer of a Hugging Face directory as keras-hub's
    `BytePairTokenizer`: from `tokenizer.json` (the tokenizers library's
    file, ModernBERT's), else from `vocab.json` and `merges.txt` (RoBERTa's,
    GPT-2's; `load_hf_roberta_tokenizer`).

    Args:
        path: the directory.
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.

    Returns:
        A `keras_hub.tokenizers.BytePairTokenizer` whose ids equal the
        tokenizers library's `Tokenizer.from_file(".../tokenizer.json")
        .encode(text, add_special_tokens=False).ids` (and transformers'
        `AutoTokenizer`'s without special tokens); its added tokens
        (`[CLS]`, `[MASK]`, ...) written in a text stay one token each, up
        to 10 of them (keras-hub's limit: those `tokenizer_config.json` or
        `special_tokens_map.json` name first, then the special ones; a
        warning names the others, which are tokenized as text). It
        adds no `[CLS]` / `[SEP]`: a packer does
        (`keras_hub.layers.StartEndPacker`). Where the ids can differ: a
        run of line breaks right before a word (`"\\n\\nThe"`, see
        `byte_pair_tokenizer`); an added token that strips the spaces beside it (`lstrip`) keeps the
        space before it as a token (a warning says so when the file is
        read); an `NFC` normaliser is not applied (text in NFC, as most
        text is, gets the same ids); with `add_prefix_space` (RoBERTa-style
        files may set it, ModernBERT's does not), the tokenizers library
        also puts a space after each added token written in the text,
        keras-hub at the start of the text only.

    Raises:
        ValueError: neither file, malformed JSON, or a setting keras-hub's
            tokenizer does not compute (named with its value).

    Example (`tokenizer.save(".../tokenizer.json")` of a `tokenizers`
    byte-level BPE before):

        tokenizer = load_hf_bpe_tokenizer(path)
        ids = tokenizer("The cat sat.")
    """
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, _FILE)):
        return _from_tokenizer_json(path, sequence_length)
    if all(os.path.exists(os.path.join(path, name)) for name in ("vocab.json", "merges.txt")):
        return tokenizer_from_vocab_and_merges(path, sequence_length)
    raise ValueError(
        f"{path} holds neither tokenizer.json nor vocab.json and merges.txt, the files of a "
        f"byte-level BPE tokenizer. Received: path={path!r}")


__all__ = ["load_hf_bpe_tokenizer"]
