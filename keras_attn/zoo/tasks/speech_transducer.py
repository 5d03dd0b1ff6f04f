"""speech_transducer: a Conformer-Transducer (RNN-T, or TDT with
`decoder.durations`) trained with the transducer loss on raw audio.

The data, batching, metrics and streaming evaluation are speech_ctc's (the
same recipes' `data`, `training` and `evaluation` keys), with the model a
`ConformerTransducer`: `model.preset` and `model.overrides` make its
encoder, the recipe's `decoder` section its prediction network and joint
(`build_conformer_transducer`'s own arguments). Decoding is the
transducer's greedy walk or its beam search (`evaluation.strategy`);
streamed evaluation uses the model's `stream_step`.

With `training.pretrained` (a Hugging Face `ParakeetForRNNT` or
`ParakeetForTDT` directory, or a finished speech_transducer run), the model
is that checkpoint's encoder and prediction network with the layers whose
shape follows the vocabulary (the predictor's embedding and the joint's
head) drawn anew over the recipe's vocabulary
(`ConformerTransducer.with_vocabulary`); the `decoder` section is then the
checkpoint's and may not be set.

Exports (SavedModel, ONNX, LiteRT) serve the greedy walk; a recipe whose
evaluation is a beam search is refused an export by name. What it does not
do yet: packed training rows (`data.packing`: the transducer's loss reads
no segment ids), refused by name. The data checks take the transducer's
rule: a clip needs one encoder frame whatever its transcript (CTC's one
frame per label does not bind a transducer, which emits any number of
labels at a frame).
"""

from typing import Annotated
from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.speech_ctc import PRETRAINED
from keras_attn.zoo.tasks.speech_ctc import SpeechCTC
from keras_attn.zoo.tasks.speech_ctc import SpeechCTCData
from keras_attn.zoo.tasks.speech_ctc import SpeechCTCEvaluation
from keras_attn.zoo.tasks.speech_ctc import SpeechCTCTraining


class SpeechTransducerData(SpeechCTCData):
    """speech_ctc's data: embedded spoken digits, a tfds set with audio and
    text, or a files: folder; `packing` is refused (not built yet)."""

    @pydantic.model_validator(mode="after")
    def _no_packing(self):
        if self.packing:
            raise schema.key_error("packing", "is not built for the transducer yet (its loss "
                                   "reads no segment ids); train on unpacked batches", True)
        return self


class SpeechTransducerEvaluation(SpeechCTCEvaluation):
    strategy: Literal["greedy", "beam_search"] = field(
        "greedy", description="The transducer's greedy walk, or its beam search over "
                              "alignment paths (beam_width).")
    streaming_chunk_sizes: list[schema.PositiveSize] = field(
        [], description="A model with chunk_size (streaming): also the test metrics of the "
                        "greedy walk streamed chunk by chunk (the model's stream_step) at "
                        "each of these chunk sizes in encoder frames, as `wer_chunk_<C>`, "
                        "`cer_chunk_<C>`, `exact_chunk_<C>` and `latency_ms_chunk_<C>`.")


class SpeechTransducerTraining(SpeechCTCTraining):
    pretrained: Optional[str] = field(
        None, description="null: a new model (model.preset + overrides, decoder). A "
                          "directory: fine-tune its encoder and prediction network with the "
                          "predictor's embedding and the joint's head drawn anew over this "
                          "recipe's vocabulary: a Hugging Face ParakeetForRNNT or "
                          "ParakeetForTDT directory (config.json, model.safetensors) or a "
                          "finished speech_transducer run (recipe.json, model.keras). The "
                          "model is the checkpoint's (model.preset and decoder are not "
                          "read); model.overrides may set only dropout, attention_dropout, "
                          "the SpecAugment masks and remat.")


class TransducerDecoder(schema.Section):
    """The prediction network and joint (`build_conformer_transducer`'s own
    arguments); null: its defaults."""

    predictor_dim: Optional[int] = field(
        None, ge=1, le=schema.MAX_WIDTH,
        description="The prediction network's and the joint's width (null: hidden_dim).")
    predictor_layers: Optional[int] = field(
        None, ge=1, le=schema.MAX_LAYERS,
        description="LSTM layers of the prediction network (null: 1).")
    durations: Optional[list[Annotated[int, pydantic.Field(ge=0, le=schema.MAX_SIZE)]]] = field(
        None, description="null: RNN-T. TDT: the frames each duration logit moves, distinct, "
                          "non-negative, one at least 1 (Parakeet-TDT: [0, 1, 2, 3, 4]).")
    joint_activation: Optional[str] = field(None, description='The joint\'s activation '
                                                              '(null: "relu").')
    max_symbols_per_step: Optional[int] = field(
        None, ge=1, le=schema.MAX_SIZE,
        description="Labels decoding emits at one frame before it moves on (null: 10).")

    @pydantic.model_validator(mode="after")
    def _valid_durations(self):
        if self.durations is not None:
            from keras_attn.models.conformer.transducer_decoding import check_durations

            try:
                check_durations(self.durations)
            except ValueError as error:
                raise schema.key_error("durations", str(error).split(" Received:")[0],
                                       self.durations) from None
        return self

    def arguments(self):
        """The arguments given, for `build_conformer_transducer`."""
        return {key: value for key, value in self.model_dump().items() if value is not None}


class SpeechTransducer(SpeechCTC):
    name = "speech_transducer"
    Data = SpeechTransducerData
    Training = SpeechTransducerTraining
    Evaluation = SpeechTransducerEvaluation
    Decoder = TransducerDecoder
    hf_architectures = ("ParakeetForRNNT", "ParakeetForTDT")
    model_class = "ConformerTransducer"
    new_head = "its prediction network with a new embedding and joint head"
    head = "transducer"

    def _decoder_arguments(self):
        given = self.recipe.get("decoder") or {}
        if self.pretrained and any(value is not None for value in given.values()):
            raise ValueError(
                f"Recipe key `decoder` cannot be set with {PRETRAINED}: the prediction "
                f"network and joint are the checkpoint's. Received: decoder={given}")
        return {key: value for key, value in given.items() if value is not None}

    def _build(self, preset, overrides):
        from keras_attn.models.conformer import build_conformer_transducer

        if self.pretrained:
            self._decoder_arguments()
            return self._pretrained_model(overrides)
        return build_conformer_transducer(preset, vocabulary_size=len(self.vocabulary),
                                          **overrides, **self._decoder_arguments())

    def _streamed_decoder(self, model, chunk_size):
        """Greedy labels of a batch streamed in pieces of one attention
        chunk each, through the model's `stream_step` (its encoder's
        streamer and the walk carried from chunk to chunk)."""
        self._streamable(model)
        piece = chunk_size * model.streamer(chunk_size).step

        def decode(inputs):
            import keras

            wave = np.asarray(inputs["waveform"], "float32")
            lengths = np.asarray(inputs["waveform_length"], "int64")
            width = -(-wave.shape[1] // piece) * piece
            wave = np.pad(wave, ((0, 0), (0, width - wave.shape[1])))
            state = model.initial_state(len(wave), chunk_size=chunk_size)
            labels = [[] for _ in wave]
            steps = [(wave[:, start:start + piece],
                      np.clip(lengths - start, 0, piece).astype("int32"))
                     for start in range(0, width, piece)]
            for chunk, valid in steps + [(None, None)]:
                if chunk is None:  # the end: the frames still held
                    outputs, state = model.flush(state, chunk_size=chunk_size)
                else:
                    outputs, state = model.stream_step(chunk, state, valid,
                                                       chunk_size=chunk_size)
                for row, ids in enumerate(keras.ops.convert_to_numpy(outputs["token_ids"])):
                    labels[row] += ids[ids >= 0].tolist()
            decoded = np.full((len(labels), max([len(r) for r in labels] + [1])), -1, "int32")
            for row, ids in enumerate(labels):
                decoded[row, :len(ids)] = ids
            return decoded

        return decode

    def check_export_format(self, format, precision="float32"):
        # The format's own checks (Task's); speech_ctc's words are CTC's.
        Task.check_export_format(self, format, precision)
        if self.evaluation["strategy"] != "greedy":
            raise ValueError(
                "An exported transducer walks greedily (the beam search runs on the host); "
                "this recipe's evaluation.strategy is "
                f"{self.evaluation['strategy']!r}. Received: format={format!r}")

    def reference_outputs(self, model, inputs):
        return {"token_ids": _labels_only(super().reference_outputs(model, inputs)["token_ids"])}

    def served_outputs(self, loaded, inputs):
        return {"token_ids": _labels_only(super().served_outputs(loaded, inputs)["token_ids"])}


def _labels_only(ids):
    """Each row's labels, -1 after them, as wide as the longest row: the
    model's `decode` and its SavedModel pad the same transcripts to other
    widths."""
    ids = np.asarray(ids)
    # A row the model answers NaN (-2) stays one.
    rows = [row[:1] if row.size and row[0] == -2 else row[row > 0] for row in ids]
    out = np.full((len(rows), max([len(row) for row in rows] + [1])), -1, "int32")
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out
