"""Export a Transformer with its beam search as a SavedModel.

The `serve` endpoint takes source token ids `(B, S)` int32 (any batch, any
length, padded with the model's `pad_id`) and returns
`{"tokens": (B, max_length) int32, "scores": (B,) float32}`: the best beam
per sentence (end token included, padding after) and its length-normalised
log-probability. The whole search is one graph `While` loop with key/value
caches. Tokenization stays outside (a server tokenizes with the same
WordPiece vocabulary).

>>> # export_translator(model, "/tmp/translator", start_id=1, end_id=2)
>>> # tf.saved_model.load("/tmp/translator").serve(source_ids)["tokens"]
"""

from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend


def export_translator(
    model,
    path,
    start_id,
    end_id,
    beam_width=4,
    alpha=0.6,
    max_length=None,
):
    """Writes `model` (a `Transformer`) with beam search to `path`.

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

    Returns:
        `path`.
    """
    require_tensorflow_backend("export_translator")
    import tensorflow as tf

    from keras_attn.models.transformer.decoding import TransformerTranslator

    if not hasattr(model, "transformer_config"):
        raise ValueError(
            "`model` must be a keras_attn Transformer (from build_transformer). "
            f"Received: model={type(model).__name__}"
        )
    translator = TransformerTranslator(
        model, start_id, end_id, beam_width=beam_width, alpha=alpha, max_length=max_length
    )
    translator(tf.constant([[start_id]], tf.int32))  # builds it (nothing to build but the flag)

    def serve(source_ids):
        tokens, scores = translator(source_ids)
        return {"tokens": tokens, "scores": scores}

    return export_saved_model(
        translator,
        path,
        input_signature=[tf.TensorSpec((None, None), tf.int32, name="source_ids")],
        serving_fn=serve,
    )
