"""Export a CTC speech recogniser (a `ConformerCTC`) as a SavedModel that
takes raw waveforms and returns token ids."""

from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend


def export_speech_recognizer(model, path, strategy="greedy", beam_width=16):
    """Writes `model` to `path` with a `serve(waveform, waveform_length)` endpoint.

    Args:
        model: a `ConformerCTC` (anything with a `decode(inputs, strategy,
            beam_width)` method taking `{"waveform", "waveform_length"}`).
        path: the SavedModel directory (written atomically).
        strategy: `"greedy"` or `"beam_search"`.
        beam_width: beam width for beam search.

    Returns:
        `path`. `serve` takes float32 `(B, N)` audio in [-1, 1] at the
        model's sampling rate and int32 `(B,)` lengths, and returns int32
        `(B, T')` token ids, -1 after each transcript.
    """
    require_tensorflow_backend("export_speech_recognizer")
    import tensorflow as tf

    if strategy not in ("greedy", "beam_search"):
        raise ValueError(
            f"`strategy` must be 'greedy' or 'beam_search'. Received: strategy={strategy!r}"
        )

    def serve(waveform, waveform_length):
        inputs = {"waveform": waveform, "waveform_length": waveform_length}
        return tf.cast(model.decode(inputs, strategy=strategy, beam_width=beam_width), tf.int32)

    signature = [
        tf.TensorSpec((None, None), tf.float32, name="waveform"),
        tf.TensorSpec((None,), tf.int32, name="waveform_length"),
    ]
    return export_saved_model(model, path, input_signature=signature, serving_fn=serve)
