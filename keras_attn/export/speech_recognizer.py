"""Export a CTC speech recogniser (a `ConformerCTC`) that takes raw
waveforms and returns token ids (and, given its vocabulary, the text): a
SavedModel, ONNX or LiteRT."""

import json

from keras_attn._keras_compat import sublayers
from keras_attn.export.saved_model import export_saved_model
from keras_attn.export.saved_model import require_tensorflow_backend
from keras_attn._base.quiet_tensorflow import tensorflow_module


def export_speech_recognizer(model, path, strategy="greedy", beam_width=16,
                             format="saved_model", precision="float32", vocabulary=None):
    """Writes `model` to `path` with a `serve(waveform, waveform_length)` endpoint.

    With `format="onnx"` or `"litert"` the directory holds `model.onnx` /
    `model.tflite` and `serving.json`: inputs "waveform" float32 `(B, N)`
    and "waveform_length" int32 `(B,)` (any batch, any N); outputs
    "token_ids" int32 `(B, T')` (greedy: `ctc_greedy_ids`, -1 after each
    transcript, T' the utterance frames after subsampling), "logits" and
    "logit_lengths" (for a server's own beam search). The log-mel front end
    computes its STFT as a convolution there (`LogMelFeatures(stft=...)`,
    `ParakeetLogMelFeatures(stft=...)`: the converters cannot take the
    FFT). Greedy only: the beam search is TensorFlow's CTC kernel. A
    `ConformerTransducer` serves its greedy walk there too (one while loop:
    ONNX's Loop, LiteRT's WHILE), "token_ids" `(B, T' x
    max_symbols_per_step)` with "frames" and "frame_lengths" beside them.

    Args:
        model: a `ConformerCTC` (anything with a `decode(inputs, strategy,
            beam_width)` method taking `{"waveform", "waveform_length"}`), or
            a `ConformerTransducer` (greedy: its `token_ids` are `(B, T' x
            max_symbols_per_step)`, -1 padded).
        path: the SavedModel directory (written atomically).
        strategy: `"greedy"` or `"beam_search"`.
        beam_width: beam width for beam search.
        format: `"saved_model"`, `"onnx"` or `"litert"`.
        precision: `"float32"` or `"float16"` (weights); LiteRT also `"int8"`.
        vocabulary: the token of each id 1..V (a list of
            `model.conformer_config.vocabulary_size` non-empty strings: the
            characters `load_speech_files` gives), carried by the export so
            that a server answers text: `serving.json`'s `"vocabulary"`
            (`SpeechRecognizerArtifact` reads it) or the SavedModel's
            `assets/vocabulary.json` and a `"text"` output beside
            `"token_ids"` (the tokens of each transcript joined). None: ids
            only.

    Returns:
        `path`. `serve` takes float32 `(B, N)` audio in [-1, 1] at the
        model's sampling rate and int32 `(B,)` lengths, and returns
        `{"token_ids": int32 (B, T')}`, -1 after each transcript (and
        `"text"`, a string per clip, with a vocabulary; a clip the model
        answers NaN for has token_ids all -2 and an empty text).

    Raises:
        ValueError: an unknown strategy, format or precision, a model that
            takes features, or a `vocabulary` that is not one token per id
            of the model's head (each named with what was received).
    """
    from keras_attn.export.portable import check_format

    check_format(format, precision, onnx_int8=False)
    require_tensorflow_backend("export_speech_recognizer")
    vocabulary = check_vocabulary(vocabulary, model)
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
        return _export_portable(model, path, format, precision, vocabulary)
    tf = tensorflow_module()
    # Id 0 (the blank) and the -1 after a transcript read as "".
    tokens = None if vocabulary is None else tf.constant([""] + vocabulary)

    def serve(waveform, waveform_length):
        inputs = {"waveform": waveform, "waveform_length": waveform_length}
        # A dict: TensorFlow Serving's signature then answers "token_ids",
        # not "output_0".
        ids = tf.cast(model.decode(inputs, strategy=strategy, beam_width=beam_width), tf.int32)
        outputs = {"token_ids": ids}
        if tokens is not None:
            outputs["text"] = tf.strings.reduce_join(
                tf.gather(tokens, tf.maximum(ids, 0)), axis=-1)
        return outputs

    signature = [
        tf.TensorSpec((None, None), tf.float32, name="waveform"),
        tf.TensorSpec((None,), tf.int32, name="waveform_length"),
    ]
    return export_saved_model(model, path, input_signature=signature, serving_fn=serve,
                              assets=vocabulary and {VOCABULARY_FILE: json.dumps(vocabulary)})


# The SavedModel asset holding the vocabulary (a JSON list: a token may be
# a space or a line break, which a one-token-a-line file could not hold).
VOCABULARY_FILE = "vocabulary.json"


def check_vocabulary(vocabulary, model):
    """`vocabulary` as a list of the model's `vocabulary_size` non-empty
    strings (the tokens of ids 1..V), or None; a `ValueError` naming the
    argument otherwise."""
    if vocabulary is None:
        return None
    size = getattr(getattr(model, "conformer_config", None), "vocabulary_size", None)
    if isinstance(vocabulary, str) or not vocabulary or not all(
            isinstance(token, str) and token for token in vocabulary):
        raise ValueError("Invalid value for argument `vocabulary`: a list of non-empty strings, "
                         "the token of each id 1..V. Received: "
                         f"vocabulary={vocabulary!r}"[:400])
    vocabulary = list(vocabulary)
    if size is not None and len(vocabulary) != size:
        raise ValueError(
            f"Invalid value for argument `vocabulary`: the model's CTC head emits ids 1..{size} "
            f"(vocabulary_size={size}, the blank is 0), so it needs {size} tokens. Received: "
            f"{len(vocabulary)} tokens, vocabulary={vocabulary!r}"[:600])
    return vocabulary


def _export_portable(model, path, format, precision, vocabulary=None):
    import keras

    from keras_attn.export.portable import export_portable
    from keras_attn.layers import LogMelFeatures
    from keras_attn.layers import ParakeetLogMelFeatures
    from keras_attn.models.conformer.conformer_model import ctc_greedy_ids

    from keras_attn.models.conformer import ConformerTransducer

    class GreedyIds(keras.layers.Layer):
        # ctc_greedy_ids in the functional serving model: the frame count
        # is known only when it runs; its output is int32.
        def call(self, logits, lengths):
            return ctc_greedy_ids(logits, lengths)

        def compute_output_spec(self, logits, lengths):
            return keras.KerasTensor(tuple(logits.shape[:2]), dtype="int32")

    class TransducerIds(keras.layers.Layer):
        # The transducer's greedy walk (one while loop, `greedy_ids`) over
        # the model's own prediction network and joint (their weights, not
        # copies): LiteRT's builtins and ONNX's Loop hold it.
        def __init__(self, transducer, **kwargs):
            super().__init__(**kwargs)
            self.transducer = transducer

        def call(self, frames, lengths):
            return self.transducer.greedy_ids(frames, lengths)

        def compute_output_spec(self, frames, lengths):
            steps = self.transducer.max_symbols_per_step
            width = None if frames.shape[1] is None else frames.shape[1] * steps
            return keras.KerasTensor((frames.shape[0], width), dtype="int32")

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
        if isinstance(model, ConformerTransducer):
            frames = keras.ops.cast(outputs["frames"], "float32")
            lengths = keras.ops.cast(outputs["frame_lengths"], "int32")
            served = {"token_ids": TransducerIds(model, name="greedy_ids")(frames, lengths),
                      "frames": frames, "frame_lengths": lengths}
            decoding = ("greedy transducer walk: ids 1..V, -1 after the transcript (frames x "
                        "max_symbols_per_step wide)")
        else:
            logits = keras.ops.cast(outputs["logits"], "float32")
            lengths = keras.ops.cast(outputs["logit_lengths"], "int32")
            served = {"token_ids": GreedyIds(name="greedy_ids")(logits, lengths),
                      "logits": logits, "logit_lengths": lengths}
            decoding = "greedy CTC: ids 1..V (0 is the blank), -1 after the transcript"
        serving = keras.Model([waveform, waveform_length], served,
                              name="speech_recognizer_serving")
        return export_portable(
            serving, path, format, precision,
            preprocessing={"waveform": "float32 audio in [-1, 1] at the model's sampling rate, "
                                       "padded with anything after waveform_length",
                           "sampling_rate": int(model.conformer_config.sampling_rate),
                           "token_ids": decoding},
            extra=vocabulary and {"vocabulary": vocabulary})
    finally:
        for layer, mode in zip(front_ends, modes):
            layer.stft = mode
