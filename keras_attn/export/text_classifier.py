"""Export a BERT text classifier as a SavedModel with two entry points.
A ModernBERT classifier (inputs `token_ids` and `padding_mask`, no
segment ids) is exported the same way, `serve_ids(token_ids,
padding_mask)`.

- `serve(text)`: a `(B,)` string tensor in; WordPiece tokenization and
  `[CLS] text [SEP]` packing run inside the graph; class probabilities
  `(B, K)` out. `serving_default` (TensorFlow Serving's) takes the same
  strings and answers by name: "logits", "probabilities" and, exported with
  `class_names`, "label" (the top class's name).
- `serve_ids(token_ids, segment_ids, padding_mask)`: `(B, T)` int32 each,
  any `T` up to the model's `max_sequence_length`; probabilities out. Three
  inputs of different shapes stop the call with `InvalidArgumentError`
  naming them (a loaded SavedModel raises TensorFlow's errors, not Python's).

The tokenizer runs as core TensorFlow ops (`_wordpiece_graph`: the same
ids as keras-hub's `WordPieceTokenizer`, rebuilt without tensorflow-text),
so a serving process needs TensorFlow alone: `tf.saved_model.load(path)`
after `import tensorflow`, and TensorFlow Serving's standard build. The
export refuses a graph that would need any other op. TensorFlow backend only
(the string signature needs TensorFlow ops).
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
    _check_wordpiece(tokenizer)
    class_names = check_class_names(class_names, model.output_shape[-1])
    if format != "saved_model":
        return _export_portable(model, tokenizer, path, sequence_length, format, precision,
                                class_names, names)
    wordpiece = WordPieceGraph(tokenizer)
    text_spec = tf.TensorSpec((None,), tf.string, name="text")
    # Traced once here, checked, and called as this one function by every
    # trace of the endpoint.
    pack = tf.function(_single_text_packer(wordpiece, tokenizer, sequence_length),
                       input_signature=[text_spec], autograph=False)  # see traced_as_written
    check_core_ops(pack.get_concrete_function())

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
        track=[wordpiece],
        assets=class_names and {"labels.txt": labels_text(class_names)},
    )


def _check_wordpiece(tokenizer):
    """Every format packs WordPiece ids (ONNX and LiteRT: `serving.json`
    describes the WordPiece settings and `[CLS]`/`[SEP]`/`[PAD]` for the
    server): a byte-level BPE tokenizer (RoBERTa's, ModernBERT's) is
    refused by name here, not by an AttributeError of the contract."""
    import keras_hub

    if not isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        raise ValueError(
            "`tokenizer` must be a keras_hub.tokenizers.WordPieceTokenizer (BERT's): the "
            "export packs [CLS] text [SEP] with its ids. A model with a byte-level BPE "
            "tokenizer (RoBERTa, ModernBERT) exports with export_saved_model or "
            "export_portable, token ids in, its tokenizer run by the server. Received: "
            f"tokenizer={type(tokenizer).__name__}"
        )


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
                     class_names=None, names=None):
    import keras

    from keras_attn.export.portable import export_portable

    names = names or INPUT_NAMES[0]
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
    logits = model(inputs, training=False)
    probabilities = keras.ops.softmax(keras.ops.cast(logits, "float32"), axis=-1)
    serving = keras.Model([inputs[name] for name in names], {"probabilities": probabilities},
                          name="text_classifier_serving")
    vocabulary = list(tokenizer.get_vocabulary())
    preprocessing = {
        "tokenizer": "WordPiece (keras_hub.tokenizers.WordPieceTokenizer)",
        "vocabulary": "vocab.txt",
        "lowercase": bool(tokenizer.lowercase),
        "strip_accents": bool(tokenizer.strip_accents),
        "suffix_indicator": tokenizer.suffix_indicator,
        "oov_token": tokenizer.oov_token,
        "packing": "[CLS] text [SEP], truncated to sequence_length, padded with [PAD]",
        "sequence_length": int(sequence_length),
        "max_sequence_length": _max_length(model),
        "cls_id": vocabulary.index("[CLS]"),
        "sep_id": vocabulary.index("[SEP]"),
        "pad_id": vocabulary.index("[PAD]"),
        "segment_ids": "0 for every token of a single text",
        "padding_mask": "1 where token_ids is not pad_id, else 0",
    }
    if "segment_ids" not in names:
        del preprocessing["segment_ids"]
    return export_portable(serving, path, format, precision, preprocessing=preprocessing,
                           files={"vocab.txt": "".join(token + "\n" for token in vocabulary)},
                           axes={name: ["batch", "length"] for name in names},
                           extra=class_names and {"labels": class_names})


def _max_length(model):
    backbone = getattr(model, "backbone", None)
    config = getattr(backbone, "bert_config", None) or getattr(backbone, "modernbert_config",
                                                               None)
    return None if config is None else int(config.max_sequence_length)
