"""BERT and RoBERTa / XLM-R from a Hugging Face `BertModel` /
`BertFor...` / `RobertaModel` / `RobertaFor...` / `XLMRoberta...`
directory, with BERT's WordPiece tokenizer.

RoBERTa is BERT's encoder with its positions counted past the padding id
(`BertConfig.padding_id`), so both load into the BERT family's models; the
RoBERTa classification head's `dense` is the backbone's pooler
(`pooled_dense`: the same tanh layer on the first token).

The directory holds `config.json`, `model.safetensors` and `vocab.txt` or
`tokenizer.json` (`tokenizer_config.json` optional). The weights are read with NumPy and
`safetensors` only (neither torch nor transformers is needed); the tokenizer
is a `keras_hub.tokenizers.WordPieceTokenizer` (TensorFlow), imported only
when asked for.

Every tensor is checked against the shape the config implies before any
weight is assigned, and every tensor is used: a checkpoint that does not
match its config (a tensor of another shape, a layer more or less) or a
malformed file is a `ValueError` naming the file and the tensor or key, and
the model is never left half loaded. The task heads of `BertFor...`
checkpoints (`cls.*`, `classifier.*`, `qa_outputs.*`) are dropped by the
backbone loader, which names them in a warning.
"""

import base64
import binascii
import os
import warnings

from keras_attn._keras_compat import sublayers
from keras_attn.convert._checkpoint import refuse
from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import check_sizes
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import hf_class_names
from keras_attn.convert._checkpoint import hf_label_fields
from keras_attn.convert._checkpoint import json_text
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._registry import own_head
from keras_attn.convert._registry import Converter
from keras_attn.convert._registry import entry_helpers
from keras_attn.convert._registry import load_weights
from keras_attn.convert._registry import register
from keras_attn.convert._registry import write_weights
from keras_attn.models.bert import BertBackbone
from keras_attn.models.bert import BertConfig
from keras_attn.models.bert import BertPretrainer
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import BertTokenClassifier
from keras_attn.models.bert import build_bert


# Hugging Face's `hidden_act` names and the activations of keras_attn's
# BertConfig that compute the same function.
_FROM_HF_ACTIVATION = {
    "gelu": "gelu",  # exact (erf)
    "gelu_new": "gelu_approximate",  # tanh approximation
    "gelu_pytorch_tanh": "gelu_approximate",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_approximate": "gelu_pytorch_tanh", "relu": "relu",
                     "silu": "silu"}


def bert_config_from_hf(hf_config):
    """A `BertConfig` from the fields of a Hugging Face BERT `config.json`:
    `hf_config` is its dict, or the directory that holds it."""
    if isinstance(hf_config, (str, os.PathLike)):
        hf_config = read_config(hf_config)
    act = hf_config.get("hidden_act", "gelu")
    if act not in _FROM_HF_ACTIVATION:
        raise ValueError(
            f"config.json: 'hidden_act' must be one of {sorted(_FROM_HF_ACTIVATION)} "
            f"(the activations keras_attn's BERT computes). Received: hidden_act={act!r}"
        )
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":  # transformers 4's relative_key(_query): other logits
        raise ValueError(
            "config.json: only absolute (learned) position embeddings are computed. "
            f"Received: position_embedding_type={position!r}"
        )
    # A decoder (BertLMHeadModel, a causal RoBERTa) attends to earlier tokens
    # only, and a cross-attention block adds a sublayer: keras_attn's BERT is a
    # two-way encoder and would answer differently without an error.
    for key, meaning in (("is_decoder", "a causal (left-to-right) decoder"),
                         ("add_cross_attention", "blocks with cross-attention")):
        value = hf_config.get(key, False)
        if value is not False:
            raise ValueError(
                f"config.json: {key} makes {meaning}; keras_attn's BERT is a two-way "
                f"encoder and computes {key}=false only. Received: {key}={value!r}"
            )
    file = "config.json"
    model_type = hf_config.get("model_type", "bert")
    if model_type not in _MODEL_TYPES:
        raise ValueError(
            f"config.json: 'model_type' must be one of {sorted(_MODEL_TYPES)} (the BERT "
            f"family). Received: model_type={model_type!r}"
        )
    positions = config_int(hf_config, "max_position_embeddings", file, 512)
    padding_id = None
    if _MODEL_TYPES[model_type] == "roberta.":
        # RoBERTa's table holds the rows up to the padding id, then one row a token.
        padding_id = config_int(hf_config, "pad_token_id", file, 1)
        if padding_id < 0 or positions <= padding_id + 1:
            raise ValueError(
                f"config.json: a RoBERTa position table of max_position_embeddings="
                f"{positions} rows has no row past pad_token_id={padding_id}. "
                f"Received: pad_token_id={padding_id}, max_position_embeddings={positions}"
            )
        positions -= padding_id + 1
    return BertConfig(
        vocabulary_size=config_int(hf_config, "vocab_size", file),
        num_layers=config_int(hf_config, "num_hidden_layers", file),
        num_heads=config_int(hf_config, "num_attention_heads", file),
        hidden_dim=config_int(hf_config, "hidden_size", file),
        intermediate_dim=config_int(hf_config, "intermediate_size", file),
        dropout=config_float(hf_config, "hidden_dropout_prob", file, 0.1),
        attention_dropout=config_float(hf_config, "attention_probs_dropout_prob", file, 0.1),
        max_sequence_length=positions,
        num_segments=config_int(hf_config, "type_vocab_size", file, 2),
        layer_norm_epsilon=config_float(hf_config, "layer_norm_eps", file, 1e-12),
        activation=_FROM_HF_ACTIVATION[act],
        padding_id=padding_id,
    )


def _check_sizes(config, ckpt, path):
    """The config's sizes against the checkpoint's tensors, before the model
    is built (`check_sizes`)."""
    p = ckpt.prefix + "embeddings."
    layer = ckpt.prefix + "encoder.layer."
    V, D, F = config.vocabulary_size, config.hidden_dim, config.intermediate_dim
    hidden = (1, ("hidden_size", D))
    check_sizes(ckpt.tensors, path, [
        (p + "word_embeddings.weight", (V, D), dict([(0, ("vocab_size", V)), hidden])),
        (p + "position_embeddings.weight", (config.position_rows(), D),
         dict([(0, ("max_position_embeddings", config.position_rows())), hidden])),
        (p + "token_type_embeddings.weight", (config.num_segments, D),
         dict([(0, ("type_vocab_size", config.num_segments)), hidden])),
        (layer + "0.intermediate.dense.weight", (F, D),
         dict([(0, ("intermediate_size", F)), hidden])),
    ], [("num_hidden_layers", config.num_layers, layer)])


# The `model_type`s of the family and the prefix of their backbone inside a
# task model ("bert.encoder...", "roberta.encoder...").
_MODEL_TYPES = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta."}

# Task heads of BertFor* / RobertaFor* checkpoints, which a backbone has no
# place for, and buffers that hold no weight.
HEADS = ("cls.", "classifier.", "qa_outputs.", "lm_head.")
BUFFERS = tuple(prefix + "embeddings." + name for prefix in ("", "bert.", "roberta.")
                for name in ("position_ids", "token_type_ids"))


class _Checkpoint(Tensors):
    """`Tensors` of a BERT or RoBERTa directory: `prefix` is "bert." for
    BertFor* models and "roberta." for RobertaFor* ones (the layout adds
    it to the names it asks for), and the names of checkpoints converted
    from TensorFlow (LayerNorm gamma / beta) are accepted."""

    def __init__(self, tensors, path, model_type="bert"):
        super().__init__(tensors, path)
        family = _MODEL_TYPES.get(model_type, "bert.")
        self.prefix = family if any(k.startswith(family) for k in tensors) else ""

    def get(self, name, shape):
        if name not in self.tensors:
            legacy = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
            if legacy in self.tensors:
                name = legacy
        return super().get(name, shape)


def _backbone_layout(backbone, prefix, pooler=True):
    """The `Entry` of every backbone weight under Hugging Face's names
    (`prefix` "bert." inside a BertFor* model)."""
    config = backbone.bert_config
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    entries = []
    dense, norm, heads_in, heads_out = entry_helpers(entries, D, N)

    def table(layer, name, rows):
        (embeddings,) = layer_weights(layer, 1)
        entries.append(Entry(name + ".weight", (rows, D), embeddings))

    p = prefix + "embeddings."
    table(backbone.get_layer("token_embedding"), p + "word_embeddings", config.vocabulary_size)
    table(backbone.get_layer("segment_embedding"), p + "token_type_embeddings",
          config.num_segments)
    table(backbone.get_layer("position_embedding"), p + "position_embeddings",
          config.position_rows())
    norm(backbone.get_layer("embeddings_layer_norm"), p + "LayerNorm")
    for i in range(config.num_layers):
        hf = f"{prefix}encoder.layer.{i}."
        block = backbone.get_layer(f"transformer_block_{i}")
        attention = block.self_attention
        for name in ("query", "key", "value"):
            heads_in(_sublayer(attention, name), hf + f"attention.self.{name}")
        heads_out(_sublayer(attention, "attention_output"), hf + "attention.output.dense")
        norm(block.self_attention_layer_norm, hf + "attention.output.LayerNorm")
        dense(block.feed_forward.intermediate_dense, hf + "intermediate.dense", F, D)
        dense(block.feed_forward.output_dense, hf + "output.dense", D, F)
        norm(block.feed_forward_layer_norm, hf + "output.LayerNorm")
    if pooler:
        dense(backbone.get_layer("pooled_dense"), prefix + "pooler.dense", D, D)
    return entries, dense, norm


# The Hugging Face classes of each keras_attn BERT model (BERT's, RoBERTa's;
# None where transformers has none), and whether the checkpoint holds the
# backbone's pooler (the token classifiers and masked LMs have none; RoBERTa's
# sequence classifier holds it as `classifier.dense`). "BertMaskedLM" is a
# `BertPretrainer(next_sentence=False)`.
_ARCHITECTURES = {
    "BertBackbone": ("BertModel", "RobertaModel", True),
    "BertSequenceClassifier": ("BertForSequenceClassification",
                               "RobertaForSequenceClassification", True),
    "BertTokenClassifier": ("BertForTokenClassification", "RobertaForTokenClassification",
                            False),
    "BertPretrainer": ("BertForPreTraining", None, True),
    "BertMaskedLM": ("BertForMaskedLM", "RobertaForMaskedLM", False),
}
# XLM-R's classes have RoBERTa's layout (and model_type "xlm-roberta").
_XLM = {name: "XLM" + name for _, name, _ in _ARCHITECTURES.values() if name}


def _kind(model):
    """The key of `_ARCHITECTURES` for `model` (a subclass is its base's),
    None for a model of another kind."""
    if isinstance(model, BertPretrainer):
        return "BertPretrainer" if model.next_sentence else "BertMaskedLM"
    for kind in (BertBackbone, BertSequenceClassifier, BertTokenClassifier):
        if isinstance(model, kind):
            return kind.__name__
    return None


def _layout(model, prefix=None):
    """`(architecture, entries)` of a keras_attn BERT model: the backbone's
    entries and its task head's. A backbone with a `padding_id` is laid out
    as RoBERTa."""
    kind = _kind(model)
    if kind is None:
        raise ValueError(
            "`model` must be a BertBackbone (build_bert) or a BertSequenceClassifier, "
            f"BertTokenClassifier or BertPretrainer. Received: model={type(model).__name__}"
        )
    backbone = model if kind == "BertBackbone" else model.backbone
    config = backbone.bert_config
    roberta = config.padding_id is not None
    bert_name, roberta_name, pooler = _ARCHITECTURES[kind]
    architecture = roberta_name if roberta else bert_name
    if architecture is None:
        raise ValueError(
            "transformers' RoBERTa has no next-sentence head: a BertPretrainer of a "
            "RoBERTa backbone (padding_id set) is written with next_sentence=False, as "
            f"RobertaForMaskedLM. Received: padding_id={config.padding_id}, next_sentence=True"
        )
    if kind == "BertBackbone":
        return architecture, _backbone_layout(model, "", pooler)[0]
    if prefix is None:
        prefix = "roberta." if roberta else "bert."
    D = config.hidden_dim
    classifier_dense = roberta and kind == "BertSequenceClassifier"
    entries, dense, norm = _backbone_layout(backbone, prefix, pooler and not classifier_dense)
    if kind in ("BertPretrainer", "BertMaskedLM"):
        head = model.get_layer("mlm_head")
        # The decoder matrix is the token embedding table (tied in both).
        if roberta:
            if config.activation != "gelu":  # RobertaLMHead's is the exact GELU, always
                raise ValueError(
                    "transformers' RobertaLMHead applies the exact GELU whatever hidden_act "
                    "says; keras_attn's masked-LM head applies the backbone's activation. "
                    f"Received: activation={config.activation!r}"
                )
            dense(head.transform_dense, "lm_head.dense", D, D)
            norm(head.transform_layer_norm, "lm_head.layer_norm")
            entries.append(Entry("lm_head.bias", (config.vocabulary_size,), head.output_bias))
        else:
            dense(head.transform_dense, "cls.predictions.transform.dense", D, D)
            norm(head.transform_layer_norm, "cls.predictions.transform.LayerNorm")
            entries.append(Entry("cls.predictions.bias", (config.vocabulary_size,),
                                 head.output_bias))
        if kind == "BertPretrainer":
            dense(model.get_layer("nsp_dense"), "cls.seq_relationship", 2, D)
    elif classifier_dense:  # dense + tanh on the first token, then out_proj
        dense(backbone.get_layer("pooled_dense"), "classifier.dense", D, D)
        dense(model.get_layer("classifier"), "classifier.out_proj", model.num_classes, D)
    else:
        dense(model.get_layer("classifier"), "classifier", model.num_classes, D)
    return architecture, entries


def load_hf_bert_backbone(path, drop_heads=True):
    """A `BertBackbone` with the weights of a Hugging Face BERT directory
    (or a RoBERTa / XLM-R one: `model_type` "roberta" or "xlm-roberta").

    Args:
        path: directory with `config.json` and `model.safetensors` (or
            its shards: `read_safetensors`).
        drop_heads: skip the task heads of a `BertFor...` / `RobertaFor...`
            checkpoint (`cls.*`, `classifier.*`, `qa_outputs.*`,
            `lm_head.*`), naming them in a warning; False makes their
            presence an error.

    A checkpoint without a pooler (`BertForMaskedLM`,
    `BertForTokenClassification`, the RoBERTa task models) loads with the
    backbone's `pooled_dense` left as initialised, which a warning says:
    its `pooled_output` is then untrained (`sequence_output` is the
    checkpoint's).

    Returns:
        The `BertBackbone`; its `sequence_output` equals Hugging Face's
        `last_hidden_state` and `pooled_output` its `pooler_output`.

    Raises:
        ValueError: a malformed file, a tensor missing or of another shape
            than `config.json` implies, or a tensor the model has no place
            for (nothing is assigned then).
    """
    hf_config = read_config(path)
    config = bert_config_from_hf(hf_config)
    ckpt = _Checkpoint(read_safetensors(path), path, hf_config.get("model_type", "bert"))
    _check_sizes(config, ckpt, path)
    model = build_bert(config)
    pooler = ckpt.prefix + "pooler.dense.weight" in ckpt.tensors
    unread = [] if pooler else model.get_layer("pooled_dense").weights
    entries = _backbone_layout(model, ckpt.prefix, pooler)[0]
    dropped = load_weights(model, entries, ckpt, unread, BUFFERS, HEADS if drop_heads else ())
    file = ckpt.file
    if dropped:
        heads = sorted({".".join(k.split(".")[:2]) for k in dropped})
        warnings.warn(
            f"{file}: {len(dropped)} tensor(s) of task heads not loaded into the backbone: "
            f"{', '.join(heads)}",
            stacklevel=2,
        )
    if not pooler:
        warnings.warn(
            f"{file} has no pooler ({ckpt.prefix}pooler.dense): the backbone's pooled_dense "
            "stays as initialised, so its pooled_output is untrained (sequence_output is "
            "the checkpoint's)",
            stacklevel=2,
        )
    return model


def load_hf_bert_tokenizer(path, sequence_length=None, lowercase=None):
    """The WordPiece tokenizer of a Hugging Face BERT directory, with the
    ids of transformers 5's `BertTokenizer.from_pretrained(path)(text,
    add_special_tokens=False)`.

    Args:
        path: directory with `tokenizer.json` (what transformers 5's
            `save_pretrained` writes) or `vocab.txt` (transformers 4's
            layout; both: they must hold the same vocabulary), and
            optionally `tokenizer_config.json`.
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.
        lowercase: None reads `do_lower_case` from `tokenizer_config.json`,
            else `tokenizer.json`'s normaliser, else `config.json`; without
            any, a vocabulary with no upper-case letter means an uncased
            model.

    Returns:
        A `keras_hub.tokenizers.WordPieceTokenizer` that follows
        `BertTokenizer`'s options: `do_lower_case`, `strip_accents` (None:
        stripped when lower-casing), `tokenize_chinese_chars`, `unk_token`
        (and `tokenizer.json`'s `continuing_subword_prefix`). A blank line of
        `vocab.txt` is a token, as in transformers (the ids after it count
        it). It adds no `[CLS]` / `[SEP]`: a packer does. transformers 5
        ignores `never_split`, and so does this tokenizer. Where the ids can
        differ: a special token written in the text (`"[MASK]"`) is split
        into pieces, where transformers gives its id (put it in by id);
        lower-casing is keras-hub's Unicode case folding (NFKC: `"ﬁ"`,
        full-width letters, `"ß"` fold further than transformers'
        lower-casing); a space other than ASCII's (U+00A0, U+3000) joins
        words; a control or format character (U+200B) splits a word and
        U+FFFD stays in it, where transformers deletes both and keeps the
        word whole; a word is unknown past 100 UTF-8 bytes (transformers:
        100 characters).

    Raises:
        ValueError: neither file; a malformed file (the file, the entry and
            its value named: invalid JSON, an id that is not an integer, a
            token listed twice, a missing `model`); a setting keras-hub's
            tokenizer does not compute (another model, normaliser or
            pre-tokenizer, `clean_text` false, `max_input_chars_per_word`
            other than 100); special tokens the vocabulary does not hold or
            whose ids disagree; `tokenizer_config.json` and `tokenizer.json`
            that disagree.
    """
    from keras_attn.convert.wordpiece import wordpiece_tokenizer

    return wordpiece_tokenizer(path, sequence_length=sequence_length, lowercase=lowercase)


def load_hf_roberta_tokenizer(path, sequence_length=None):
    """The byte-level BPE tokenizer of a Hugging Face RoBERTa
    directory that holds `vocab.json` and `merges.txt` (RoBERTa's, GPT-2's
    format).

    Args:
        path: the directory (`tokenizer_config.json` optional: its
            `add_prefix_space` is read, default False as in
            `RobertaTokenizer`).
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.

    Returns:
        A `keras_hub.tokenizers.BytePairTokenizer` whose ids equal
        `transformers.RobertaTokenizer(...)(text, add_special_tokens=False)`;
        the special tokens of the vocabulary (`<s>`, `</s>`, `<pad>`,
        `<unk>`, `<mask>`) written in a text stay one token each. It adds no
        `<s>` / `</s>`: a packer does (`keras_hub.layers.StartEndPacker`).
        Words are split with GPT-2's pattern in eager calls as in
        `tf.data` (see `load_hf_bpe_tokenizer`).
        XLM-R's SentencePiece model (`sentencepiece.bpe.model`) is not this
        format (`load_hf_xlm_roberta_tokenizer` reads it): a directory
        without `vocab.json` and `merges.txt` is a `ValueError`.
    """
    from keras_attn.convert.bpe import tokenizer_from_vocab_and_merges

    return tokenizer_from_vocab_and_merges(path, sequence_length)


_XLM_SENTENCEPIECE = "sentencepiece.bpe.model"
# fairseq's dictionary puts <s> <pad> </s> <unk> first and the SentencePiece
# pieces after them, one id on: keras-hub's tokenizer does the same shift for
# a model whose first three pieces are these.
_XLM_FIRST_PIECES = ["<unk>", "<s>", "</s>"]



def _sentencepiece_from_unigram(file):
    """The serialised SentencePiece model of XLM-R's `tokenizer.json` (a
    Unigram model in fairseq's id order, SentencePiece's precompiled
    normaliser, whitespace split and a `▁` before each word), so that
    keras-hub's tokenizer reads it; anything else is refused by name."""
    from sentencepiece import sentencepiece_model_pb2 as spm_model

    spec = read_config(os.path.dirname(file), os.path.basename(file))
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    if model.get("type") != "Unigram":
        refuse(file, "model.type", model.get("type"),
                    "XLM-R's tokenizer.json holds a Unigram model")
    if model.get("byte_fallback"):
        refuse(file, "model.byte_fallback", True,
                    "keras-hub's XLM-R tokenizer has no byte fallback")
    vocab = model.get("vocab") or []
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    if [entry[0] for entry in vocab[:4]] != specials or vocab[-1][0] != "<mask>":
        pieces = [entry[0] for entry in vocab[:4]] + ["...", vocab[-1][0] if vocab else None]
        refuse(file, "model.vocab", pieces,
                    f"XLM-R's pieces follow {specials} and end with <mask>")
    if model.get("unk_id") != 3:
        refuse(file, "model.unk_id", model.get("unk_id"), "XLM-R's <unk> is id 3")
    extra = [t.get("content") for t in spec.get("added_tokens") or []
             if t.get("content") not in specials + ["<mask>"]]
    if extra:
        refuse(file, "added_tokens", extra,
                    "keras-hub's XLM-R tokenizer has only <s> <pad> </s> <unk> <mask>")
    normalizer = spec.get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "Precompiled":
        refuse(file, "normalizer", normalizer,
                    "SentencePiece's precompiled normaliser is read, nothing else")
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                 "split": True}
    expected = {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]}
    if spec.get("pre_tokenizer") != expected:
        refuse(file, "pre_tokenizer", spec.get("pre_tokenizer"),
                    f"SentencePiece splits as {expected} only")
    proto = spm_model.ModelProto()
    proto.trainer_spec.model_type = spm_model.TrainerSpec.UNIGRAM
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id = 0, 1
    proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = 2, -1
    piece = spm_model.ModelProto.SentencePiece
    for text, score, kind in ([("<unk>", 0.0, piece.UNKNOWN), ("<s>", 0.0, piece.CONTROL),
                               ("</s>", 0.0, piece.CONTROL)]
                              + [(text, score, piece.NORMAL) for text, score in vocab[4:-1]]):
        entry = proto.pieces.add()
        entry.piece, entry.score, entry.type = text, score, kind
    try:
        charsmap = base64.b64decode(normalizer.get("precompiled_charsmap") or "", validate=True)
    except (binascii.Error, TypeError):
        refuse(file, "normalizer.precompiled_charsmap", "(not base64)",
                    "the precompiled normaliser is SentencePiece's, in base64")
    proto.normalizer_spec.name = "nmt_nfkc"
    proto.normalizer_spec.precompiled_charsmap = charsmap
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = True
    proto.normalizer_spec.escape_whitespaces = True
    return proto.SerializeToString()


def load_hf_xlm_roberta_tokenizer(path, sequence_length=None):
    """The SentencePiece tokenizer of a Hugging Face XLM-R directory as
    keras-hub's `XLMRobertaTokenizer`: from its `sentencepiece.bpe.model`
    (the checkpoints', e.g. `xlm-roberta-base`'s, beside `tokenizer.json`),
    else from `tokenizer.json` alone (what transformers 5's
    `XLMRobertaTokenizer.save_pretrained` writes: the same Unigram pieces
    and scores and SentencePiece's normaliser, from which the SentencePiece
    model is rebuilt).

    Args:
        path: the directory.
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.

    Returns:
        A `keras_hub.models.XLMRobertaTokenizer` whose ids equal
        `transformers.XLMRobertaTokenizer.from_pretrained(path)(text,
        add_special_tokens=False)`: fairseq's order (`<s>` 0, `<pad>` 1,
        `</s>` 2, `<unk>` 3, the model's pieces from 4, `<mask>` last,
        `tokenizer.mask_token_id`). It adds no `<s>` / `</s>`: a packer does
        (`keras_hub.layers.StartEndPacker`). Where the ids differ: a special
        token written in the text (`"<mask>"`) is split into pieces, where
        transformers gives its id; put masks in by id. XLM-R's released
        model is a Unigram one (whatever its file's name says); transformers
        5 reads any SentencePiece file as Unigram (its pieces' scores), the
        SentencePiece model keeps its own kind: a BPE-kind file can give
        other ids for some words.

    Raises:
        ValueError: the directory has neither file (both named with the
            directory); a `sentencepiece.bpe.model` that is not a
            SentencePiece model or whose first pieces are not `<unk>`, `<s>`,
            `</s>` (the order keras-hub's id shift assumes); a
            `tokenizer.json` that is not XLM-R's as transformers writes it
            (the key and the value named: another model than Unigram, byte
            fallback, another normaliser or pre-tokenizer, special tokens
            out of fairseq's order, added tokens beyond the five); or
            `tokenizer_config.json`'s `add_prefix_space` false
            (SentencePiece always puts a space before the text).

    Example:

        tokenizer = load_hf_xlm_roberta_tokenizer("path/to/xlm-roberta-base")
        ids = tokenizer("The cat sat.")
    """
    import keras_hub
    import sentencepiece

    path = os.fspath(path)
    file = os.path.join(path, _XLM_SENTENCEPIECE)
    if not os.path.exists(file) and not os.path.exists(os.path.join(path, "tokenizer.json")):
        raise ValueError(
            f"{file} does not exist, nor does tokenizer.json: XLM-R's tokenizer is read from "
            f"its SentencePiece model or the tokenizers library's file. Received: path={path!r}"
        )
    settings_file = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(settings_file):
        value = read_config(path, "tokenizer_config.json").get("add_prefix_space", True)
        if value is not True:
            raise ValueError(
                f"{settings_file}: SentencePiece always puts a space before the text; "
                f"add_prefix_space must be true. Received: add_prefix_space={value!r}"
            )
    if os.path.exists(file):
        with open(file, "rb") as stream:
            proto = stream.read()
    else:
        file = os.path.join(path, "tokenizer.json")
        proto = _sentencepiece_from_unigram(file)
    try:
        model = sentencepiece.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as error:
        raise ValueError(f"{file} is not a SentencePiece model: {error}") from None
    first = [model.id_to_piece(i) for i in range(min(3, model.get_piece_size()))]
    if first != _XLM_FIRST_PIECES:
        raise ValueError(
            f"{file}: XLM-R's ids are the SentencePiece model's shifted past fairseq's "
            f"specials, for a model whose first pieces are {_XLM_FIRST_PIECES}. "
            f"Received: first pieces {first}"
        )
    return keras_hub.models.XLMRobertaTokenizer(proto=proto, sequence_length=sequence_length)


def load_hf_bert(path, sequence_length=None):
    """`(backbone, tokenizer)` from a Hugging Face BERT directory; see
    `load_hf_bert_backbone` and `load_hf_bert_tokenizer`."""
    return load_hf_bert_backbone(path), load_hf_bert_tokenizer(path, sequence_length)


def load_hf_bert_task(path):
    """The keras_attn model of a Hugging Face BERT, RoBERTa or XLM-R
    directory, task head included, chosen by `architectures` in its
    `config.json`:

    | `architectures` | keras_attn model |
    |---|---|
    | `BertModel`, `RobertaModel` | `BertBackbone` |
    | `BertForSequenceClassification`, `RobertaForSequenceClassification` | `BertSequenceClassifier` (RoBERTa's `classifier.dense` is the backbone's `pooled_dense`, its `out_proj` the `classifier`) |
    | `BertForTokenClassification`, `RobertaForTokenClassification` | `BertTokenClassifier` (its pooler stays as initialised: the task does not use it) |
    | `BertForPreTraining` | `BertPretrainer` |
    | `BertForMaskedLM`, `RobertaForMaskedLM` | `BertPretrainer(next_sentence=False)` (pooler as initialised) |

    and the `XLMRoberta...` classes as their `Roberta...` ones. Every tensor
    must be used and have the shape the config implies (`ValueError`
    otherwise, before any weight is assigned). A classifier's `class_names`
    are the names of `id2label` (None for transformers' defaults
    `LABEL_i`); a label map that does not fit the head is a `ValueError`
    naming config.json, the key and the value (`hf_class_names`).
    `save_hf_bert` writes such directories, the names included.
    """
    hf_config = read_config(path)
    model_type = hf_config.get("model_type", "bert")
    default = "RobertaModel" if _MODEL_TYPES.get(model_type) == "roberta." else "BertModel"
    architectures = hf_config.get("architectures") or [default]
    architecture = architectures[0] if isinstance(architectures, list) else architectures
    known = {}
    for kind, (bert_name, roberta_name, _) in _ARCHITECTURES.items():
        for name in (bert_name, roberta_name, _XLM.get(roberta_name)):
            if name:
                known[name] = kind
    if architecture not in known:
        raise ValueError(
            f"{os.path.join(path, 'config.json')}: 'architectures' must be one of "
            f"{sorted(known)}. Received: architectures={architectures!r}"
        )
    config = bert_config_from_hf(hf_config)
    if (config.padding_id is not None) != architecture.startswith(("Roberta", "XLMRoberta")):
        raise ValueError(
            f"{os.path.join(path, 'config.json')}: architecture {architecture!r} does not "
            f"go with model_type={model_type!r}. Received: architectures={architectures!r}"
        )
    ckpt = _Checkpoint(read_safetensors(path), path, model_type)
    _check_sizes(config, ckpt, path)
    backbone = build_bert(config)
    kind = known[architecture]
    if kind == "BertBackbone":
        model = backbone
    elif kind in ("BertPretrainer", "BertMaskedLM"):
        model = BertPretrainer(backbone, next_sentence=kind == "BertPretrainer")
    else:
        num_classes, class_names = hf_class_names(hf_config, os.path.join(path, "config.json"))
        dropout = hf_config.get("classifier_dropout")
        if dropout is None:
            dropout = config.dropout
        task = BertSequenceClassifier if kind == "BertSequenceClassifier" else BertTokenClassifier
        model = task(backbone, num_classes=num_classes, dropout=dropout,
                     class_names=class_names)
    # The pooler of a token classifier or a masked LM is not in its checkpoint.
    unread = [] if _ARCHITECTURES[kind][2] else backbone.get_layer("pooled_dense").weights
    load_weights(model, _layout(model, ckpt.prefix)[1], ckpt, unread, BUFFERS)
    return model


def load_hf_roberta(path):
    """The keras_attn model of a Hugging Face RoBERTa or XLM-R directory
    (`RobertaModel`, `RobertaForMaskedLM`, `RobertaForSequenceClassification`,
    `RobertaForTokenClassification`, or the `XLMRoberta...` of each), task
    head included: `load_hf_bert_task` for the RoBERTa family, which
    refuses any other `model_type`.

    The backbone is a `BertBackbone` with `padding_id` (RoBERTa's `<pad>`,
    1): its positions are counted over the tokens that are not padding, as
    `RobertaEmbeddings` counts them, so `padding_mask` is `token_ids !=
    padding_id` and `segment_ids` all 0. The outputs equal transformers'
    (`last_hidden_state`, `pooler_output`, `logits`). One difference is in
    training only: RoBERTa's classification head also drops out the first
    token's vector before its `dense`; `BertSequenceClassifier` applies its
    dropout after the pooler (`dense`) alone.

    Example (`RobertaForSequenceClassification.save_pretrained(path)` before):

        model = load_hf_roberta(path)                      # BertSequenceClassifier
        logits = model({"token_ids": ids, "segment_ids": 0 * ids,
                        "padding_mask": ids != 1})
    """
    model_type = read_config(path).get("model_type")
    if _MODEL_TYPES.get(model_type) != "roberta.":
        raise ValueError(
            f"{os.path.join(path, 'config.json')} is not a RoBERTa or XLM-R directory "
            f"(load_hf_bert_task or load_hf reads it). Received: model_type={model_type!r}"
        )
    return load_hf_bert_task(path)


def save_hf_bert(model, directory, tokenizer=None, overwrite=False, class_names=None):
    """Writes a keras_attn BERT model as a Hugging Face directory.

    `config.json` and `model.safetensors` (float32), and, given a
    `tokenizer`, `vocab.txt` and `tokenizer_config.json`:
    `transformers.AutoModel.from_pretrained(directory)` (or the class named
    below) loads it with no missing or unexpected key, and its outputs equal
    the Keras model's.

    | keras_attn model | written as |
    |---|---|
    | `BertBackbone` | `BertModel` |
    | `BertSequenceClassifier` | `BertForSequenceClassification` |
    | `BertTokenClassifier` | `BertForTokenClassification` (no pooler) |
    | `BertPretrainer` | `BertForPreTraining` (decoder tied to the embeddings) |
    | `BertPretrainer(next_sentence=False)` | `BertForMaskedLM` |

    A RoBERTa model (its backbone has a `padding_id`) is written as the
    `Roberta...` class of each (`RobertaModel`, `RobertaForSequenceClassification`,
    `RobertaForTokenClassification`, `RobertaForMaskedLM`; a
    `BertPretrainer` only with `next_sentence=False`), without a tokenizer.

    Args:
        model: one of the models above, float (not quantized) and without
            LoRA adapters (`keras_attn.models.merge_lora` folds them in).
        directory: where to write; created, or replaced when `overwrite`.
            Written atomically (a new directory takes its place at the end).
        tokenizer: optional `keras_hub.tokenizers.WordPieceTokenizer`
            (`load_hf_bert_tokenizer`'s): its vocabulary, case, accent and
            Chinese-character handling and unknown token are written for
            `transformers.BertTokenizer` (one that continues words other
            than with `##` is refused).
        overwrite: replace an existing non-empty `directory` that holds an
            earlier Hugging Face export (any other directory is refused).
        class_names: a classifier's class names, in output order, written
            as `id2label` (and its inverse `label2id`); default: the
            model's `class_names`, else `LABEL_0`, `LABEL_1`, ...

    Returns:
        The absolute path of `directory`.

    Raises:
        ValueError: another model type, a quantized or LoRA-adapted layer, a
            tokenizer whose vocabulary size is not the model's,
            `class_names` that are not the classifier's (or for a model
            without classes), or an existing non-empty directory without
            `overwrite` (nothing is written then).
    """
    architecture, entries = _layout(model)
    backbone = model if isinstance(model, BertBackbone) else model.backbone
    config = backbone.bert_config
    roberta = config.padding_id is not None
    if roberta and tokenizer is not None:
        raise ValueError(
            "save_hf_bert writes BERT's WordPiece vocabulary; a RoBERTa model's byte-level "
            "BPE tokenizer is not written. Received: a tokenizer with padding_id="
            f"{config.padding_id}"
        )
    if config.activation not in _TO_HF_ACTIVATION:
        raise ValueError(
            f"transformers' BERT has no activation {config.activation!r}; it takes "
            f"{sorted(_TO_HF_ACTIVATION)} from keras_attn. "
            f"Received: activation={config.activation!r}"
        )
    hf_config = {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.hidden_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_dim,
        "hidden_act": _TO_HF_ACTIVATION[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.position_rows(),
        "type_vocab_size": config.num_segments,
        "layer_norm_eps": config.layer_norm_epsilon,
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    if roberta:  # positions past the padding id (bos/eos: RoBERTa's <s> and </s>)
        hf_config.update(model_type="roberta", pad_token_id=config.padding_id,
                         bos_token_id=0, eos_token_id=2)
    hf_config.update(hf_label_fields(getattr(model, "num_classes", None),
                                     getattr(model, "class_names", None), class_names))
    if hasattr(model, "num_classes"):
        hf_config["classifier_dropout"] = model.dropout
    files = {"config.json": json_text(hf_config)}
    if tokenizer is not None:
        files.update(_tokenizer_files(tokenizer, config))
    return write_weights(directory, entries, files, overwrite=overwrite)


def _tokenizer_files(tokenizer, config):
    vocabulary = list(tokenizer.get_vocabulary())
    if len(vocabulary) != config.vocabulary_size:
        raise ValueError(
            f"`tokenizer` has {len(vocabulary)} tokens but the model's vocabulary_size is "
            f"{config.vocabulary_size}. Received: tokenizer vocabulary of {len(vocabulary)}"
        )
    lowercase = bool(tokenizer.lowercase)
    settings = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "model_max_length": config.max_sequence_length,
    }
    if bool(tokenizer.strip_accents) != lowercase:  # BertTokenizer's default follows the case
        settings["strip_accents"] = bool(tokenizer.strip_accents)
    if not tokenizer.split_on_cjk:
        settings["tokenize_chinese_chars"] = False
    if tokenizer.oov_token != "[UNK]":
        settings["unk_token"] = tokenizer.oov_token
    if tokenizer.suffix_indicator != "##":  # vocab.txt's WordPiece continues words with "##"
        raise ValueError(
            "Invalid value for argument `tokenizer`: BertTokenizer's vocab.txt continues words "
            "with '##' only. Received: tokenizer.suffix_indicator="
            f"{tokenizer.suffix_indicator!r}")
    return {"vocab.txt": "\n".join(vocabulary) + "\n",
            "tokenizer_config.json": json_text(settings)}


def _sublayer(layer, name):
    for sub in sublayers(layer, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")


def _architectures():
    """Every `architectures` name `load_hf_bert_task` reads."""
    names = [n for bert, roberta, _ in _ARCHITECTURES.values() for n in (bert, roberta) if n]
    return tuple(names) + tuple(_XLM.values())


def load_hf_bert_classifier(path, num_classes, class_names=None):
    """`load_hf(path, num_classes=...)` for the BERT family: a
    `BertSequenceClassifier` over the encoder of any BERT, RoBERTa or XLM-R
    directory (`load_hf_bert_task`), the checkpoint's own head where it is a
    sequence classifier of `num_classes`, else a new one (dropout
    `classifier_dropout`, else the encoder's; the pooler as the checkpoint
    has it, initialised where it has none: a masked LM or token classifier)."""
    model = load_hf_bert_task(path)
    if own_head(model, BertSequenceClassifier, path, num_classes, class_names) is not None:
        return model
    backbone = model if isinstance(model, BertBackbone) else model.backbone
    dropout = read_config(path).get("classifier_dropout")
    if dropout is None:
        dropout = backbone.bert_config.dropout
    return BertSequenceClassifier(backbone, num_classes=num_classes, dropout=dropout,
                                  class_names=class_names)


CONVERTER = register(Converter(
    "bert", _architectures(), tuple(_MODEL_TYPES), load=load_hf_bert_task,
    save=save_hf_bert, writes=lambda model: _kind(model) is not None,
    models=("BertBackbone", "BertSequenceClassifier", "BertTokenClassifier",
            "BertPretrainer (RoBERTa included)"), classifier=load_hf_bert_classifier))

__all__ = [
    "bert_config_from_hf",
    "load_hf_bert",
    "load_hf_bert_backbone",
    "load_hf_bert_task",
    "load_hf_bert_tokenizer",
    "load_hf_roberta",
    "load_hf_roberta_tokenizer",
    "load_hf_xlm_roberta_tokenizer",
    "save_hf_bert",
]
