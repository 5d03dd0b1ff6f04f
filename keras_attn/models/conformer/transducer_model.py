"""The Conformer with a transducer decoder (Graves 2012; Gulati et al.
2020 trained theirs so), RNN-T or TDT (Xu et al. 2023) as NVIDIA's
Parakeet RNN-T / TDT checkpoints: the encoder of `ConformerCTC`, a
projection to the joint's width, a prediction network and a joint."""

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn._guard import IdSpec
from keras_attn._guard import concrete_value
from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn.models._guarded import GuardedModel
from keras_attn.models.conformer.conformer_config import DEFAULT_PRESET
from keras_attn.models.conformer.conformer_config import ConformerConfig
from keras_attn.models.conformer.conformer_config import check_vocabulary_size
from keras_attn.models.conformer.conformer_config import get_conformer_config
from keras_attn.models.conformer.conformer_model import AudioInputChecks
from keras_attn.models.conformer.conformer_model import BatchMean
from keras_attn.models.conformer.conformer_model import interior_padding
from keras_attn.models.conformer.conformer_model import row_weights
from keras_attn.models.conformer.conformer_model import with_new_vocabulary
from keras_attn.models.conformer.conformer_model import conformer_encoder_graph
from keras_attn.models.conformer.conformer_model import model_outputs_for_decoding
from keras_attn.models.conformer.transducer_decoding import check_durations
from keras_attn.models.conformer.transducer_decoding import transducer_beam_search
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_decode
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_ids
from keras_attn.training.transducer_loss import rnnt_loss
from keras_attn.training.transducer_loss import tdt_loss

# The transducer's own arguments, beside the encoder's ConformerConfig fields.
TRANSDUCER_ARGUMENTS = ("predictor_dim", "predictor_layers", "durations", "joint_activation",
                        "max_symbols_per_step")


@keras.saving.register_keras_serializable(package="keras_attn")
class ConformerTransducer(AudioInputChecks, GuardedModel, ConfigModel, keras.Model):
    """A Conformer encoder with a transducer decoder: RNN-T, or TDT with
    `durations`; build it with `build_conformer_transducer`.

    Inputs are `ConformerCTC`'s (waveforms, or log-mel features with
    `input_type="features"`). Outputs: `{"frames": (B, T', predictor_dim),
    "frame_lengths": (B,)}`, the encoder's frames projected to the joint's
    width (`encoder_projector`); `decode` turns them into transcripts, and
    `fit` scores them against the labels through the prediction network
    (`predictor`) and the joint (`joint`).

    Labels are `ConformerCTC`'s: `(B, L)` ids in `1..vocabulary_size`
    followed by 0s; 0 is the blank (and the start symbol the predictor
    reads first). The loss is the mean over the utterances of `rnnt_loss`
    (or `tdt_loss`); with `sample_weight` `(B,)`, their weighted mean. A
    transducer emits any number of labels from a frame, so, unlike CTC, no
    transcript is too long for its audio. Labels out of range or with a 0
    inside are refused on concrete data and make the loss NaN (the step is
    skipped) in a compiled one.

    Args (beside `ConformerConfig`'s fields; `chunk_size` is refused: a
        streaming transducer is not built yet):
        predictor_dim: the prediction network's and the joint's width
            (Parakeet: 640); None: `hidden_dim`.
        predictor_layers: the prediction network's LSTM layers (Parakeet:
            2 for RNN-T, 1 or 2 for TDT); None: 1.
        durations: None for RNN-T; TDT: the frames each duration logit
            moves (Parakeet-TDT: `[0, 1, 2, 3, 4]`).
        joint_activation: the joint's activation; None: `"relu"`.
        max_symbols_per_step: labels `decode` emits at one frame before
            it moves on; None: 10.

    Example:

    >>> import numpy as np
    >>> model = build_conformer_transducer("conformer_tiny", vocabulary_size=5,
    ...                                    input_type="features", predictor_dim=16)
    >>> features = np.random.default_rng(0).normal(size=(2, 40, 40)).astype("float32")
    >>> outputs = model({"features": features, "feature_length": np.array([40, 24])})
    >>> tuple(outputs["frames"].shape), np.asarray(outputs["frame_lengths"]).tolist()
    ((2, 9, 16), [9, 5])
    """

    config_attribute = "conformer_config"
    nan_output_key = "frames"

    @config_arguments(ConformerConfig, "Conformer", extra=TRANSDUCER_ARGUMENTS)
    def __init__(self, config, dtype=None, predictor_dim=None, predictor_layers=None,
                 durations=None, joint_activation=None, max_symbols_per_step=None, **kwargs):
        check_vocabulary_size("vocabulary_size", config.vocabulary_size, allow_none=False)
        if config.chunk_size is not None:
            raise ValueError(
                "A streaming (chunked) transducer is not built yet: the encoder of a "
                "ConformerTransducer attends to the whole utterance. Received: "
                f"chunk_size={config.chunk_size}")
        predictor_dim = check_positive_int(
            "predictor_dim", config.hidden_dim if predictor_dim is None else predictor_dim)
        predictor_layers = check_positive_int(
            "predictor_layers", 1 if predictor_layers is None else predictor_layers)
        if durations is not None:
            durations = [int(d) for d in check_durations(durations)]
        joint_activation = "relu" if joint_activation is None else joint_activation
        max_symbols_per_step = check_positive_int(
            "max_symbols_per_step", 10 if max_symbols_per_step is None else max_symbols_per_step)
        kwargs.setdefault("name", "conformer_transducer")

        # === Layers and functional model (the encoder) ===
        inputs, x, frame_lengths, projector = conformer_encoder_graph(
            config, dtype=dtype, make_head=lambda: keras.layers.Dense(
                predictor_dim, dtype=dtype, name="encoder_projector"))
        super().__init__(inputs=inputs,
                         outputs={"frames": projector(x), "frame_lengths": frame_lengths},
                         dtype=dtype, **kwargs)
        # The decoder: the labels reach it in `compute_loss` and `decode`,
        # not through the functional graph (its inputs are the audio only).
        classes = config.vocabulary_size + 1  # the blank, 0, and the labels
        self.predictor = TransducerPredictor(classes, predictor_dim, predictor_layers,
                                             dtype=dtype, name="predictor")
        self.joint = TransducerJoint(classes + len(durations or ()),
                                     activation=joint_activation, dtype=dtype, name="joint")
        self.predictor.build((None, None))
        self.joint.build((None, None, predictor_dim), (None, None, predictor_dim))

        # === Config ===
        self.conformer_config = config
        self.vocabulary_size = config.vocabulary_size
        self.predictor_dim = predictor_dim
        self.predictor_layers = predictor_layers
        self.durations = durations
        self.joint_activation = joint_activation
        self.max_symbols_per_step = max_symbols_per_step

    def get_config(self):
        config = super().get_config()
        config.update(predictor_dim=self.predictor_dim, predictor_layers=self.predictor_layers,
                      durations=self.durations, joint_activation=self.joint_activation,
                      max_symbols_per_step=self.max_symbols_per_step)
        return config

    def with_vocabulary(self, vocabulary_size, dtype=None, **overrides):
        """A new `ConformerTransducer` over another vocabulary with this
        model's encoder and prediction network: a Parakeet checkpoint's
        1,024 SentencePiece tokens to your transcripts' characters, as
        `ConformerCTC.with_vocabulary` does for CTC.

        The layers whose shape follows the vocabulary, the predictor's
        embedding and the joint's head (TDT's duration logits included: one
        layer), are drawn anew (seeded by `keras.utils.set_random_seed`),
        as transformers' `from_pretrained(..., vocab_size=N,
        ignore_mismatched_sizes=True)` does; every other weight is copied,
        the LSTM layers and the BatchNorm statistics included. The
        transducer's own arguments are kept; `overrides` are
        `ConformerCTC.with_vocabulary`'s (`FINE_TUNING_FIELDS`).

        Example:

        >>> model = build_conformer_transducer("conformer_tiny", vocabulary_size=1024)
        >>> mine = model.with_vocabulary(28)
        >>> mine.joint.outputs, mine.predictor.vocabulary_size
        (29, 29)
        """
        own = {name: getattr(self, name) for name in TRANSDUCER_ARGUMENTS}
        return with_new_vocabulary(
            self, vocabulary_size, dtype, overrides,
            fresh=("predictor/embedding/", "joint/head/"),
            make=lambda config, dtype: ConformerTransducer(
                **dataclasses.asdict(config), dtype=dtype, name=self.name, **own))

    def label_specs(self):
        return {None: IdSpec(0, self.vocabulary_size + 1, "1..V, 0 pads")}

    def call(self, inputs, training=None, mask=None):
        outputs = super().call(inputs, training=training, mask=mask)
        return self._nan_where_lengths_wrap(inputs, outputs)

    def _check_data(self, x, y=None):
        super()._check_data(x, y)
        labels = None if y is None or isinstance(y, dict) else concrete_value(y)
        if labels is not None and labels.ndim == 2 and np.any(interior_padding(labels)):
            rows = np.flatnonzero(interior_padding(labels))
            raise ValueError(
                "`labels` must be each transcript's ids followed by 0s (the padding); a 0 "
                "between two labels would train on a transcript that is neither. Received: "
                f"labels with a 0 inside row(s) {rows[:5].tolist()}, e.g. "
                f"{labels[rows[0]].tolist()}")

    def joint_logits(self, frames, labels, training=None):
        """The joint's logits `(B, T', L + 1, outputs)` of `frames` (the
        model's output) for `labels` `(B, L)` (0 after each transcript),
        the lattice the losses read."""
        labels = ops.cast(labels, "int32")
        start = ops.zeros_like(labels[:, :1])  # the blank starts every transcript
        prediction = self.predictor(ops.concatenate([start, labels], axis=1), training=training)
        return self.joint(frames, prediction, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, guard = self.guard_labels(y)
        labels = ops.cast(labels, "int32")
        weights = row_weights(sample_weight, labels)  # (B,) or None
        label_lengths = ops.sum(ops.cast(labels > 0, "int32"), axis=1)
        frame_lengths = ops.cast(y_pred["frame_lengths"], "int32")
        logits = self.joint_logits(y_pred["frames"], labels, training=training)
        classes = self.vocabulary_size + 1
        # A 0 inside a transcript is a blank among its first label_lengths
        # labels: both losses make that row NaN (the step is skipped).
        if self.durations is None:
            losses = rnnt_loss(labels, logits, label_lengths, frame_lengths, blank_index=0)
        else:
            losses = tdt_loss(labels, logits[..., :classes], logits[..., classes:],
                              label_lengths, frame_lengths, self.durations, blank_index=0)
        losses = (losses * guard + sum(self.losses, 0.0)) * self.guard_inputs(x)  # (B,)
        if weights is not None:  # sum(w * loss) / sum(w)
            return BatchMean(name="transducer_loss", reduction="mean_with_sample_weight")(
                losses, losses, sample_weight=weights)
        return BatchMean(name="transducer_loss")(losses, losses)

    def decode(self, inputs, strategy="greedy", beam_width=4):
        """Transcripts: `(B, L)` int32 label ids `1..V`, -1 after each
        one's end (all -2 for a row the model answers NaN, e.g. a length
        outside its array where nothing raised).

        `strategy` is `"greedy"` (`transducer_greedy_decode`) or
        `"beam_search"` (`transducer_beam_search` with `beam_width`), as
        `ConformerCTC.decode` takes them. The walk runs eagerly on the host:
        a step's choice decides the next step's input."""
        if strategy not in ("greedy", "beam_search"):
            raise ValueError("Invalid value for argument `strategy`: 'greedy' or 'beam_search'. "
                             f"Received: strategy={strategy!r}")
        named = inputs if isinstance(inputs, dict) else {"": inputs}
        if any(concrete_value(value) is None for value in named.values()):
            return self._traced_decode(inputs, strategy)
        outputs = model_outputs_for_decoding(self, inputs)
        frames = ops.cast(outputs["frames"], "float32")
        lengths = ops.convert_to_numpy(outputs["frame_lengths"]).astype("int64")
        valid = np.arange(frames.shape[1])[None, :] < lengths[:, None]
        broken = ~np.all(np.isfinite(ops.convert_to_numpy(frames)) | ~valid[:, :, None],
                         axis=(1, 2))
        arguments = dict(blank_id=0, durations=self.durations,
                         max_symbols_per_step=self.max_symbols_per_step)
        if strategy == "beam_search":
            labels = transducer_beam_search(frames, np.where(broken, 0, lengths), self.predictor,
                                            self.joint, beam_width=beam_width, **arguments)
        else:
            labels = transducer_greedy_decode(frames, np.where(broken, 0, lengths),
                                              self.predictor, self.joint, **arguments)
        width = max([len(row) for row in labels] + [1])  # the longest transcript
        decoded = np.full((len(labels), width), -1, "int32")
        for row, ids in enumerate(labels):
            decoded[row, :len(ids)] = ids
        decoded[broken] = -2
        return decoded


    def _traced_decode(self, inputs, strategy):
        """`decode` of traced inputs (a `tf.function`, an export): the
        greedy walk as tensor ops (`transducer_greedy_ids`), `(B, T' x
        max_symbols_per_step)` ids, -1 padded; -2 rows for NaN frames."""
        if strategy != "greedy":
            raise ValueError(
                "A traced decode (an export, a tf.function) walks greedily: the beam search "
                "runs on the host, with values. Received: strategy='beam_search'")
        outputs = self(inputs, training=False)
        frames = ops.cast(outputs["frames"], "float32")
        lengths = ops.cast(outputs["frame_lengths"], "int32")
        valid = ops.expand_dims(ops.arange(ops.shape(frames)[1]), 0) < lengths[:, None]
        broken = ops.any(ops.logical_and(valid[:, :, None], ops.logical_not(
            ops.isfinite(frames))), axis=(1, 2))
        ids = transducer_greedy_ids(
            ops.where(broken[:, None, None], 0.0, frames), ops.where(broken, 0, lengths),
            self.predictor, self.joint, blank_id=0, durations=self.durations,
            max_symbols_per_step=self.max_symbols_per_step)
        return ops.where(broken[:, None], -2, ids)


def build_conformer_transducer(config=DEFAULT_PRESET, **overrides):
    """A `ConformerTransducer` from a `ConformerConfig`, a preset name or a
    dict, with `overrides`: `ConformerConfig` fields (`vocabulary_size` is
    required unless the config has it) and the transducer's own arguments
    (`predictor_dim`, `predictor_layers`, `durations`, `joint_activation`,
    `max_symbols_per_step`).

    Example:

    >>> model = build_conformer_transducer("conformer_tiny", vocabulary_size=12,
    ...                                    durations=[0, 1, 2])
    >>> model.joint.outputs  # the blank, 12 labels, 3 durations
    16
    """
    own = {name: overrides.pop(name) for name in TRANSDUCER_ARGUMENTS if name in overrides}
    config = get_conformer_config(config, **overrides)
    return ConformerTransducer(**dataclasses.asdict(config), **own)
