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
from keras_attn.models.conformer.conformer_model import ChunkStreaming
from keras_attn.models.conformer.conformer_model import BatchMean
from keras_attn.models.conformer.conformer_model import interior_padding
from keras_attn.models.conformer.conformer_model import row_weights
from keras_attn.models.conformer.conformer_model import with_new_vocabulary
from keras_attn.models.conformer.conformer_model import conformer_encoder_graph
from keras_attn.models.conformer.conformer_model import model_outputs_for_decoding
from keras_attn.models.conformer.transducer_decoding import check_durations
from keras_attn.models.conformer.transducer_decoding import greedy_walk
from keras_attn.models.conformer.transducer_decoding import transducer_beam_search
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_decode
from keras_attn.models.conformer.transducer_decoding import transducer_greedy_ids
from keras_attn.training.transducer_loss import rnnt_loss
from keras_attn.training.transducer_loss import tdt_loss

# The transducer's own arguments, beside the encoder's ConformerConfig fields.
TRANSDUCER_ARGUMENTS = ("predictor_dim", "predictor_layers", "durations", "joint_activation",
                        "max_symbols_per_step")


@keras.saving.register_keras_serializable(package="keras_attn")
class ConformerTransducer(ChunkStreaming, AudioInputChecks, GuardedModel, ConfigModel, keras.Model):
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

    Built with `chunk_size` and `left_context` (causal convolution
    modules, no per-utterance feature normalisation) it streams, as
    `ConformerCTC` does: `initial_state`, `stream_step` and `flush` give the
    labels of each chunk as it completes, with the prediction network's
    state carried from chunk to chunk; a row's labels over all steps are the
    greedy transcript `decode` gives offline (the same chunk mask).

    Args (beside `ConformerConfig`'s fields):
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
    # Data checks: a transcript needs one frame, not CTC's one per label
    # (keras_attn.data.checks).
    ctc_alignment = False

    @config_arguments(ConformerConfig, "Conformer", extra=TRANSDUCER_ARGUMENTS)
    def __init__(self, config, dtype=None, predictor_dim=None, predictor_layers=None,
                 durations=None, joint_activation=None, max_symbols_per_step=None, **kwargs):
        check_vocabulary_size("vocabulary_size", config.vocabulary_size, allow_none=False)
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

    # === Streaming (a model built with `chunk_size`) ===

    def initial_state(self, batch_size, chunk_size=None):
        """The streaming state before the first chunk of a batch: the
        encoder streamer's (`ConformerStreamer.initial_state`) and the
        decoder's: the prediction network's output and LSTM states after
        the start symbol (`decoder/prediction`, `decoder/lstm_<i>`: h, c of
        each layer), and `decoder/skip`, the frames a TDT walk moved past
        the last chunk's end (0 for RNN-T)."""
        state = self.streamer(chunk_size).initial_state(batch_size)
        prediction, states = self.predictor.step(ops.zeros((batch_size,), "int32"))
        state["decoder/prediction"] = prediction
        state.update({f"decoder/lstm_{i}": value for i, value in enumerate(states)})
        state["decoder/skip"] = ops.zeros((batch_size,), "int32")
        return state

    def stream_step(self, chunk, state, chunk_length=None, chunk_size=None):
        """Feed the next chunk of a batch of utterances.

        Args are `ConformerCTC.stream_step`'s: `chunk` `(B, n)` samples
        (`n` a multiple of `4 * frame_step`; `8 * frame_step` with
        `subsampling="fast"`) or `(B, n, num_mel_bins)` features,
        `state` (never changed: a refused call leaves it valid),
        `chunk_length` `(B,)` valid samples (frames) of each row, and the
        `chunk_size` `initial_state` was given.

        Returns:
            `(outputs, new_state)`: `outputs["frames"]` `(B, k,
            predictor_dim)`, the projected encoder frames of the `k`
            frames whose attention chunks are complete, and
            `outputs["token_ids"]` `(B, m)` int32, the labels (`1..V`) the
            greedy walk emitted from them, -1 after each row's last. A
            row's ids `>= 0` over all steps and `flush` are its greedy
            transcript, `decode`'s.
        """
        streamer, decoder, rest = self._split_state(state, chunk_size)
        frames, new_state = streamer.stream_step(chunk, rest, chunk_length)
        return self._walk_chunk(frames, state, new_state, decoder)

    def flush(self, state, chunk_size=None):
        """End of stream: the outputs of the frames still held (the last
        partial chunk), as `stream_step` returns them."""
        streamer, decoder, rest = self._split_state(state, chunk_size)
        frames, new_state = streamer.flush(rest)
        return self._walk_chunk(frames, state, new_state, decoder)

    def decoder_state_names(self):
        """The streaming state's decoder entries, in order (the exported
        step carries them as its own state tensors)."""
        return (["decoder/prediction"]
                + [f"decoder/lstm_{i}" for i in range(2 * self.predictor_layers)]
                + ["decoder/skip"])

    def _split_state(self, state, chunk_size):
        from keras_attn.layers.streaming import check_counter
        from keras_attn.layers.streaming import check_state_tensor

        streamer = self.streamer(chunk_size)
        names = self.decoder_state_names()
        if not isinstance(state, dict) or any(name not in state for name in names):
            raise ValueError(
                "Invalid value for argument `state`: the dict this model's `initial_state` "
                f"returns, with its decoder entries {names}. Received: "
                + (f"state of type {type(state).__name__}" if not isinstance(state, dict)
                   else f"a state missing {[n for n in names if n not in state]}"))
        decoder = {name: state[name] for name in names}
        rest = {name: value for name, value in state.items() if name not in decoder}
        held = rest.get("logit_length")
        batch = None if held is None else held.shape[0]
        dtype = self.predictor.compute_dtype
        for name in names[:-1]:
            check_state_tensor(name, decoder[name], (batch, self.predictor_dim), dtype)
        check_state_tensor("decoder/skip", decoder["decoder/skip"], (batch,), "int32")
        check_counter("decoder/skip", decoder["decoder/skip"], "frames past the last chunk")
        return streamer, decoder, rest

    def _walk_chunk(self, frames, state, new_state, decoder):
        """The greedy walk over a chunk's frames from the decoder's state."""
        batch, count = frames.shape[0], frames.shape[1]
        real = ops.convert_to_numpy(new_state["logit_length"] - state["logit_length"])
        names = self.decoder_state_names()
        steps = None if self.durations is None else check_durations(self.durations)
        labels, _, pointer, prediction, states = greedy_walk(
            ops.cast(frames, "float32"), real.astype("int64"), self.predictor, self.joint, 0,
            steps, self.max_symbols_per_step,
            ops.convert_to_numpy(decoder["decoder/skip"]).astype("int64"),
            decoder["decoder/prediction"], [decoder[name] for name in names[1:-1]])
        new_state = dict(new_state)
        new_state["decoder/prediction"] = prediction
        new_state.update(dict(zip(names[1:-1], states)))
        # Where the walk stopped past this chunk's frames: a TDT move beyond
        # its end skips the next chunk's first frames (a row that ended
        # walks no more).
        new_state["decoder/skip"] = ops.convert_to_tensor(np.maximum(pointer - count, 0), "int32")
        token_ids = np.full((batch, max([len(row) for row in labels] + [0])), -1, "int32")
        for row, ids in enumerate(labels):
            token_ids[row, :len(ids)] = ids
        return {"frames": frames, "token_ids": ops.convert_to_tensor(token_ids)}, new_state

    def _traced_decode(self, inputs, strategy):
        """`decode` of traced inputs (a `tf.function`, an export): the
        greedy walk as tensor ops (`transducer_greedy_ids`), `(B, T' x
        max_symbols_per_step)` ids, -1 padded; -2 rows for NaN frames."""
        if strategy != "greedy":
            raise ValueError(
                "A traced decode (an export, a tf.function) walks greedily: the beam search "
                "runs on the host, with values. Received: strategy='beam_search'")
        outputs = self(inputs, training=False)
        return self.greedy_ids(outputs["frames"], outputs["frame_lengths"])

    def greedy_ids(self, frames, frame_lengths):
        """The greedy walk over the model's outputs as tensor ops
        (`transducer_greedy_ids`: an export's graph holds it): `(B, T' x
        max_symbols_per_step)` int32 ids, -1 padded; all -2 for a row
        whose valid frames are not finite."""
        frames = ops.cast(frames, "float32")
        lengths = ops.cast(frame_lengths, "int32")
        # expand_dims, not [:, None]: LiteRT has no strided slice of bools
        # that adds an axis.
        valid = ops.expand_dims(ops.arange(ops.shape(frames)[1]), 0) < ops.expand_dims(lengths, 1)
        broken = ops.any(ops.logical_and(ops.expand_dims(valid, 2), ops.logical_not(
            ops.isfinite(frames))), axis=(1, 2))
        ids = transducer_greedy_ids(
            ops.where(ops.expand_dims(broken, (1, 2)), 0.0, frames),
            ops.where(broken, 0, lengths), self.predictor, self.joint, blank_id=0,
            durations=self.durations, max_symbols_per_step=self.max_symbols_per_step)
        return ops.where(ops.expand_dims(broken, 1), -2, ids)


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
