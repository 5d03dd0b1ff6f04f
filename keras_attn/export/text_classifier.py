"""Export a BERT text classifier as a SavedModel with two signatures.

- `serve(text)`: a `(B,)` string tensor in; WordPiece tokenization and
  `[CLS] text [SEP]` packing run inside the graph; class probabilities
  `(B, K)` out.
- `serve_ids(token_ids, segment_ids, padding_mask)`: `(B, T)` int32 each,
  any `T` up to the model's `max_sequence_length`; probabilities out.

The tokenizer ops come from tensorflow-text: `import tensorflow_text`
before `tf.saved_model.load` in the serving process. TensorFlow backend
only (the string signature needs TensorFlow ops).
"""

from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend


def export_text_classifier(model, tokenizer, path, sequence_length=128):
    """Writes `model` with its tokenizer to `path` (atomically).

    Args:
        model: a `BertSequenceClassifier` (or any model from the three BERT
            inputs to `(B, K)` logits).
        tokenizer: the `keras_hub.tokenizers.WordPieceTokenizer` of its
            vocabulary (`[PAD]`, `[CLS]` and `[SEP]` in the vocabulary).
        path: the SavedModel directory.
        sequence_length: length strings are packed (padded or truncated) to.

    Returns:
        `path`.
    """
    require_tensorflow_backend("export_text_classifier")
    import tensorflow as tf

    from keras_attn.data.text import pack_pairs

    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = model.input if isinstance(model.input, dict) else {}
    if set(inputs) != set(names):
        raise ValueError(
            "The model must take a dict of the BERT inputs token_ids, "
            "segment_ids and padding_mask. Received: model.input="
            f"{model.input!r}"
        )
    backbone = getattr(model, "backbone", None)
    max_length = backbone.bert_config.max_sequence_length if backbone else None
    if max_length is not None and sequence_length > max_length:
        raise ValueError(
            f"`sequence_length` must be at most the model's max_sequence_length="
            f"{max_length}. Received: sequence_length={sequence_length}"
        )
    pack = pack_pairs(tokenizer, sequence_length)
    if not tokenizer.built:
        tokenizer(tf.constant(["."]))  # builds it, for the export to track

    def probabilities(token_ids, segment_ids, padding_mask):
        logits = model(
            {"token_ids": token_ids, "segment_ids": segment_ids,
             "padding_mask": padding_mask},
            training=False,
        )
        return tf.nn.softmax(tf.cast(logits, "float32"), axis=-1)

    def serve_text(text):
        return probabilities(*pack(text))

    ids_spec = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
    return export_saved_model(
        model,
        path,
        input_signature=[tf.TensorSpec((None,), tf.string, name="text")],
        serving_fn=serve_text,
        extra_endpoints={"serve_ids": (probabilities, ids_spec)},
        track=[tokenizer],
    )
