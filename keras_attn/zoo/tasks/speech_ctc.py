"""speech_ctc: a Conformer trained with CTC on raw audio.

Data: embedded: `utterances` spoken digit strings synthesised with eSpeak NG
(cached in ~/.cache/keras_attn; the first `test_size` are the test set, the
next `validation_size` the validation set), vocabulary the ten digits, each
spoken digit a word for the WER; tfds: the named splits of librispeech,
speech_commands or any set with audio and text, vocabulary a-z, apostrophe
and space. Training batches of epoch e: a permutation keyed by (seed, e) (a
seeded buffer for tfds), bucketed by duration. SpecAugment and dropout run
inside the model (their seeds are model state the trainer checkpoints).
Metrics: corpus WER and CER of the test transcripts (greedy or beam-search
CTC decoding), and the share of exact transcripts. Export: waveforms in,
token ids out (`keras_attn.export.export_speech_recognizer`).
"""

from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task

LETTERS = tuple("abcdefghijklmnopqrstuvwxyz' ")


class SpeechCTCData(schema.TfdsSplits):
    """Embedded: spoken digit strings synthesised offline with eSpeak NG (the
    digits are the vocabulary; each digit is a word for the WER); tfds:
    librispeech, speech_commands or any set with audio and text (vocabulary
    a-z, apostrophe, space)."""

    utterances: int = field(2000, ge=3, only="embedded",
                            description="Utterances synthesised; more than test_size + "
                                        "validation_size.")
    test_size: int = field(200, ge=1, only="embedded", description="The first ones.")
    validation_size: int = field(100, ge=0, only="embedded", description="The next ones.")
    audio_key: Optional[str] = field(None, only="tfds",
                                     description='The audio feature (null: "speech" or "audio").')
    text_key: Optional[str] = field(None, only="tfds",
                                    description='The transcript feature (null: "text" or '
                                                '"label").')

    @pydantic.model_validator(mode="after")
    def _utterances_left_to_train(self):
        if self.dataset == schema.EMBEDDED:
            if self.test_size + self.validation_size >= self.utterances:
                raise schema.key_error("utterances", "must exceed test_size + validation_size "
                                       f"({self.test_size} + {self.validation_size})",
                                       self.utterances)
        return self


class SpeechCTCEvaluation(schema.Evaluation):
    metric: Literal["wer", "cer"] = field("wer", description="Corpus word / character error "
                                                             "rate.")
    strategy: Literal["greedy", "beam_search"] = field("greedy", description="CTC decoding.")
    beam_width: int = field(8, ge=1, description="For beam_search.")


class SpeechCTC(Task):
    name = "speech_ctc"
    family = "conformer"
    Data = SpeechCTCData
    Evaluation = SpeechCTCEvaluation
    set_fields = ("vocabulary_size",)
    embedded_data = "eSpeak NG spoken digits"
    metric_names = {"wer": "WER", "cer": "CER"}
    not_preparable_because = (
        "speech batches vary in length, the embedded waveforms alone are ~140 MB, and its "
        "WER uses keras-hub's EditDistance (TensorFlow)")

    def load_data(self):
        from keras_attn.data import speech
        from keras_attn.models.conformer import get_conformer_config

        if self.embedded:
            self.vocabulary = speech.DIGIT_VOCABULARY
            waveforms, transcripts = speech.load_spoken_digits(self.data["utterances"],
                                                               seed=self.seed)
            tests, validations = self.data["test_size"], self.data["validation_size"]
            self.test_split = (waveforms[:tests], transcripts[:tests])
            self.validation_split = (waveforms[tests : tests + validations],
                                     transcripts[tests : tests + validations])
            self.train_split = (waveforms[tests + validations :],
                                transcripts[tests + validations :])
            self.batches_per_epoch = int(self._dataset("train", 0).cardinality())
        else:
            self.vocabulary = LETTERS
            self.tfds_builder()
            examples = self.tfds_examples(self.data["train_split"])
            self.batches_per_epoch = max(1, examples // self.batch_size)
        self.model_config = get_conformer_config(
            self.recipe["model"]["preset"], vocabulary_size=len(self.vocabulary),
            **self.recipe["model"]["overrides"],
        )

    def _dataset(self, which, epoch=None):
        from keras_attn.data import speech

        if self.embedded:
            split = {"train": self.train_split, "validation": self.validation_split,
                     "test": self.test_split}[which]
            if not split[0]:
                return None
            return speech.speech_dataset(
                *split, batch_size=self.batch_size, vocabulary=self.vocabulary,
                shuffle=which == "train", seed=self.seed, epoch=epoch,
            )
        split = self.data[f"{which}_split"]
        if split is None:
            return None
        dataset, _ = speech.load_tfds_speech(
            self.tfds_name, split=split, data_dir=self.data["data_dir"],
            batch_size=self.batch_size, vocabulary=self.vocabulary,
            audio_key=self.data["audio_key"], text_key=self.data["text_key"], download=False,
            shuffle=which == "train", seed=self.seed, epoch=epoch,
        )
        return dataset

    def train_dataset_fn(self, epoch):
        self.prepare()
        return self._dataset("train", epoch)

    def validation_data(self):
        self.prepare()
        return self._dataset("validation")

    def make_model(self, preset, overrides):
        from keras_attn.models.conformer import build_conformer

        return build_conformer(preset, vocabulary_size=len(self.vocabulary), **overrides)

    def assume_data_sizes(self):
        from keras_attn.data import speech

        self.vocabulary = speech.DIGIT_VOCABULARY if self.embedded else LETTERS

    def compile_arguments(self, model):
        return {}  # ConformerCTC computes its CTC loss itself

    def _words(self, text):
        # A spoken digit is a word; other transcripts have spaces.
        return " ".join(text) if self.embedded else text

    def evaluate(self, model):
        import keras

        from keras_attn.data import speech

        self.prepare()
        references, hypotheses = [], []
        for inputs, labels in self._dataset("test"):
            # NumPy, not tf.data's tensors: on JAX only values JAX can read
            # take decode's compiled path.
            inputs = {name: np.asarray(value) for name, value in inputs.items()}
            decoded = model.decode(inputs, strategy=self.evaluation["strategy"],
                                   beam_width=self.evaluation["beam_width"])
            for ids, label in zip(keras.ops.convert_to_numpy(decoded), np.asarray(labels)):
                references.append(speech.decode_ids(label, self.vocabulary))
                hypotheses.append(speech.decode_ids(ids, self.vocabulary))
        return {
            "wer": speech.word_error_rate([self._words(r) for r in references],
                                          [self._words(h) for h in hypotheses]),
            "cer": speech.character_error_rate(references, hypotheses),
            "exact": float(np.mean([r == h for r, h in zip(references, hypotheses)])),
        }

    def export(self, model, path):
        from keras_attn.export import export_speech_recognizer

        return export_speech_recognizer(model, path, strategy=self.evaluation["strategy"],
                                        beam_width=self.evaluation["beam_width"])

    def example_inputs(self):
        self.prepare()
        inputs, _ = next(iter(self._dataset("test")))
        return {name: np.asarray(value)[:4] for name, value in inputs.items()}

    def reference_outputs(self, model, inputs):
        import keras

        inputs = {name: np.asarray(value) for name, value in inputs.items()}
        decoded = model.decode(inputs, strategy=self.evaluation["strategy"],
                               beam_width=self.evaluation["beam_width"])
        return {"token_ids": keras.ops.convert_to_numpy(decoded).astype("int32")}

    def served_outputs(self, loaded, inputs):
        ids = loaded.serve(inputs["waveform"], inputs["waveform_length"])
        return {"token_ids": np.asarray(ids)}
