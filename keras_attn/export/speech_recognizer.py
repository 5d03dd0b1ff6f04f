"""Export a CTC speech recogniser (a `ConformerCTC`) that takes raw
waveforms and returns token ids: a SavedModel, ONNX or LiteRT."""

from keras_attn._keras_compat import sublayers
from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend
from keras_attn._base.quiet_tensorflow import tensorflow_module


def export_speech_recognizer(model, path, strategy="greedy", beam_width=16,
                             format="saved_model", precision="float32"):
    """Writes `model` to `path` with a `serve(waveform, waveform_length)` endpoint.

    With `format="onnx"` or `"litert"` the directory holds `model.onnx` /
    `model.tflite` and `serving.json`: inputs "waveform" float32 `(B, N)`
    and "waveform_length" int32 `(B,)` (any batch, any N); outputs
    "token_ids" int32 `(B, T')` (greedy: `ctc_greedy_ids`, -1 after each
    transcript, T' the utterance frames after subsampling), "logits" and
    "logit_lengths" (for a server's own beam search). The log-mel front end
    computes its STFT as a convolution there (`LogMelFeatures(stft=...)`,
    `ParakeetLogMelFeatures(stft=...)`: the converters cannot take the
    FFT). Greedy only: the beam search is TensorFlow's CTC kernel.

    Args:
        model: a `ConformerCTC` (anything with a `decode(inputs, strategy,
            beam_width)` method taking `{"waveform", "waveform_length"}`).
        path: the SavedModel directory (written atomically).
        strategy: `"greedy"` or `"beam_search"`.
        beam_width: beam width for beam search.
        format: `"saved_model"`, `"onnx"` or `"litert"`.
        precision: `"float32"` or `"float16"` (weights); LiteRT also `"int8"`.

    Returns:
        `path`. `serve` takes float32 `(B, N)` audio in [-1, 1] at the
        model's sampling rate and int32 `(B,)` lengths, and returns
        `{"token_ids": int32 (B, T')}`, -1 after each transcript.
    """
    from keras_attn.export.portable import check_format

    check_format(format, precision, onnx_int8=False)
    require_tensorflow_backend("export_speech_recognizer")
    if strategy not in ("greedy", "beam_search"):
        raise ValueError(
            f"`strategy` must be 'greedy' or 'beam_search'. Received: strategy={strategy!r}"
        )
    if format != "saved_model":
        if strategy != "greedy":
            raise ValueError(
                f"The {format} speech recognizer decodes greedily (beam search is TensorFlow's "
                "CTC kernel, which the converters cannot take; the artifact also returns the "
                "logits for a server's own beam search). Received: "
                f"strategy={strategy!r}, format={format!r}")
        return _export_portable(model, path, format, precision)
    tf = tensorflow_module()

    def serve(waveform, waveform_length):
        inputs = {"waveform": waveform, "waveform_length": waveform_length}
        # A dict: TensorFlow Serving's signature then answers "token_ids",
        # not "output_0".
        return {"token_ids": tf.cast(model.decode(inputs, strategy=strategy,
                                                  beam_width=beam_width), tf.int32)}

    signature = [
        tf.TensorSpec((None, None), tf.float32, name="waveform"),
        tf.TensorSpec((None,), tf.int32, name="waveform_length"),
    ]
    return export_saved_model(model, path, input_signature=signature, serving_fn=serve)


def _export_portable(model, path, format, precision):
    import keras

    from keras_attn.export.portable import export_portable
    from keras_attn.layers import LogMelFeatures
    from keras_attn.layers import ParakeetLogMelFeatures
    from keras_attn.models.conformer.conformer_model import ctc_greedy_ids

    class GreedyIds(keras.layers.Layer):
        # ctc_greedy_ids in the functional serving model: the frame count
        # is known only when it runs; its output is int32.
        def call(self, logits, lengths):
            return ctc_greedy_ids(logits, lengths)

        def compute_output_spec(self, logits, lengths):
            return keras.KerasTensor(tuple(logits.shape[:2]), dtype="int32")

    if "waveform" not in getattr(model, "input", {}):
        raise ValueError(
            "The model must take raw audio ({'waveform', 'waveform_length'}; a Conformer "
            "built with input_type='features' takes features). Received: "
            f"model.input={model.input!r}")
    front_ends = [layer for layer in sublayers(model)
                  if isinstance(layer, (LogMelFeatures, ParakeetLogMelFeatures))]
    modes = [layer.stft for layer in front_ends]
    try:
        # The model is traced again when it is converted: the switch holds
        # until then, and is put back whatever happens.
        for layer in front_ends:
            layer.stft = "convolution"
        waveform = keras.Input((None,), dtype="float32", name="waveform")
        waveform_length = keras.Input((), dtype="int32", name="waveform_length")
        outputs = model({"waveform": waveform, "waveform_length": waveform_length},
                        training=False)
        logits = keras.ops.cast(outputs["logits"], "float32")
        lengths = keras.ops.cast(outputs["logit_lengths"], "int32")
        serving = keras.Model(
            [waveform, waveform_length],
            {"token_ids": GreedyIds(name="greedy_ids")(logits, lengths), "logits": logits,
             "logit_lengths": lengths},
            name="speech_recognizer_serving")
        return export_portable(
            serving, path, format, precision,
            preprocessing={"waveform": "float32 audio in [-1, 1] at the model's sampling rate, "
                                       "padded with anything after waveform_length",
                           "sampling_rate": int(model.conformer_config.sampling_rate),
                           "token_ids": "greedy CTC: ids 1..V (0 is the blank), -1 after the "
                                        "transcript"})
    finally:
        for layer, mode in zip(front_ends, modes):
            layer.stft = mode
