"""Export a Transformer with its beam search as a SavedModel.

The `serve` endpoint takes source token ids `(B, S)` int32 (any batch, any
length, padded with the model's `pad_id`) and returns
`{"tokens": (B, max_length) int32, "scores": (B,) float32}`: the best beam
per sentence (end token included, padding after) and its length-normalised
log-probability. The whole search is one graph `While` loop with key/value
caches. Tokenization stays outside (a server tokenizes with the same
WordPiece vocabulary).

With `tokenizer=` (the `keras_attn.convert.MarianTokenizer` of an imported
opus-mt model), a second endpoint `translate` takes strings `(B,)` and
returns `{"translations": (B,) strings, "scores": (B,)}`: the SentencePiece
models and the `vocab.json` mapping are inside the SavedModel, so a server
needs no file beside it; the SentencePiece ops are tensorflow-text's, so the
serving process runs `import tensorflow_text` before `tf.saved_model.load`
(TensorFlow Serving needs a build with those ops). Without `tokenizer=`
the SavedModel is core TensorFlow: `import tensorflow` alone loads it.

>>> # export_translator(model, "/tmp/translator", start_id=1, end_id=2)
>>> # tf.saved_model.load("/tmp/translator").serve(source_ids)["tokens"]
"""

from keras_attn._keras_compat import sublayers
from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend
from keras_attn._base.quiet_tensorflow import tensorflow_module

# The start of the `InvalidArgumentError` of a `translate` call whose search
# gave an id that is no piece (see `export_translator`).
UNTRANSLATABLE = "keras_attn: cannot translate:"
# What the id -> piece table gives an id that is no piece; `decode` refuses
# such ids before the table is read, so it never reaches a translation.
NO_PIECE = "\u2047keras_attn: no piece\u2047"


def export_translator(
    model,
    path,
    start_id,
    end_id,
    beam_width=4,
    alpha=0.6,
    max_length=None,
    length_penalty="gnmt",
    tokenizer=None,
    format="saved_model",
    precision="float32",
    vocabulary=None,
):
    """Writes `model` (a `Transformer`) with beam search to `path`.

    With `format="onnx"` or `"litert"` the whole search is one loop of the
    artifact too (ONNX `Loop`, LiteRT `WHILE`): `model.onnx` /
    `model.tflite` and `serving.json` in `path`, input "source_ids" int32
    `(B, S)` (any batch and length), outputs "tokens" int32
    `(B, max_length)` and "scores" float32 `(B,)` as from `serve`. The
    decoder's cache writes become a gather and a select there (the
    converters cannot take TensorFlow's dynamic update slice).

    Args:
        model: a `keras_attn.models.transformer.Transformer`.
        path: the SavedModel directory (written atomically).
        start_id, end_id: the decoder's start and end tokens.
        beam_width: K; None for greedy search (scores are then zeros).
        alpha: the length penalty exponent.
        max_length: tokens generated at most. The source length is not known
            when the graph is traced, so the default is the model's
            `max_sequence_length` (the loop still stops when every beam has
            ended).
        length_penalty: `"gnmt"` or `"hf"` (Hugging Face's convention, for
            an imported Marian model; see `beam_search`).
        tokenizer: a `keras_attn.convert.MarianTokenizer`: adds the
            `translate` endpoint, strings in and out (SavedModel only). A
            batch in which the search gives a sentence an id that is no
            piece of `vocab.json` (-2, the mark of a sentence it could not
            translate: NaN weights) fails the call with an
            `InvalidArgumentError` starting with `UNTRANSLATABLE` that names
            the rows and the ids, as `MarianTokenizer.translate` raises a
            `ValueError`: never an empty or partial translation. (`serve`
            returns such tokens as they are: -2 and a NaN score.)
        format: `"saved_model"`, `"onnx"` or `"litert"`.
        precision: `"float32"` or `"float16"` (weights); LiteRT also `"int8"`.
        vocabulary: for ONNX / LiteRT, the tokens (a list, id order),
            written as `vocab.txt` beside the model.

    Returns:
        `path`.
    """
    from keras_attn.export.portable import check_format

    check_format(format, precision, onnx_int8=False)
    require_tensorflow_backend("export_translator")
    tf = tensorflow_module()

    from keras_attn.models.transformer.decoding import TransformerTranslator

    if not hasattr(model, "transformer_config"):
        raise ValueError(
            "`model` must be a keras_attn Transformer (from build_transformer). "
            f"Received: model={type(model).__name__}"
        )
    if format != "saved_model" and tokenizer is not None:
        raise ValueError(
            f"The {format} translator takes token ids (the SentencePiece tokenizer is "
            "TensorFlow Text ops, which the converters cannot take): pass `vocabulary=` "
            f"instead. Received: tokenizer={type(tokenizer).__name__}, format={format!r}")
    translator = TransformerTranslator(
        model, start_id, end_id, beam_width=beam_width, alpha=alpha, max_length=max_length,
        length_penalty=length_penalty,
    )
    if format != "saved_model":
        return _export_portable(translator, path, format, precision, vocabulary)
    translator(tf.constant([[start_id]], tf.int32))  # builds it (nothing to build but the flag)

    def serve(source_ids):
        tokens, scores = translator(source_ids)
        return {"tokens": tokens, "scores": scores}

    extra, track = None, ()
    if tokenizer is not None:
        text_graph = _marian_text_graph_class()(tokenizer, model.transformer_config.pad_id)

        def translate(text):
            tokens, scores = translator(text_graph.encode(text))
            return {"translations": text_graph.decode(tokens), "scores": scores}

        extra = {"translate": (translate, [tf.TensorSpec((None,), tf.string, name="text")])}
        track = [text_graph]
    return export_saved_model(
        translator,
        path,
        input_signature=[tf.TensorSpec((None, None), tf.int32, name="source_ids")],
        serving_fn=serve,
        extra_endpoints=extra,
        track=track,
    )


def _export_portable(translator, path, format, precision, vocabulary):
    import keras

    from keras_attn.export.portable import export_portable
    from keras_attn.layers import MultiHeadAttention

    model = translator.transformer
    config = model.transformer_config
    attention = [layer for layer in sublayers(model)
                 if isinstance(layer, MultiHeadAttention)]
    modes = [layer.portable_cache_write for layer in attention]
    try:
        # Traced again when converted: the switch holds until then, and is
        # put back whatever happens.
        for layer in attention:
            layer.portable_cache_write = True
        source_ids = keras.Input((None,), dtype="int32", name="source_ids")
        tokens, scores = translator(source_ids)
        serving = keras.Model(source_ids, {"tokens": tokens, "scores": scores},
                              name="translator_serving")
        preprocessing = {
            "source_ids": f"the source's token ids, padded with pad_id after the sentence; "
                          f"ids in [0, {config.vocabulary_size})",
            "tokens": "the best hypothesis, end token included, pad_id after it (no start "
                      "token)",
            "scores": "its length-normalised log-probability",
            "invalid_source": "a sentence with an id outside the vocabulary"
                              + (" or longer than max_sequence_length"
                                 if config.position_embedding == "learned" else "")
                              + " gets tokens of -2 and a NaN score",
            "start_id": translator.start_id, "end_id": translator.end_id,
            "pad_id": int(config.pad_id),
            "beam_width": translator.beam_width, "alpha": translator.alpha,
            "length_penalty": translator.length_penalty,
            "max_length": int(translator.max_length or config.max_sequence_length),
        }
        files = None
        if vocabulary is not None:
            preprocessing["vocabulary"] = "vocab.txt"
            files = {"vocab.txt": "".join(f"{token}\n" for token in vocabulary)}
        return export_portable(serving, path, format, precision, preprocessing=preprocessing,
                               files=files)
    finally:
        for layer, mode in zip(attention, modes):
            layer.portable_cache_write = mode


def _marian_text_graph_class():
    tf = tensorflow_module()

    class MarianTextGraph(tf.Module):
        """`MarianTokenizer` as TensorFlow ops: the source SentencePiece
        model (tensorflow-text) gives pieces, lookup tables map them to
        Marian's ids and back. Written here because tensorflow-text's
        `SentencepieceTokenizer` gives the SentencePiece model's own ids."""

        def __init__(self, tokenizer, pad_id):
            import tensorflow_text as tf_text

            super().__init__()
            with open(tokenizer.source_path, "rb") as stream:
                self.source = tf_text.SentencepieceTokenizer(stream.read(), out_type=tf.string)
            pieces = sorted(tokenizer.vocabulary.items(), key=lambda item: item[1])
            self.piece_to_id = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant([p for p, _ in pieces]), tf.constant([i for _, i in pieces], tf.int32)),
                default_value=tokenizer.unknown_id)
            self.id_to_piece = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant([i for _, i in pieces], tf.int32), tf.constant([p for p, _ in pieces])),
                default_value=NO_PIECE)
            # 1 for an id that is a piece of vocab.json, 0 (the default) for
            # any other (`decode` refuses those).
            self.is_piece = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant([i for _, i in pieces], tf.int32),
                    tf.ones([len(pieces)], tf.int32)),
                default_value=0)
            self.special = tf.constant(
                sorted({tokenizer.pad_id, tokenizer.start_id, tokenizer.unknown_id}), tf.int32)
            self.end_id, self.pad_id = tokenizer.end_id, pad_id

        def encode(self, text):
            # A leading language token (">>fra<<") is one piece, as transformers cuts it.
            has_code = tf.strings.regex_full_match(text, r">>.*?<<(?s:.*)")
            code = tf.strings.regex_replace(text, r"^(>>.*?<<)(?s:.*)$", r"\1")
            code = tf.where(has_code, code, "")
            rest = tf.where(has_code, tf.strings.regex_replace(text, r"^>>.*?<<", ""), text)
            codes = tf.ragged.boolean_mask(code[:, None], has_code[:, None])  # (B, 0 or 1)
            pieces = tf.concat([codes, self.source.tokenize(rest)], axis=1)
            ids = tf.ragged.map_flat_values(self.piece_to_id.lookup, pieces)
            ends = tf.fill([tf.shape(text)[0], 1], tf.constant(self.end_id, tf.int32))
            ids = tf.concat([ids, tf.RaggedTensor.from_tensor(ends)], axis=1)
            return ids.to_tensor(default_value=self.pad_id)

        def decode(self, tokens):
            # An id that is no piece of vocab.json (the -2 of a sentence the
            # search could not translate) stops the call, as
            # MarianTokenizer.translate raises: never empty or partial text.
            unknown = tf.equal(self.is_piece.lookup(tokens), 0)
            rows = tf.where(tf.reduce_any(unknown, axis=1))[:, 0]
            ids, _ = tf.unique(tf.boolean_mask(tokens, unknown))
            message = tf.strings.format(
                UNTRANSLATABLE + " the beam search gave the texts of rows {} ids that are no "
                "piece of vocab.json: {} (-2 marks a sentence whose encoder output is not "
                "finite: NaN weights, or a source id outside the model's vocabulary)",
                (rows, ids), summarize=16)
            check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(unknown)), [message])
            with tf.control_dependencies([check]):
                tokens = tf.identity(tokens)
            # Up to the first end token; special tokens dropped (as
            # MarianTokenizer.decode(skip_special_tokens=True)).
            before_end = tf.math.cumsum(tf.cast(tf.equal(tokens, self.end_id), tf.int32),
                                        axis=1) == 0
            keep = tf.logical_and(before_end, tf.reduce_all(
                tf.not_equal(tokens[:, :, None], self.special[None, None, :]), axis=-1))
            kept = tf.ragged.boolean_mask(tokens, keep)
            # SentencePiece's decoding of plain pieces: joined, the word-start
            # mark made a space (Marian's models have no byte-fallback pieces).
            # The target model itself is not used: with two tensorflow-text
            # SentencePiece models in one SavedModel, the restored target one
            # decoded with the wrong vocabulary (seen: "Invalid id: 43" for a
            # 44-piece target model beside a 40-piece source one, and wrong
            # texts).
            text = tf.strings.reduce_join(
                tf.ragged.map_flat_values(self.id_to_piece.lookup, kept), axis=1)
            return tf.strings.strip(tf.strings.regex_replace(text, "\u2581", " "))

    return MarianTextGraph

