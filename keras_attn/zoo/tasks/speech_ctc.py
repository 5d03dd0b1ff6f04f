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

import numpy as np

from keras_attn.zoo.tasks.base import Task

LETTERS = tuple("abcdefghijklmnopqrstuvwxyz' ")


class SpeechCTC(Task):
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

        decoded = model.decode(dict(inputs), strategy=self.evaluation["strategy"],
                               beam_width=self.evaluation["beam_width"])
        return {"token_ids": keras.ops.convert_to_numpy(decoded).astype("int32")}

    def served_outputs(self, loaded, inputs):
        ids = loaded.serve(inputs["waveform"], inputs["waveform_length"])
        return {"token_ids": np.asarray(ids)}
