"""Export a text classifier (BERT's, RoBERTa's, XLM-R's, ModernBERT's) with
its tokenizer: raw strings in, class probabilities and names out.

- `serve(text)`: a `(B,)` string tensor in; tokenization and packing
  (`[CLS] text [SEP]`, RoBERTa's `<s> text </s>`) run inside the graph;
  class probabilities `(B, K)` out. `serving_default` (TensorFlow Serving's)
  takes the same strings and answers by name: "logits", "probabilities" and,
  exported with `class_names`, "label" (the top class's name).
- `serve_ids(token_ids, segment_ids, padding_mask)` (a model without
  segment ids, ModernBERT's, RoBERTa's classifier: `serve_ids(token_ids,
  padding_mask)`): `(B, T)` int32 each, any `T` up to the model's
  `max_sequence_length`; probabilities out. Inputs of different shapes stop
  the call with `InvalidArgumentError` naming them (a loaded SavedModel
  raises TensorFlow's errors, not Python's).

A WordPiece tokenizer runs as core TensorFlow ops (`_wordpiece_graph`: the
same ids as keras-hub's `WordPieceTokenizer`, rebuilt without
tensorflow-text), so a serving process needs TensorFlow alone. A byte-level
BPE or SentencePiece tokenizer (`keras_attn.convert.load_hf_tokenizer`'s,
for RoBERTa, ModernBERT, XLM-R) runs as keras-hub's, whose ops are
tensorflow-text's: `import tensorflow_text` before `tf.saved_model.load`.
Those exports carry the checkpoint's `tokenizer.json` (`assets/` of the
SavedModel, beside an ONNX or LiteRT model), so that a server without
TensorFlow tokenizes with the `tokenizers` package
(`keras_attn.export.TextClassifierArtifact`). TensorFlow backend only (the
string signature needs TensorFlow ops).
"""

from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import named_outputs
from keras_attn.export.saved_model import require_tensorflow_backend
from keras_attn._base.quiet_tensorflow import tensorflow_module

# The inputs of the classifiers this exports: BERT's, ModernBERT's.
INPUT_NAMES = (("token_ids", "segment_ids", "padding_mask"), ("token_ids", "padding_mask"))


def export_text_classifier(model, tokenizer, path, sequence_length=128, format="saved_model",
                           precision="float32", class_names=None):
    """Writes `model` with its tokenizer to `path` (atomically).

    ONNX and LiteRT cannot hold the tokenizer's string ops: with
    `format="onnx"` or `"litert"` the artifact takes the token ids
    ("token_ids", "segment_ids", "padding_mask": int32 `(B, T)`, any batch,
    any `T` up to `max_sequence_length`) and returns "probabilities"; the
    directory also holds `vocab.txt` and, in `serving.json`, the
    pre-processing a server must reproduce (keras-hub's
    `WordPieceTokenizer(vocabulary="vocab.txt", lowercase=..., strip_accents=...)`,
    then `[CLS] text [SEP]` padded with `[PAD]` to `sequence_length`,
    segment ids 0, padding mask 1 for every token that is not `[PAD]`).

    Args:
        model: a `BertSequenceClassifier` (or any model from the three BERT
            inputs to `(B, K)` logits), or a `ModernBertSequenceClassifier`
            (from `token_ids` and `padding_mask`: no segment ids in or out).
        tokenizer: the `keras_hub.tokenizers.WordPieceTokenizer` of its
            vocabulary (`[PAD]`, `[CLS]` and `[SEP]` in the vocabulary).
        path: the SavedModel directory.
        sequence_length: length strings are packed (padded or truncated) to.
        format: `"saved_model"`, `"onnx"` or `"litert"`.
        precision: `"float32"`, `"float16"` (weights) or `"int8"` (dynamic-range:
            int8 weights; ONNX through onnxruntime's `quantize_dynamic`).
        class_names: the name of each class, in output order (K strings),
            carried inside the export: `assets/labels.txt` of the SavedModel
            (line i names probability i), `"labels"` of `serving.json`.

    Returns:
        `path`.
    """
    from keras_attn.export.portable import check_class_names
    from keras_attn.export.portable import check_format
    from keras_attn.export.portable import labels_text

    check_format(format, precision)
    require_tensorflow_backend("export_text_classifier")
    tf = tensorflow_module()

    from keras_attn.export._wordpiece_graph import WordPieceGraph

    inputs = model.input if isinstance(model.input, dict) else {}
    names = next((names for names in INPUT_NAMES if set(inputs) == set(names)), None)
    if names is None:
        raise ValueError(
            "The model must take a dict of the BERT inputs token_ids, "
            "segment_ids and padding_mask (ModernBERT's: token_ids and padding_mask). "
            f"Received: model.input={model.input!r}"
        )
    max_length = _max_length(model)
    if max_length is not None and sequence_length > max_length:
        raise ValueError(
            f"`sequence_length` must be at most the model's max_sequence_length="
            f"{max_length}. Received: sequence_length={sequence_length}"
        )
    tokenizer_json = _check_tokenizer(tokenizer)
    class_names = check_class_names(class_names, model.output_shape[-1])
    if format != "saved_model":
        return _export_portable(model, tokenizer, path, sequence_length, format, precision,
                                class_names, names, tokenizer_json)
    text_spec = tf.TensorSpec((None,), tf.string, name="text")
    if _is_wordpiece(tokenizer):
        wordpiece = WordPieceGraph(tokenizer)
        track = [wordpiece]
        # Traced once here, checked, and called as this one function by every
        # trace of the endpoint.
        pack = tf.function(_single_text_packer(wordpiece, tokenizer, sequence_length),
                           input_signature=[text_spec], autograph=False)  # see traced_as_written
        check_core_ops(pack.get_concrete_function())
    else:
        # keras-hub's tokenizer in the graph (tensorflow-text's ops), packed
        # as the text loaders pack a single text.
        from keras_attn._text_packing import pack_pairs

        track = [tokenizer]
        pack = tf.function(pack_pairs(tokenizer, sequence_length),
                           input_signature=[text_spec], autograph=False)

    def model_inputs(text):
        return {name: value for name, value in zip(INPUT_NAMES[0], pack(text))
                if name in names}

    def probabilities(inputs):
        logits = model(inputs, training=False)
        return tf.nn.softmax(tf.cast(logits, "float32"), axis=-1)

    def serve_text(text):
        return probabilities(model_inputs(text))

    def named(text):
        return named_outputs(model(model_inputs(text), training=False), class_names)

    def checked_ids(inputs):
        # Checked here, not inside the model: there the mismatch is an
        # "Incompatible shapes" of an Add deep in the embeddings.
        token_ids = inputs["token_ids"]
        checks = [tf.debugging.assert_equal(
            tf.shape(other), tf.shape(token_ids),
            message=f"keras_attn: `{name}` must have the shape (B, T) of `token_ids`")
            for name, other in inputs.items() if name != "token_ids"]
        with tf.control_dependencies(checks):
            return probabilities(dict(inputs, token_ids=tf.identity(token_ids)))

    if len(names) == 3:
        def serve_ids(token_ids, segment_ids, padding_mask):
            return checked_ids({"token_ids": token_ids, "segment_ids": segment_ids,
                                "padding_mask": padding_mask})
    else:
        def serve_ids(token_ids, padding_mask):
            return checked_ids({"token_ids": token_ids, "padding_mask": padding_mask})

    ids_spec = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
    return export_saved_model(
        model,
        path,
        input_signature=[text_spec],
        serving_fn=serve_text,
        extra_endpoints={"serve_ids": (serve_ids, ids_spec),
                         "serving_default": (named, [text_spec])},
        track=track,
        assets={**({"labels.txt": labels_text(class_names)} if class_names else {}),
                **({"tokenizer.json": tokenizer_json} if tokenizer_json else {})},
    )


def _check_tokenizer(tokenizer):
    """The text of the `tokenizer.json` that
    `keras_attn.convert.load_hf_tokenizer` read the tokenizer beside, which
    the export carries (a byte-level BPE or SentencePiece tokenizer cannot
    be described by settings); None for a keras-hub `WordPieceTokenizer`
    without one (the zoo's: the graph rebuilds it; a server reads
    `vocab.txt` and the settings). Anything else is refused by name, before
    any work."""
    import keras_hub

    file = getattr(tokenizer, "hf_tokenizer_file", None)
    if isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        return _read(file) if file else None
    kinds = (keras_hub.tokenizers.BytePairTokenizer, keras_hub.tokenizers.SentencePieceTokenizer)
    if not isinstance(tokenizer, kinds) or not file:
        raise ValueError(
            "`tokenizer` must be a keras_hub.tokenizers.WordPieceTokenizer (BERT's, the zoo's), "
            "or the tokenizer keras_attn.convert.load_hf_tokenizer(directory) reads from a "
            "Hugging Face directory with a tokenizer.json (RoBERTa's, ModernBERT's, XLM-R's: "
            "the export carries that file for the server). A directory with only vocab.json "
            "and merges.txt or a SentencePiece model gets its tokenizer.json from "
            "transformers: AutoTokenizer.from_pretrained(directory).save_pretrained(directory). "
            f"Received: tokenizer={type(tokenizer).__name__}"
            + (" without hf_tokenizer_file" if isinstance(tokenizer, kinds) else ""))
    return _read(file)


def _is_wordpiece(tokenizer):
    import keras_hub

    return isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer)


def _read(file):
    with open(file, encoding="utf-8") as stream:
        return stream.read()


def _single_text_packer(wordpiece, tokenizer, sequence_length):
    """`text (B,) -> (token_ids, segment_ids, padding_mask)`, each
    `(B, sequence_length)` int32: what `keras_attn.data.text.pack_pairs`
    gives one segment (keras-hub's `MultiSegmentPacker`: `[CLS] text [SEP]`,
    the text truncated to `sequence_length - 2` tokens, `[PAD]` after), in
    core TensorFlow ops."""
    tf = tensorflow_module()

    cls, sep, pad = (int(tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]", "[PAD]"))

    def pack(text):
        tokens = wordpiece(text)[:, : sequence_length - 2]
        column = tf.ones([tf.shape(text)[0], 1], tf.int32)
        packed = tf.concat([tf.RaggedTensor.from_tensor(column * cls), tokens,
                            tf.RaggedTensor.from_tensor(column * sep)], axis=1)
        token_ids = packed.to_tensor(pad, shape=[None, sequence_length])
        return token_ids, tf.zeros_like(token_ids), tf.cast(token_ids != pad, tf.int32)

    return pack


def check_core_ops(concrete_function):
    """Raises `RuntimeError` naming the ops of `concrete_function` (its
    nested functions included) that core TensorFlow lacks: ops a serving
    process would have to load from another library (tensorflow-text's).
    Core ops are those of `tf.raw_ops`; tensorflow-text's are not there
    even when it is imported."""
    tf = tensorflow_module()

    graph = concrete_function.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    missing = sorted(op for op in ops
                     if not hasattr(tf.raw_ops, op) and op not in _graph_functions(graph))
    if missing:
        raise RuntimeError(
            f"The exported text graph would use ops that core TensorFlow lacks: {missing}; "
            "a serving process with TensorFlow alone could not load it."
        )


def _graph_functions(graph_def):
    """The names of the functions a GraphDef defines (a call names one as
    its op)."""
    return {function.signature.name for function in graph_def.library.function}


def _export_portable(model, tokenizer, path, sequence_length, format, precision,
                     class_names=None, names=None, tokenizer_json=None):
    import keras

    from keras_attn._text_packing import text_form
    from keras_attn.export.portable import export_portable

    names = names or INPUT_NAMES[0]
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
    logits = model(inputs, training=False)
    probabilities = keras.ops.softmax(keras.ops.cast(logits, "float32"), axis=-1)
    serving = keras.Model([inputs[name] for name in names], {"probabilities": probabilities},
                          name="text_classifier_serving")
    start, end, pad, _, _ = text_form(tokenizer)
    files = {}
    if _is_wordpiece(tokenizer):
        vocabulary = list(tokenizer.get_vocabulary())
        files["vocab.txt"] = "".join(token + "\n" for token in vocabulary)
        preprocessing = {
            "tokenizer": "WordPiece (keras_hub.tokenizers.WordPieceTokenizer)",
            "vocabulary": "vocab.txt",
            "lowercase": bool(tokenizer.lowercase),
            "strip_accents": bool(tokenizer.strip_accents),
            "suffix_indicator": tokenizer.suffix_indicator,
            "oov_token": tokenizer.oov_token,
        }
        if tokenizer_json is None:
            tokenizer_json = _wordpiece_json(tokenizer, vocabulary)
    else:
        preprocessing = {"tokenizer": f"{_kind(tokenizer)} (tokenizer.json of the Hugging Face "
                                      "checkpoint: tokenizers.Tokenizer.from_file)"}
    if tokenizer_json is not None:
        files["tokenizer.json"] = tokenizer_json
        preprocessing["tokenizer_file"] = "tokenizer.json"
    preprocessing.update({
        "packing": "start_id, the text's ids (without special tokens) truncated to "
                   "sequence_length - 2, end_id; padded with pad_id to sequence_length",
        "sequence_length": int(sequence_length),
        "max_sequence_length": _max_length(model),
        "start_id": start,
        "end_id": end,
        "pad_id": pad,
        "segment_ids": "0 for every token of a single text",
        "padding_mask": "1 for the packed tokens, 0 for the padding",
    })
    if "segment_ids" not in names:
        del preprocessing["segment_ids"]
    return export_portable(serving, path, format, precision, preprocessing=preprocessing,
                           files=files, axes={name: ["batch", "length"] for name in names},
                           extra=class_names and {"labels": class_names})


# Texts on which the `tokenizers` rebuild of a WordPiece tokenizer must
# give keras-hub's ids: case, accents, punctuation, CJK, controls, no-break
# and other Unicode spaces, compatibility characters, folds that differ
# from lowercase (ß, final sigma, ligatures).
PROBES = ("The quick brown fox, jumps!", "Café naïve RÉSUMÉ e\u0301te\u0301", "don't-stop!now",
          "中文字 and 日本語 한국어", "tabs\tand\nnew\rlines", "Straße ﬁne ﬀ Σίσυφος ΣΑΣ",
          "İstanbul Ǆ ＦＵＬＬ ①½™Ⅻ", "a\u0000b soft\u00adhy zero\u200bw", "\u3000x\u00a0y",
          "émoji 🙂 مَرحَبًا", "", "   ")


def _wordpiece_json(tokenizer, vocabulary):
    """The `tokenizer.json` of a WordPiece tokenizer with no checkpoint
    file (the zoo's), rebuilt for `tokenizers`; None, with a warning, where
    the rebuild does not give keras-hub's ids on `PROBES` plus the
    vocabulary's own tokens (`TextClassifierArtifact` then refuses the
    export: `vocab.txt` and the settings still describe it)."""
    import warnings

    import numpy as np
    from tokenizers import Tokenizer

    from keras_attn.export.text_runtime import wordpiece_tokenizer_json

    text = wordpiece_tokenizer_json(vocabulary, tokenizer.lowercase, tokenizer.strip_accents,
                                    tokenizer.suffix_indicator, tokenizer.oov_token)
    rebuilt = Tokenizer.from_str(text)
    words = [t for t in vocabulary if not t.startswith(tokenizer.suffix_indicator)][:2000]
    probes = list(PROBES) + [" ".join(words[i:i + 50]) for i in range(0, len(words), 50)]
    for probe in probes:
        ours = [int(i) for i in np.asarray(tokenizer(probe))]
        theirs = rebuilt.encode(probe, add_special_tokens=False).ids
        if ours != theirs:
            warnings.warn(
                "The tokenizers rebuild of this WordPiece tokenizer gives other ids than "
                f"keras-hub's on {probe[:60]!r} ({theirs[:8]} against {ours[:8]}): the export "
                "carries vocab.txt and its settings but no tokenizer.json, so "
                "TextClassifierArtifact cannot serve it.", stacklevel=3)
            return None
    return text


def _kind(tokenizer):
    import keras_hub

    return ("byte-level BPE" if isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer)
            else "SentencePiece")


def _max_length(model):
    backbone = getattr(model, "backbone", None)
    config = getattr(backbone, "bert_config", None) or getattr(backbone, "modernbert_config",
                                                               None)
    return None if config is None else int(config.max_sequence_length)
