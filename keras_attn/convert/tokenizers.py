"""`load_hf_tokenizer`: the tokenizer of any supported Hugging Face text
directory, whatever its kind, with the special tokens its model's inputs
use.

```
directory
 -> the kind: tokenizer.json's model.type (what transformers 5 reads), else
    tokenizer_config.json's tokenizer_class, else config.json's model_type,
    else the files present (vocab.txt; vocab.json + merges.txt;
    sentencepiece.bpe.model)
 -> WordPiece (BERT)            load_hf_bert_tokenizer
    byte-level BPE (RoBERTa,    load_hf_bpe_tokenizer
      ModernBERT)
    SentencePiece (XLM-R)       load_hf_xlm_roberta_tokenizer
 -> + the tokens transformers puts around a text and between a pair
    (tokenizer.json's post_processor, else tokenizer_config.json's
    cls / sep / pad tokens): start_token_id, end_token_id, pad_token_id,
    pair_separator_ids, second_segment_id
```
"""

import os

from keras_attn.convert._checkpoint import read_config

WORDPIECE, BPE, SENTENCEPIECE = "WordPiece", "byte-level BPE", "SentencePiece"

# tokenizer.json's model.type; tokenizer_config.json's tokenizer_class (with
# or without "Fast"); config.json's model_type.
_MODEL_TYPES = {"WordPiece": WORDPIECE, "BPE": BPE, "Unigram": SENTENCEPIECE}
_CLASSES = {"BertTokenizer": WORDPIECE, "RobertaTokenizer": BPE, "GPT2Tokenizer": BPE,
            "XLMRobertaTokenizer": SENTENCEPIECE}
_FAMILIES = {"bert": WORDPIECE, "roberta": BPE, "modernbert": BPE,
             "xlm-roberta": SENTENCEPIECE}
# The pair form of each family where no post-processor says it: RoBERTa's
# `<s> A </s></s> B </s>` (every segment id 0: the model has one row) or
# BERT's `[CLS] A [SEP] B [SEP]` (B's segment id 1).
_ROBERTA_FORM = {"RobertaTokenizer", "XLMRobertaTokenizer", "roberta", "xlm-roberta"}


def _kind_of(path):
    """`(kind or None, what was found)`: the first of tokenizer.json's model
    type, tokenizer_class, model_type and the files present that names a
    kind; `found` lists every sign read, for the error."""
    found = []
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        model = read_config(path, "tokenizer.json").get("model")
        kind = model.get("type") if isinstance(model, dict) else None
        found.append(f"tokenizer.json model.type={kind!r}")
        if kind in _MODEL_TYPES:
            return _MODEL_TYPES[kind], found
    for file, key, table in (("tokenizer_config.json", "tokenizer_class", _CLASSES),
                             ("config.json", "model_type", _FAMILIES)):
        if os.path.exists(os.path.join(path, file)):
            value = read_config(path, file).get(key)
            found.append(f"{file} {key}={value!r}")
            if isinstance(value, str) and value.removesuffix("Fast") in table:
                return table[value.removesuffix("Fast")], found
    present = {name for name in ("vocab.txt", "vocab.json", "merges.txt",
                                 "sentencepiece.bpe.model")
               if os.path.exists(os.path.join(path, name))}
    if present:
        found.append(f"files {sorted(present)}")
    if "vocab.txt" in present:
        return WORDPIECE, found
    if {"vocab.json", "merges.txt"} <= present:
        return BPE, found
    if "sentencepiece.bpe.model" in present:
        return SENTENCEPIECE, found
    return None, found


def _names(path):
    """tokenizer_class (without "Fast") and model_type, where they are."""
    names = set()
    for file, key in (("tokenizer_config.json", "tokenizer_class"), ("config.json", "model_type")):
        if os.path.exists(os.path.join(path, file)):
            value = read_config(path, file).get(key)
            if isinstance(value, str):
                names.add(value.removesuffix("Fast"))
    return names


def _settings(path):
    file = os.path.join(path, "tokenizer_config.json")
    return read_config(path, "tokenizer_config.json") if os.path.exists(file) else {}


def _content(value):
    return value.get("content") if isinstance(value, dict) else value


def _template_ids(file, processor):
    """`(start, end, separator, second_segment_id)` of a TemplateProcessing
    of the form `[start] $A [end]` / `... $A [separator...] $B [end]`."""
    specials = processor.get("special_tokens") or {}

    def ids(piece, key):
        name = piece["SpecialToken"]["id"]
        entry = specials.get(name)
        if not isinstance(entry, dict) or len(entry.get("ids") or []) != 1:
            raise ValueError(f"{file}: post_processor.special_tokens[{name!r}] must give one "
                             f"id. Received: {key}={entry!r}")
        return entry["ids"][0]

    def parts(key):
        template = processor.get(key)
        if not isinstance(template, list) or not all(
                isinstance(p, dict) and len(p) == 1 and ("SpecialToken" in p or "Sequence" in p)
                for p in template):
            raise ValueError(f"{file}: post_processor.{key} must be a list of special tokens "
                             f"and sequences. Received: {key}={template!r}")
        return template

    single, pair = parts("single"), parts("pair")
    shape = ["S" if "SpecialToken" in p else p["Sequence"]["id"] for p in single]
    if shape != ["S", "A", "S"]:
        raise ValueError(f"{file}: the text packer computes `start $A end` only. "
                         f"Received: post_processor.single={single!r}")
    shape = ["S" if "SpecialToken" in p else p["Sequence"]["id"] for p in pair]
    if (len(pair) < 5 or shape[:2] != ["S", "A"] or shape[-2:] != ["B", "S"]
            or set(shape[2:-2]) != {"S"} or ids(pair[0], "pair") != ids(single[0], "single")
            or ids(pair[-1], "pair") != ids(single[-1], "single")):
        raise ValueError(f"{file}: the text packer computes `start $A end` and `start $A "
                         f"separator $B end` only. Received: post_processor.pair={pair!r}")
    return (ids(single[0], "single"), ids(single[-1], "single"),
            tuple(ids(p, "pair") for p in pair[2:-2]), int(pair[-2]["Sequence"]["type_id"]))


def _form(path, kind, tokenizer, names):
    """`(start, end, pad, separator ids, second segment id)`: from
    tokenizer.json's post_processor where it has one, else the settings'
    cls / sep tokens and the family's pair form."""
    token_id = tokenizer.token_to_id
    settings = _settings(path)
    file = os.path.join(path, "tokenizer.json")
    processor = read_config(path, "tokenizer.json").get("post_processor") \
        if os.path.exists(file) else None
    if isinstance(processor, dict) and processor.get("type") == "Sequence":
        steps = [p for p in processor.get("processors") or [] if p.get("type") != "ByteLevel"]
        processor = steps[0] if len(steps) == 1 else processor
    kind_of_processor = processor.get("type") if isinstance(processor, dict) else None
    if kind_of_processor in ("RobertaProcessing", "BertProcessing"):
        start, end = processor["cls"][1], processor["sep"][1]
        roberta = kind_of_processor == "RobertaProcessing"
        separator, second = ((end, end), 0) if roberta else ((end,), 1)
    elif kind_of_processor == "TemplateProcessing":
        start, end, separator, second = _template_ids(file, processor)
    elif processor is not None:
        raise ValueError(f"{file}: the text packer reads a RobertaProcessing, BertProcessing or "
                         f"TemplateProcessing post-processor. Received: post_processor.type="
                         f"{kind_of_processor!r}")
    else:
        defaults = ("[CLS]", "[SEP]") if kind == WORDPIECE else ("<s>", "</s>")
        start = token_id(_content(settings.get("cls_token")) or defaults[0])
        end = token_id(_content(settings.get("sep_token")) or defaults[1])
        roberta = (kind == SENTENCEPIECE or bool(names & _ROBERTA_FORM)
                   or tokenizer.id_to_token(int(start)) == "<s>")
        separator, second = ((end, end), 0) if roberta else ((end,), 1)
    pad = _content(settings.get("pad_token")) or ("[PAD]" if kind == WORDPIECE else "<pad>")
    return int(start), int(end), int(token_id(pad)), tuple(int(i) for i in separator), second


def load_hf_tokenizer(directory, sequence_length=None):
    """The tokenizer of a Hugging Face text directory, whatever its kind:
    BERT's WordPiece, RoBERTa's and ModernBERT's byte-level BPE, XLM-R's
    SentencePiece.

    The kind is read from `tokenizer.json`'s `model.type` (what transformers
    5 reads), else `tokenizer_config.json`'s `tokenizer_class`, else
    `config.json`'s `model_type`, else the files present (`vocab.txt`;
    `vocab.json` and `merges.txt`; `sentencepiece.bpe.model`); the kind's
    loader reads it (`load_hf_bert_tokenizer`, `load_hf_bpe_tokenizer`,
    `load_hf_xlm_roberta_tokenizer`, each as strict as alone).

    Args:
        directory: the directory (`save_pretrained`'s, a checkpoint's).
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.

    Returns:
        A keras-hub tokenizer (`WordPieceTokenizer`, `BytePairTokenizer`,
        `XLMRobertaTokenizer`) whose ids equal transformers'
        `AutoTokenizer.from_pretrained(directory)(text,
        add_special_tokens=False)` (where each kind's loader says they
        can differ, they can here too), with the tokens transformers puts
        around a text as attributes: `start_token_id` (`[CLS]`, `<s>`),
        `end_token_id` (`[SEP]`, `</s>`), `pad_token_id`,
        `pair_separator_ids` (`[SEP]`, or RoBERTa's `</s></s>`) and
        `second_segment_id` (1 for BERT, 0 for RoBERTa and XLM-R). The
        text loaders (`keras_attn.data.load_text_classification_files`)
        pack with them; `tokenizer(text)` adds none of them. And
        `hf_tokenizer_file`: the directory's `tokenizer.json` (absolute
        path; None where it has none), which
        `keras_attn.export.export_text_classifier` carries into the export
        for a server that tokenizes with the `tokenizers` package.

    Raises:
        ValueError: a directory of none of these kinds (the directory and
            what it holds named); what each kind's loader refuses; a
            `tokenizer.json` post-processor other than RoBERTa's, BERT's or
            a `start $A end` / `start $A sep.. $B end` template.
    """
    from keras_attn.convert.bert import load_hf_bert_tokenizer
    from keras_attn.convert.bert import load_hf_xlm_roberta_tokenizer
    from keras_attn.convert.bpe import load_hf_bpe_tokenizer

    path = os.fspath(directory)
    if not os.path.isdir(path):
        raise ValueError(f"Invalid value for argument `directory`: {path} is not a directory. "
                         f"Received: directory={directory!r}")
    kind, found = _kind_of(path)
    if kind is None:
        found = "; ".join(found) or ("none of tokenizer.json, tokenizer_config.json, "
                                     "config.json, vocab.txt, vocab.json + merges.txt, "
                                     "sentencepiece.bpe.model")
        raise ValueError(
            f"{path} holds no tokenizer of a supported kind (WordPiece, byte-level BPE, "
            f"SentencePiece): found {found}. Received: directory={directory!r}")
    load = {WORDPIECE: load_hf_bert_tokenizer, BPE: load_hf_bpe_tokenizer,
            SENTENCEPIECE: load_hf_xlm_roberta_tokenizer}[kind]
    tokenizer = load(path, sequence_length=sequence_length)
    start, end, pad, separator, second = _form(path, kind, tokenizer, _names(path))
    tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id = start, end, pad
    tokenizer.pair_separator_ids, tokenizer.second_segment_id = separator, second
    file = os.path.abspath(os.path.join(path, "tokenizer.json"))
    tokenizer.hf_tokenizer_file = file if os.path.isfile(file) else None
    return tokenizer


__all__ = ["load_hf_tokenizer"]
