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

With `data.packing`, each training utterance's log-mel features are
computed once by the model's own front end and packed (best-fit decreasing,
once for the seed) into rows as long as the longest utterance, the rows
shuffled every epoch: a features-input twin of the model trains on them,
and the run saves, evaluates and exports the waveform model with the
twin's weights (`served_model`). Validation and test stay unpacked
(docs/packing.md).

With `training.pretrained` (a Hugging Face `ParakeetForCTC` directory, or a
finished speech_ctc run), the model is that checkpoint's encoder under a new
CTC head over the recipe's vocabulary (`ConformerCTC.with_vocabulary`): the
checkpoint's config, not `model.preset`, and `model.overrides` only of the
fields that hold no weight (`FINE_TUNING_FIELDS`).
"""

import json
import os
from typing import Literal
from typing import Optional

import numpy as np
import pydantic

from keras_attn.zoo import schema
from keras_attn.zoo.schema import field
from keras_attn.zoo.tasks.base import Task
from keras_attn.zoo.tasks.base import batch_count
from keras_attn.zoo.tasks.base import in_memory_rows_fn
from keras_attn.zoo.tasks.base import pretrained_source

LETTERS = tuple("abcdefghijklmnopqrstuvwxyz' ")
PRETRAINED = "training.pretrained"
_RUN_FILES = ("recipe.json", "model.keras")
_HF_FILES = ("config.json", "model.safetensors")


class SpeechCTCData(schema.TfdsSplits):
    """Embedded: spoken digit strings synthesised offline with eSpeak NG (the
    digits are the vocabulary; each digit is a word for the WER); tfds:
    librispeech, speech_commands or any set with audio and text (vocabulary
    a-z, apostrophe, space); files: a folder with `train.csv|jsonl`,
    `test.*` and optionally `validation.*`, each row a WAV file (relative to
    the folder) and its transcript (vocabulary: the transcripts'
    characters)."""

    takes_files = True

    utterances: int = field(2000, ge=3, le=schema.MAX_SIZE, only="embedded",
                            description="Utterances synthesised; more than test_size + "
                                        "validation_size.")
    test_size: int = field(200, ge=1, le=schema.MAX_SIZE, only="embedded", description="The first ones.")
    validation_size: int = field(100, ge=0, le=schema.MAX_SIZE, only="embedded", description="The next ones.")
    audio_key: Optional[str] = field(None, only="tfds or files",
                                     description='The audio feature (null: "speech" or "audio"; '
                                                 'files: the column, null "audio").')
    text_key: Optional[str] = field(None, only="tfds or files",
                                    description='The transcript feature (null: "text" or '
                                                '"label"; files: the column, null "text").')

    packing: bool = field(
        False, description="Train on packed rows: each training utterance's log-mel features "
                           "computed once by the model's front end and packed (best-fit "
                           "decreasing, once for the seed) into rows of the longest one's "
                           "frames, the rows shuffled every epoch; a features-input twin of "
                           "the model trains, the run keeps the waveform model with its "
                           "weights. `training.batch_size` counts rows. Embedded and files "
                           "datasets. Validation and test stay unpacked.")

    _packing_in_memory = schema.packing_in_memory()

    def file_fields(self):
        """The audio and transcript columns of a files: dataset."""
        return [self.audio_key or "audio", self.text_key or "text"]

    @pydantic.model_validator(mode="after")
    def _speech_tables(self):
        if schema.dataset_kind(self.dataset) == "files":
            from keras_attn.data import files

            schema.check_files(self.dataset, files.check_table_files, self.file_fields(),
                               "path", ("train", "test"))
        return self

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
    beam_width: int = field(8, ge=1, le=schema.MAX_BEAM, description="For beam_search.")
    streaming_chunk_sizes: list[schema.PositiveSize] = field(
        [], description="A model with chunk_size (streaming): also the test metrics of "
                        "greedy decoding streamed chunk by chunk (ConformerStreamer) at each "
                        "of these chunk sizes in encoder frames, as `wer_chunk_<C>`, "
                        "`cer_chunk_<C>`, `exact_chunk_<C>` and `latency_ms_chunk_<C>` "
                        "(chunk plus the front end's look-ahead).")


class SpeechCTCTraining(schema.Training):
    # Added after the task's first runs: left out while null, so that their
    # resolved recipes (fingerprints) are unchanged and they resume.
    null_left_out = ("lora", "pretrained")

    pretrained: Optional[str] = field(
        None, description="null: a new model (model.preset + overrides). A directory: "
                          "fine-tune its encoder under a new CTC head over this recipe's "
                          "vocabulary (the checkpoint's head is replaced): a Hugging Face "
                          "ParakeetForCTC directory (config.json, model.safetensors; "
                          "16 kHz audio through its own front end) or a finished speech_ctc "
                          "run (recipe.json, model.keras). The model is the checkpoint's "
                          "(model.preset is not read); model.overrides may set only "
                          "dropout, attention_dropout, the SpecAugment masks and remat.")


def streaming_latency_ms(config, chunk_size):
    """Algorithmic latency of streaming in chunks of `chunk_size` encoder
    frames, in ms (docs/streaming.md): the feature frame the chunk's last
    encoder frame reads last, whose window ends half an FFT after its
    centre. `ConvSubsampling` (4 feature frames per encoder frame) reads 2
    frames past the chunk; the FastConformer's `subsampling="fast"` (8 per
    encoder frame) stops 1 frame short of it."""
    if config.subsampling == "fast":
        last_frame = 8 * chunk_size - 1
    else:
        last_frame = 4 * chunk_size + 2
    samples = last_frame * config.frame_step + config.fft_length // 2
    return 1000.0 * samples / config.sampling_rate


class SpeechCTC(Task):
    name = "speech_ctc"
    family = "conformer"
    Data = SpeechCTCData
    Training = SpeechCTCTraining
    Evaluation = SpeechCTCEvaluation
    set_fields = ("vocabulary_size",)
    embedded_data = "eSpeak NG spoken digits"
    metric_names = {"wer": "WER", "cer": "CER"}
    # Prepared data (embedded digits): each batch as the utterances' rows in
    # the spoken-digits set, their lengths, the batch's padded width and the
    # labels; the waveforms (~140 MB for 2,000) are made again where the data
    # is used (eSpeak NG and SciPy, no TensorFlow) and checked against the
    # SHA-256 of the ones prepared from. Packed (`data.packing`): the packed
    # rows, their features float32, stored once (tables.npz), each training
    # batch as the rows it holds; the validation features stored as they are
    # (the features the front end gives on another backend would not be the
    # same to the bit).

    # What `training.pretrained` may name: a Hugging Face directory of one
    # of `hf_architectures`, or a run of this task (its model.keras a
    # `model_class`); the head it gets anew (`with_vocabulary`).
    hf_architectures = ("ParakeetForCTC",)
    model_class = "ConformerCTC"
    new_head = "a new CTC head"
    # The length rule the data checks apply (keras_attn.data.files.speech_files).
    head = "ctc"

    @property
    def pretrained(self):
        """`training.pretrained`: a checkpoint directory, or None."""
        return self.training.get("pretrained")

    def pretrained_kind(self, path):
        """"hf" (a Hugging Face directory of one of `hf_architectures`) or
        "run" (a finished run of this task) for `training.pretrained`; a
        `ValueError` naming the key otherwise."""
        names = " or ".join(self.hf_architectures)
        kind = pretrained_source(path, PRETRAINED, self.name, _RUN_FILES, _HF_FILES,
                                 f"Hugging Face {names}", "an encoder")
        if kind == "hf":
            with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
                architectures = json.load(handle).get("architectures") or []
            if not set(self.hf_architectures) & set(architectures):
                raise ValueError(
                    f"Recipe key `{PRETRAINED}` names a Hugging Face directory of "
                    f"{architectures}; the {self.name} task fine-tunes a {names}. "
                    f"Received: {PRETRAINED}={path!r}")
        return kind

    def _run_config(self, path):
        """The `ConformerConfig` of a run's model.keras (its saved config: a
        run that was itself fine-tuned from a checkpoint has the
        checkpoint's, which its recipe's `model` section does not say)."""
        import dataclasses
        import zipfile

        from keras_attn.models.conformer import ConformerConfig

        with zipfile.ZipFile(os.path.join(path, "model.keras")) as archive:
            saved = json.loads(archive.read("config.json"))
        fields = {f.name for f in dataclasses.fields(ConformerConfig)}
        config = saved.get("config", {})
        if saved.get("class_name") != self.model_class:
            raise ValueError(
                f"Recipe key `{PRETRAINED}` names a run whose model.keras holds a "
                f"{saved.get('class_name')!r}, not a {self.model_class}. "
                f"Received: {PRETRAINED}={path!r}")
        return ConformerConfig(**{k: v for k, v in config.items() if k in fields})

    def _checkpoint_config(self):
        """The `ConformerConfig` of `training.pretrained` as this task trains
        it (waveforms in, the recipe's `FINE_TUNING_FIELDS` overrides; the
        vocabulary still the checkpoint's), every other override refused by
        name; None without one. Made once."""
        if not self.pretrained:
            return None
        if getattr(self, "_checkpoint", None) is None:
            from keras_attn.models.conformer import replace_conformer_config
            from keras_attn.models.conformer.conformer_config import FINE_TUNING_FIELDS

            overrides = dict(self.recipe["model"]["overrides"])
            for key, value in overrides.items():
                if key not in FINE_TUNING_FIELDS or key == "input_type":
                    allowed = [f for f in FINE_TUNING_FIELDS if f != "input_type"]
                    raise ValueError(
                        f"Recipe key `model.overrides.{key}` cannot be set with {PRETRAINED}: "
                        "the encoder is the checkpoint's (only "
                        f"{', '.join(allowed)} may be set for fine-tuning). "
                        f"Received: model.overrides.{key}={value!r}")
            path = self.pretrained
            if self.pretrained_kind(path) == "hf":
                from keras_attn.convert.parakeet import parakeet_config_from_hf

                config = parakeet_config_from_hf(path, input_type="waveform")
            else:
                config = self._run_config(path)
            self._checkpoint = replace_conformer_config(config, input_type="waveform",
                                                        **overrides)
        return self._checkpoint

    def _model_config(self):
        """The config of the model this recipe trains, the vocabulary's size set."""
        from keras_attn.models.conformer import get_conformer_config
        from keras_attn.models.conformer import replace_conformer_config

        if self.pretrained:
            return replace_conformer_config(self._checkpoint_config(),
                                            vocabulary_size=len(self.vocabulary))
        return get_conformer_config(
            self.recipe["model"]["preset"], vocabulary_size=len(self.vocabulary),
            **self.recipe["model"]["overrides"],
        )

    def model_note(self):
        if not self.pretrained:
            return None
        kind = (f"Hugging Face {' or '.join(self.hf_architectures)}"
                if self.pretrained_kind(self.pretrained) == "hf" else f"{self.name} run")
        return (f"{PRETRAINED}: the encoder of the {kind} {self.pretrained} (its config; "
                f"model.preset is not read) under {self.new_head} of "
                f"{len(self.vocabulary) + 1} outputs (this recipe's {len(self.vocabulary)} "
                "characters and the blank): the checkpoint's own head is replaced")

    def load_data(self):
        from keras_attn.data import speech
        from keras_attn.models.conformer import get_conformer_config

        checkpoint = self._checkpoint_config()  # refused overrides before any audio is read
        if checkpoint is not None and self.data.get("packing") \
                and checkpoint.subsampling == "fast":
            raise ValueError(
                f"Recipe key `data.packing` cannot be true with this {PRETRAINED}: packed rows "
                "are not built for its FastConformer subsampling yet (subsampling=\"fast\"). "
                "Received: data.packing=True")
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
        elif self.files:
            from keras_attn.data import files

            # A clip too short for its transcript (the model's front end and
            # subsampling, 4x or 8x; a checkpoint's own) is refused naming its
            # file, here rather than as a NaN loss at step 1. The audio is
            # read at the model's rate (a checkpoint's: 16 kHz for Parakeet).
            config = checkpoint or get_conformer_config(self.recipe["model"]["preset"],
                                                        **self.recipe["model"]["overrides"])
            splits = files.speech_files(self.files, seed=self.seed,
                                        audio_field=self.data["audio_key"] or "audio",
                                        text_field=self.data["text_key"] or "text",
                                        sampling_rate=config.sampling_rate,
                                        model_config=config, head=self.head)
            self.vocabulary = self._file_vocabulary(splits)
            self.train_split, self.test_split = splits["train"], splits["test"]
            self.validation_split = splits["validation"] or ([], [])
            self.batches_per_epoch = int(self._dataset("train", 0).cardinality())
        else:
            self.vocabulary = LETTERS
            self.tfds_builder()
            examples = self.tfds_examples(self.data["train_split"])
            self.batches_per_epoch = max(1, examples // self.batch_size)
        self.model_config = self._model_config()
        if self.data.get("packing"):  # absent when false (the resolved recipe leaves it out)
            self._pack_training_utterances()

    # === Packed training rows ===

    def _features(self, waveforms):
        """Each utterance's log-mel features `(frames, mels)`, float32, from
        the model's own front end, in batches of similar lengths (the front
        end gives an utterance the same frames in any batch)."""
        from keras import ops

        from keras_attn.models.conformer.conformer_model import log_mel_front_end

        front_end = log_mel_front_end(self.model_config, dtype="float32")
        lengths = np.array([len(w) for w in waveforms], "int32")
        features = [None] * len(waveforms)
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(order), 64):
            chunk = order[start:start + 64]
            batch = np.zeros((len(chunk), int(lengths[chunk].max())), "float32")
            for row, index in enumerate(chunk):
                batch[row, :lengths[index]] = waveforms[index]
            frames = ops.convert_to_numpy(front_end(batch, lengths[chunk]))
            for row, (index, count) in enumerate(zip(chunk, front_end.num_frames(lengths[chunk]))):
                features[index] = frames[row, :count]
        return features

    def _labels(self, transcripts):
        from keras_attn.data import speech

        return [np.asarray(speech.encode_transcript(t, self.vocabulary), "int32")
                for t in transcripts]

    def _pack_training_utterances(self):
        """Packs the training utterances' features once for the seed into
        rows of the longest one's frames (rounded up to the subsampling's
        4); the rows are shuffled every epoch (`_packed_dataset`), so every
        epoch has the same number of batches."""
        from keras_attn.data import pack_utterances

        waveforms, transcripts = self.train_split
        features = self._features(waveforms)
        row = -(-max(len(f) for f in features) // 4) * 4
        self.packed_rows = pack_utterances(features, row, labels=self._labels(transcripts),
                                           buffer_size=len(features), seed=self.seed)
        self.batches_per_epoch = batch_count(len(self.packed_rows["inputs"]), self.batch_size)

    def _packed_dataset(self, epoch):
        """Epoch `epoch`'s batches of packed rows, `(x, labels)` with labels
        `(B, K, L)`: the rows in an order keyed by (seed, epoch)."""
        import tensorflow as tf

        from keras_attn._epochs import epoch_permutation

        order = epoch_permutation(len(self.packed_rows["inputs"]), self.seed, epoch)
        return tf.data.Dataset.from_tensor_slices(self._packed_arrays(order)).batch(
            self.batch_size).prefetch(tf.data.AUTOTUNE)

    def _packed_arrays(self, order):
        """`(x, labels)` of the packed rows `order`, in the dtypes the
        twin trains on."""
        rows = self.packed_rows
        x = {"features": rows["inputs"][order],
             "feature_length": np.full(len(order), rows["inputs"].shape[1], "int32"),
             "segment_ids": rows["segment_ids"][order].astype("int32"),
             "positions": rows["positions"][order].astype("int32")}
        return x, rows["labels"][order]

    def _features_dataset(self, waveforms, transcripts):
        """Unpacked feature batches, one utterance per row, for the
        features-input twin (a packed run's validation)."""
        import tensorflow as tf

        features, labels = self._features(waveforms), self._labels(transcripts)
        lengths = np.array([len(f) for f in features], "int32")
        padded = np.zeros((len(features), int(lengths.max()), features[0].shape[1]), "float32")
        table = np.zeros((len(labels), max(len(label) for label in labels)), "int32")
        for i, (frames, label) in enumerate(zip(features, labels)):
            padded[i, :len(frames)] = frames
            table[i, :len(label)] = label
        x = {"features": padded, "feature_length": lengths}
        return tf.data.Dataset.from_tensor_slices((x, table)).batch(self.batch_size)

    def served_model(self, model):
        """A packed run trains the features-input twin: the waveform model
        (the recipe's) with its weights, matched by path."""
        if not self.data.get("packing"):
            return model
        from keras_attn.models import merge_lora
        from keras_attn.models.lora import lora_layers

        if lora_layers(model):
            # LoRA adapters folded in first: copied by path, the base kernels
            # alone would serve the model from before the fine-tuning (a run
            # evaluated from a checkpoint did).
            model = merge_lora(model)
        served = self._build(self.recipe["model"]["preset"],
                             dict(self.recipe["model"]["overrides"]))
        trained = {variable.path: variable for variable in model.weights}
        for variable in served.weights:
            variable.assign(trained[variable.path])
        return served

    @staticmethod
    def _file_vocabulary(splits):
        """Every character of the transcripts, sorted: ids 1..V."""
        return tuple(sorted({c for split in splits.values() if split for text in split[1]
                             for c in text}))

    def _dataset(self, which, epoch=None):
        from keras_attn.data import speech

        if not self.tfds_name:
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
        if self.data.get("packing"):
            return self._packed_dataset(epoch)
        return self._dataset("train", epoch)

    def process_train_dataset_fn(self, replicas, process, processes):
        # The batches are found from the waveform lengths, then each process
        # pads only its utterances.
        from keras_attn.data import speech

        return in_memory_rows_fn(
            self, replicas, process, processes, lambda positions, epoch: speech.speech_rows_dataset(
                *self.train_split, positions, self.weightless_rows, self.batch_size,
                vocabulary=self.vocabulary, seed=self.seed, epoch=epoch))

    def validation_data(self):
        self.prepare()
        if self.data.get("packing"):  # for the features-input twin
            waveforms, transcripts = self.validation_split
            return self._features_dataset(waveforms, transcripts) if waveforms else None
        return self._dataset("validation")

    def weightless_rows(self, batch, keep):
        """Filler rows made utterances of no frames with empty transcripts
        (a packed row: of no utterance), and weight 0: their frames join no
        BatchNorm statistics (the convolution module normalises over the
        batch's valid frames), their CTC loss is 0 on every backend, and
        ConformerCTC's weighted mean over utterances leaves them out."""
        from keras_attn.zoo.tasks.base import rows_replaced
        from keras_attn.zoo.tasks.base import weightless_rows

        x, labels = dict(batch[0]), batch[1]
        for name in ("waveform_length", "feature_length", "segment_ids", "positions"):
            if name in x:
                x[name] = rows_replaced(x[name], keep, 0)
        return weightless_rows((x, rows_replaced(labels, keep, 0)) + tuple(batch[2:]), keep)

    def make_model(self, preset, overrides):
        if self.data.get("packing"):  # the twin that trains; `served_model` the one kept
            overrides = dict(overrides, input_type="features")
        return self._build(preset, overrides)

    def _build(self, preset, overrides):
        from keras_attn.models.conformer import build_conformer

        if self.pretrained:
            return self._pretrained_model(overrides)
        return build_conformer(preset, vocabulary_size=len(self.vocabulary), **overrides)

    def _pretrained_model(self, overrides):
        """The checkpoint's encoder under a new CTC head over the recipe's
        vocabulary (`ConformerCTC.with_vocabulary`), with the recipe's
        fine-tuning overrides (and the packed twin's `input_type`)."""
        import keras

        path = self.pretrained
        if self.pretrained_kind(path) == "hf":
            from keras_attn.convert.parakeet import load_hf_parakeet

            checkpoint = load_hf_parakeet(path)  # features without preprocessor_config.json
        else:
            checkpoint = keras.saving.load_model(os.path.join(path, "model.keras"),
                                                 compile=False)
        fields = {"input_type": "waveform", **overrides}
        # In the recipe's precision (build_model set it), not the run's.
        return checkpoint.with_vocabulary(len(self.vocabulary),
                                          dtype=keras.config.dtype_policy(), **fields)

    def assume_data_sizes(self):
        from keras_attn.data import files
        from keras_attn.data import speech

        if self.files:  # the transcripts alone, no audio read
            audio, text = self.data["audio_key"] or "audio", self.data["text_key"] or "text"
            rows = files.table_rows(self.files, [audio, text])
            self.vocabulary = self._file_vocabulary(
                {s: (None, [str(r[text]) for r in v]) for s, v in rows.items() if v})
            return

        self.vocabulary = speech.DIGIT_VOCABULARY if self.embedded else LETTERS

    def compile_arguments(self, model):
        return {}  # ConformerCTC computes its CTC loss itself

    def _words(self, text):
        # A spoken digit is a word; other transcripts have spaces.
        return " ".join(text) if self.embedded else text

    def evaluate(self, model):
        from keras_attn.data import speech

        self.prepare()
        metrics = self._score(model, self._dataset("test"), speech.word_error_rate,
                              speech.character_error_rate)
        for chunk_size in self.evaluation.get("streaming_chunk_sizes", []):
            scored = self._score_decoded(self._streamed_decoder(model, chunk_size),
                                         self._dataset("test"), speech.word_error_rate,
                                         speech.character_error_rate)
            metrics.update({f"{name}_chunk_{chunk_size}": value
                            for name, value in scored.items()})
            metrics[f"latency_ms_chunk_{chunk_size}"] = streaming_latency_ms(
                model.conformer_config, chunk_size)
        return metrics

    @staticmethod
    def _streamable(model):
        """The model's config, or the `ValueError` of a model that does not
        stream waveforms."""
        config = model.conformer_config
        if config.chunk_size is None or config.input_type != "waveform":
            raise ValueError(
                "`evaluation.streaming_chunk_sizes` needs a streaming model on waveforms "
                "(model overrides chunk_size, left_context, causal_conv and "
                "feature_normalization='none'). Received: "
                f"chunk_size={config.chunk_size}, input_type={config.input_type!r}")
        return config

    def _streamed_decoder(self, model, chunk_size):
        """Greedy token ids of a batch streamed in pieces of one attention
        chunk each (`chunk_size` x 4 x frame_step samples, 8 x for the
        FastConformer), the last padded."""
        from keras_attn.models.conformer import ConformerStreamer
        from keras_attn.models.conformer.conformer_model import ctc_greedy_ids

        config = self._streamable(model)
        streamer = ConformerStreamer(model, chunk_size=chunk_size,
                                     left_context=config.left_context)
        piece = chunk_size * streamer.step

        def decode(inputs):
            import keras

            wave = np.asarray(inputs["waveform"], "float32")
            lengths = np.asarray(inputs["waveform_length"], "int64")
            width = -(-wave.shape[1] // piece) * piece
            wave = np.pad(wave, ((0, 0), (0, width - wave.shape[1])))
            state, logits = streamer.initial_state(len(wave)), []
            for start in range(0, width, piece):
                valid = np.clip(lengths - start, 0, piece).astype("int32")
                step, state = streamer.stream_step(wave[:, start:start + piece], state, valid)
                logits.append(keras.ops.convert_to_numpy(step))
            step, state = streamer.flush(state)
            logits = np.concatenate(logits + [keras.ops.convert_to_numpy(step)], axis=1)
            return np.asarray(ctc_greedy_ids(logits, state["logit_length"]))

        return decode

    def _score(self, model, batches, word_error_rate, character_error_rate):
        import keras

        def decode(inputs):
            decoded = model.decode(inputs, strategy=self.evaluation["strategy"],
                                   beam_width=self.evaluation["beam_width"])
            return keras.ops.convert_to_numpy(decoded)

        return self._score_decoded(decode, batches, word_error_rate, character_error_rate)

    def evaluate_served(self, serve):
        from keras_attn.data import speech

        return self._score_decoded(lambda inputs: serve(inputs)["token_ids"],
                                   self.test_data(), speech.word_error_rate,
                                   speech.character_error_rate)

    def _score_decoded(self, decode, batches, word_error_rate, character_error_rate):
        from keras_attn.data import speech

        references, hypotheses = [], []
        for inputs, labels in batches:
            # NumPy, not tf.data's tensors: on JAX only values JAX can read
            # take decode's compiled path.
            inputs = {name: np.asarray(value) for name, value in inputs.items()}
            for ids, label in zip(decode(inputs), np.asarray(labels)):
                references.append(speech.decode_ids(label, self.vocabulary))
                hypotheses.append(speech.decode_ids(ids, self.vocabulary))
        return {
            "wer": word_error_rate([self._words(r) for r in references],
                                   [self._words(h) for h in hypotheses]),
            "cer": character_error_rate(references, hypotheses),
            "exact": float(np.mean([r == h for r, h in zip(references, hypotheses)])),
        }

    def test_data(self):
        self.prepare()
        return self._dataset("test")

    def check_preparable(self):
        if not self.embedded:
            raise ValueError(
                "Prepared data for speech is made from the embedded spoken digits only so far "
                "(a tfds speech set's waveforms would have to be stored whole). "
                f"Received: data.dataset={self.data['dataset']!r}")

    def prepared_batches(self, split, epoch=None):
        """The test batches (and an unpacked run's others) as each row's
        index in the spoken digits, its length, the batch's width and the
        labels; a packed run's training batches as the packed rows they
        hold (`prepared_tables`), its validation features as they are."""
        packed = self.data.get("packing")
        if packed and split == "validation":
            return self.validation_data()
        if packed and split == "train":
            table = self._packed_arrays(np.arange(len(self.packed_rows["inputs"])))
            rows = {digest: i for i, digest in enumerate(_row_digests(*table))}

            def packed_batches():
                for x, labels in self.train_dataset_fn(epoch).as_numpy_iterator():
                    yield {"row": np.array([rows[d] for d in _row_digests(x, labels)], "int32")}

            return packed_batches()
        dataset = (self.train_dataset_fn(epoch) if split == "train" else
                   self.validation_data() if split == "validation" else self.test_data())
        if dataset is None:
            return None
        # The pipeline buckets (and so reorders) the utterances: each row is
        # found again by its samples.
        waveforms = self._prepared_waveforms()
        rows = {_bytes_digest(w): i for i, w in enumerate(waveforms)}

        def batches():
            for inputs, labels in dataset.as_numpy_iterator():
                lengths, padded = inputs["waveform_length"], inputs["waveform"]
                index = [rows[_bytes_digest(row[:n])] for row, n in zip(padded, lengths)]
                yield {"index": np.array(index, "int32"), "length": lengths, "y": labels,
                       "width": np.full(len(index), padded.shape[1], "int32")}

        return batches()

    def prepared_tables(self):
        """A packed run's rows, once (each epoch's batches index them):
        `x/features`, `x/feature_length`, `x/segment_ids`, `x/positions` and
        `y`, as the twin trains on them."""
        if not self.data.get("packing"):
            return {}
        x, labels = self._packed_arrays(np.arange(len(self.packed_rows["inputs"])))
        return dict({f"x/{key}": value for key, value in x.items()}, y=labels)

    def _prepared_waveforms(self):
        """Every utterance of the embedded set, in load_data's order."""
        from keras_attn.data import speech

        return speech.load_spoken_digits(self.data["utterances"], seed=self.seed)[0]

    @staticmethod
    def _digest(waveforms):
        import hashlib

        digest = hashlib.sha256()
        for waveform in waveforms:
            digest.update(np.int64(len(waveform)).tobytes())
            digest.update(np.asarray(waveform, "float32").tobytes())
        return digest.hexdigest()

    def prepared_state(self):
        waveforms = self._prepared_waveforms()
        return dict(super().prepared_state(), index_rows=len(waveforms),
                    waveforms_sha256=self._digest(waveforms))

    def use_prepared(self, state):
        from keras_attn.data import speech

        self.vocabulary = speech.DIGIT_VOCABULARY
        self.model_config = self._model_config()
        waveforms = self._prepared_waveforms()
        if self._digest(waveforms) != state["waveforms_sha256"]:
            raise ValueError(
                "The spoken digits made here (eSpeak NG, SciPy) are not the ones the data was "
                "prepared from (another SHA-256): another espeakng-loader or SciPy version. "
                "Install the versions of the machine that prepared it. Received: "
                f"data.utterances={self.data['utterances']}, training.seed={self.seed}")
        self._waveforms = waveforms
        super().use_prepared(state)

    def check_prepared(self, parts, model):
        """What the pipelines' checks and the model's own check of packed
        rows ask of stored speech: lengths that are the utterances' own,
        valid segment ids and positions, and labels each utterance can
        emit after the 4x subsampling. (`row` parts, each epoch's packed
        rows, are checked against the rows stored once, which come here as
        the tables' `x` and `y`.)"""
        if "index" in parts:
            self._check_waveform_rows(parts)
        elif "x" in parts:
            _check_feature_rows(parts["x"], parts["y"])

    def _check_waveform_rows(self, parts):
        index, lengths, widths = parts["index"], parts["length"], parts["width"]
        own = np.array([len(self._waveforms[i]) for i in index])
        if np.any(lengths != own) or np.any(lengths > widths):
            bad = int(np.flatnonzero((lengths != own) | (lengths > widths))[0])
            raise ValueError(
                "`length` must be the utterance's own length, at most the batch's `width`. "
                f"Received: length={int(lengths[bad])} for utterance {int(index[bad])} of "
                f"{int(own[bad])} samples, width={int(widths[bad])}")
        from keras_attn.models.conformer.conformer_config import feature_frames

        frames = feature_frames(self.model_config, lengths.astype("int64"))
        _check_label_frames(parts["y"], frames, lambda bad: f"utterance {int(index[bad])}",
                            self.model_config, head=self.head)

    def finish_prepared(self, parts, tables):
        if "row" in parts:  # a packed training batch: its rows of the table
            rows = parts["row"]
            x = {key[len("x/"):]: value[rows] for key, value in tables.items()
                 if key.startswith("x/")}
            return x, tables["y"][rows]
        if "x" in parts:  # a packed run's validation features
            return parts["x"], parts["y"]
        padded = np.zeros((len(parts["index"]), int(parts["width"][0])), "float32")
        for row, (index, length) in enumerate(zip(parts["index"], parts["length"])):
            padded[row, :length] = self._waveforms[index][:length]
        return {"waveform": padded, "waveform_length": parts["length"]}, parts["y"]

    def evaluate_prepared(self, model, prepared):
        from keras_attn.data.scoring import edit_distance_rate

        return self._score(
            model, prepared.batches("test", finish=self.finish_prepared),
            edit_distance_rate,
            lambda references, hypotheses: edit_distance_rate(
                references, hypotheses, lambda text: list(text.replace(" ", ""))))

    def check_export_format(self, format, precision="float32"):
        super().check_export_format(format, precision)
        if format != "saved_model" and self.evaluation["strategy"] != "greedy":
            raise ValueError(
                f"The {format} speech recognizer decodes greedily (beam search is TensorFlow's "
                "CTC kernel); this recipe's evaluation.strategy is "
                f"{self.evaluation['strategy']!r}. Received: format={format!r}")

    def export(self, model, path, format="saved_model", precision="float32"):
        from keras_attn.export import export_speech_recognizer

        self.check_export_format(format, precision)
        if getattr(self, "vocabulary", None) is None:  # a run's task is prepared
            self.assume_data_sizes()
        return export_speech_recognizer(model, path, strategy=self.evaluation["strategy"],
                                        beam_width=self.evaluation["beam_width"], format=format,
                                        precision=precision, vocabulary=list(self.vocabulary))

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
        ids = loaded.serve(inputs["waveform"], inputs["waveform_length"])["token_ids"]
        return {"token_ids": np.asarray(ids)}


# === Prepared data: checks of stored rows (NumPy) ===


def _bytes_digest(*arrays):
    """The SHA-256 of the arrays' bytes, one after the other."""
    import hashlib

    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _row_digests(x, labels):
    """`_bytes_digest` of each row of a batch `(x, labels)` (x a dict, in key order)."""
    return [_bytes_digest(*(x[key][i] for key in sorted(x)), labels[i]) for i in range(len(labels))]


def _check_feature_rows(x, labels):
    """Feature rows the twin trains on: packed ones as the model checks them
    when it is called eagerly (segment ids, positions, `feature_length`, one
    transcript per utterance), then each utterance's labels against its
    frames; unpacked ones (validation) against their `feature_length`."""
    from keras_attn.models.conformer.conformer_model import check_packed_rows

    labels = np.asarray(labels)
    if "segment_ids" not in x:
        frames = np.asarray(x["feature_length"]).astype("int64")
        _check_label_frames(labels, frames, lambda bad: f"row {bad}")
        return
    slots = labels.shape[1]
    utterances, frames = check_packed_rows(x["features"], x["segment_ids"], x["positions"],
                                           x["feature_length"], labels)
    _check_label_frames(utterances, frames,
                        lambda bad: f"utterance {bad % slots + 1} of row {bad // slots}")


def _check_label_frames(labels, frames, where, config=None, head="ctc"):
    """What the pipeline's data check asks (keras_attn.data.checks) of
    labels `(N, L)` and their utterances' feature frames `(N,)`: each
    transcript's ids followed by 0s, no longer than the utterance can emit
    after the model's subsampling (4x; 8x where `config.subsampling` is
    "fast"; 4x without a `config`). `where(i)` names row i."""
    from keras_attn.layers.conv_subsampling import subsampled_length
    from keras_attn.models.conformer.conformer_model import ctc_frames_needed
    from keras_attn.models.conformer.conformer_model import encoder_length

    real = labels > 0
    gaps = np.flatnonzero((~real[:, :-1] & real[:, 1:]).any(axis=1))
    if gaps.size:
        raise ValueError(
            "`labels` must be each transcript's ids followed by 0s (the padding). "
            f"Received: {labels[gaps[0]].tolist()} for {where(int(gaps[0]))}")
    emitted = subsampled_length(frames) if config is None else encoder_length(config, frames)
    # A transducer emits any number of labels at a frame: a row needs one.
    needed = ctc_frames_needed(labels) if head == "ctc" else np.ones(len(labels), "int64")
    if np.any(needed > emitted):
        bad = int(np.flatnonzero(needed > emitted)[0])
        factor = 8 if getattr(config, "subsampling", "conv") == "fast" else 4
        what = ("a CTC label sequence is longer than its utterance can emit" if head == "ctc"
                else "an utterance gives no frame (a transducer needs one)")
        raise ValueError(
            f"{what} after {factor}x subsampling. Received: labels needing "
            f"{int(needed[bad])} frames, {int(emitted[bad])} frames for {where(bad)}")
