"""The Conformer encoder with a CTC head, from raw audio to token logits.

```
waveform (B, N), waveform_length (B,)
 -> LogMelFeatures            (B, T, mels), normalised per utterance
 -> SpecAugment               training only, inside valid frames
 -> ConvSubsampling           (B, T/4, D), 10 ms -> 40 ms frames
 -> Dropout
 -> L x ConformerBlock        padding mask from the exact output lengths
 -> Dense(vocabulary + 1)     CTC logits, index 0 = blank
```
"""

import dataclasses

import warnings

import keras
import numpy as np
from keras import ops

from keras_attn._keras_compat import SpecFromCall
from keras_attn._guard import GuardedModel
from keras_attn._guard import IdSpec
from keras_attn._guard import check_ids
from keras_attn._guard import concrete_value
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn._remat import remat_scope
from keras_attn.layers.conformer_block import ConformerBlock
from keras_attn.layers.conv_subsampling import ConvSubsampling
from keras_attn.layers.conv_subsampling import subsampled_length
from keras_attn.layers.log_mel_features import LogMelFeatures
from keras_attn.layers.spec_augment import SpecAugment
from keras_attn.layers.streaming import chunk_mask_of
from keras_attn.models.conformer.conformer_config import DEFAULT_PRESET
from keras_attn.models.conformer.conformer_config import DYNAMIC_CHUNK_MAX
from keras_attn.models.conformer.conformer_config import ConformerConfig
from keras_attn.models.conformer.conformer_config import check_vocabulary_size
from keras_attn.models.conformer.conformer_config import get_conformer_config


class _BatchMean(keras.losses.Loss):
    """The mean of per-example losses (`y_pred`), reduced as Keras reduces a
    compiled loss: under `tf.distribute` each replica's mean is scaled by
    1 / replicas, so the replicas' summed gradients are those of the mean over
    the global batch. A plain `ops.mean` would make them `replicas` times
    larger. No scaling on one device or on JAX."""

    def call(self, y_true, y_pred):
        return y_pred


@keras.saving.register_keras_serializable(package="keras_attn")
class LengthMask(SpecFromCall, keras.layers.Layer):
    """`(B, T, ...)` and lengths `(B,)` -> the `(B, T)` mask `t < length`."""

    def compute_output_shape(self, sequence_shape, lengths_shape):
        return tuple(sequence_shape[:2])

    def call(self, sequence, lengths):
        steps = ops.shape(sequence)[1]
        return ops.less(ops.expand_dims(ops.arange(steps), 0),
                        ops.expand_dims(ops.cast(lengths, "int32"), 1))


@keras.saving.register_keras_serializable(package="keras_attn")
class LengthGuard(SpecFromCall, keras.layers.Layer):
    """`x (B, T', D)` as it is, or NaN for each utterance whose length (in
    frames of `sequence (B, T, ...)`) is negative or past `T`."""

    def compute_output_shape(self, x_shape, sequence_shape, lengths_shape):
        return tuple(x_shape)

    def call(self, x, sequence, lengths):
        lengths = ops.cast(lengths, "int32")
        bad = ops.logical_or(lengths < 0, lengths > ops.shape(sequence)[1])  # (B,)
        return ops.where(ops.expand_dims(bad, (1, 2)), ops.cast(float("nan"), x.dtype), x)


@keras.saving.register_keras_serializable(package="keras_attn")
class ChunkMask(SpecFromCall, keras.layers.Layer):
    """`x (B, T', D)` -> the `(T', T')` chunked attention mask
    (`chunk_attention_mask(T', chunk_size, left_context)`).

    With `dynamic=True`, in training each call (batch) draws its chunk size
    as WeNet's dynamic chunk training does (Zhang et al., 2020, section
    2.3): the whole utterance with probability 1/2, else uniformly in
    `1..max_chunk_size` frames; `chunk_size` at inference.
    """

    def __init__(self, chunk_size, left_context, dynamic=False, max_chunk_size=25,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.chunk_size = chunk_size
        self.left_context = left_context
        self.dynamic = dynamic
        self.max_chunk_size = max_chunk_size
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if dynamic else None

    def compute_output_shape(self, x_shape):
        return (x_shape[1], x_shape[1])

    def call(self, x, training=None):
        steps = ops.shape(x)[1]
        if not (self.dynamic and training):
            return chunk_mask_of(steps, self.chunk_size, self.left_context)
        draw = keras.random.uniform((2,), seed=self.seed_generator)
        drawn = 1 + ops.minimum(ops.cast(draw[1] * self.max_chunk_size, "int32"),
                                self.max_chunk_size - 1)
        # Whole utterance: one chunk at least as long as it.
        size = ops.where(draw[0] < 0.5, ops.maximum(ops.cast(steps, "int32"), 1), drawn)
        return chunk_mask_of(steps, size, self.left_context)

    def get_config(self):
        config = super().get_config()
        config.update({"chunk_size": self.chunk_size, "left_context": self.left_context,
                       "dynamic": self.dynamic, "max_chunk_size": self.max_chunk_size,
                       "seed": self.seed})
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class ConformerCTC(GuardedModel, ConfigModel, keras.Model):
    """A Conformer encoder trained with CTC; build it with `build_conformer`.

    Inputs: `{"waveform": (B, N) float32, "waveform_length": (B,) int32}`,
    or with `input_type="features"` precomputed log-mel features
    `{"features": (B, T, num_mel_bins), "feature_length": (B,) int32}`.
    Outputs: `{"logits": (B, T', vocabulary_size + 1), "logit_lengths": (B,)}`.
    Labels for `fit` are `(B, L)` int token ids in `1..vocabulary_size`,
    padded with 0 (the blank, never a label); the CTC loss uses each
    utterance's own logit and label lengths.
    """

    config_attribute = "conformer_config"

    @config_arguments(ConformerConfig, "Conformer")
    def __init__(self, config, dtype=None, **kwargs):
        check_vocabulary_size("vocabulary_size", config.vocabulary_size, allow_none=False)
        kwargs.setdefault("name", "conformer_ctc")

        # === Layers ===
        frontend = LogMelFeatures(
            sampling_rate=config.sampling_rate, num_mel_bins=config.num_mel_bins,
            frame_length=config.frame_length, frame_step=config.frame_step,
            fft_length=config.fft_length, normalization=config.feature_normalization,
            dtype=dtype, name="log_mel",
        )
        spec_augment = SpecAugment(
            freq_mask_count=config.freq_mask_count, freq_mask_width=config.freq_mask_width,
            time_mask_count=config.time_mask_count, time_mask_ratio=config.time_mask_ratio,
            dtype=dtype, name="spec_augment",
        )
        subsampling = ConvSubsampling(config.hidden_dim, dtype=dtype, name="subsampling")
        input_dropout = keras.layers.Dropout(config.dropout, dtype=dtype, name="input_dropout")
        block_names = [f"conformer_block_{i}" for i in range(config.num_layers)]
        with remat_scope(config.remat, block_names):
            blocks = [
                ConformerBlock(
                    num_heads=config.num_heads, intermediate_dim=config.intermediate_dim,
                    kernel_size=config.kernel_size, dropout=config.dropout,
                    attention_dropout=config.attention_dropout,
                    layer_norm_epsilon=config.layer_norm_epsilon,
                    causal_conv=config.causal_conv, conv_norm=config.conv_norm,
                    dtype=dtype, name=name,
                )
                for name in block_names
            ]
        ctc_head = keras.layers.Dense(config.vocabulary_size + 1, dtype=dtype, name="ctc_logits")

        # === Functional Model ===
        if config.input_type == "waveform":
            waveform = keras.Input((None,), name="waveform")
            waveform_length = keras.Input((), dtype="int32", name="waveform_length")
            inputs = {"waveform": waveform, "waveform_length": waveform_length}
            features = frontend(waveform, waveform_length)  # (B, T, mels)
            frame_lengths = frontend.num_frames(waveform_length)  # (B,)
        else:
            features = keras.Input((None, config.num_mel_bins), name="features")
            frame_lengths = keras.Input((), dtype="int32", name="feature_length")
            inputs = {"features": features, "feature_length": frame_lengths}
        frame_mask = LengthMask(name="frame_mask")(features, frame_lengths)
        x = spec_augment(features, padding_mask=frame_mask)
        x = subsampling(x, padding_mask=frame_mask)  # (B, T', D)
        # NaN for an utterance whose length does not fit its array, after the
        # subsampling's ReLUs (XLA's ReLU turns NaN into 0).
        x = LengthGuard(name="length_guard")(x, features, frame_lengths)
        logit_lengths = subsampled_length(frame_lengths)  # (B,)
        mask = LengthMask(name="encoder_mask")(x, logit_lengths)
        x = input_dropout(x)
        attention_mask = None
        if config.chunk_size is not None:
            attention_mask = ChunkMask(
                config.chunk_size, config.left_context, dynamic=config.dynamic_chunk_training,
                max_chunk_size=DYNAMIC_CHUNK_MAX, dtype=dtype, name="chunk_mask")(x)
        for block in blocks:
            x = block(x, padding_mask=mask, attention_mask=attention_mask)
        logits = ctc_head(x)
        super().__init__(
            inputs=inputs,
            outputs={"logits": logits, "logit_lengths": logit_lengths},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.conformer_config = config
        self.vocabulary_size = config.vocabulary_size

    def label_specs(self):
        return {None: IdSpec(0, self.vocabulary_size + 1, "1..V, 0 pads")}

    # === Streaming (a model built with `chunk_size`) ===

    def streamer(self, chunk_size=None):
        """The `ConformerStreamer` of this model at `chunk_size` encoder
        frames (default: the configured one; another size serves another
        latency, as dynamic chunk training allows), with the configured
        `left_context`; made once per size."""
        from keras_attn.models.conformer.streaming import ConformerStreamer

        config = self.conformer_config
        if config.chunk_size is None:
            raise ValueError(
                "Invalid value for argument `chunk_size`: streaming needs a model built "
                "with chunk_size and left_context (causal_conv=True, "
                "feature_normalization='none'). Received: a model with chunk_size=None"
            )
        chunk_size = config.chunk_size if chunk_size is None else chunk_size
        streamers = self.__dict__.setdefault("_streamers_by_size", {})
        if chunk_size not in streamers:
            streamers[chunk_size] = ConformerStreamer(self, chunk_size, config.left_context)
        return streamers[chunk_size]

    def initial_state(self, batch_size, chunk_size=None):
        """The streaming state before the first chunk of a batch: the
        streamer's (`ConformerStreamer.initial_state`) and `decoder/last`,
        the last frame's greedy token per utterance (-1: none yet), so
        that a token repeated across a chunk boundary is emitted once."""
        state = self.streamer(chunk_size).initial_state(batch_size)
        state["decoder/last"] = ops.full((batch_size,), -1, "int32")
        return state

    def stream_step(self, chunk, state, chunk_length=None, chunk_size=None):
        """Feed the next chunk of a batch of utterances.

        Args:
            chunk: `(B, n)` samples (`n` a multiple of `4 * frame_step`) or,
                with `input_type="features"`, `(B, n, num_mel_bins)`.
            state: the previous step's state (`initial_state` at first);
                never changed, so a refused call leaves it valid.
            chunk_length: `(B,)` valid samples (frames) of each row: a row
                given fewer than `n` has ended (a final partial chunk).
            chunk_size: the size `initial_state` was given.

        Returns:
            `(outputs, new_state)`; `outputs["logits"]` `(B, k,
            vocabulary_size + 1)` are the logits of the `k` encoder frames
            whose attention chunks are complete, those of the offline call
            with the chunk mask; `outputs["token_ids"]` `(B, k)` int32 the
            greedy CTC token each frame emits, -1 where it emits none
            (blank, a repeat of the previous frame's token, this step's
            included, or past the utterance's end): a row's ids `>= 0`,
            over all steps and `flush`, are its greedy transcript.
        """
        streamer, last, rest = self._split_state(state, chunk_size)
        logits, new_state = streamer.stream_step(chunk, rest, chunk_length)
        return self._greedy(logits, state, new_state, last)

    def flush(self, state, chunk_size=None):
        """End of stream: the outputs of the frames still held (the last
        partial chunk), as `stream_step` returns them."""
        streamer, last, rest = self._split_state(state, chunk_size)
        logits, new_state = streamer.flush(rest)
        return self._greedy(logits, state, new_state, last)

    def _split_state(self, state, chunk_size):
        from keras_attn.layers.streaming import check_state_tensor

        streamer = self.streamer(chunk_size)
        if not isinstance(state, dict) or "decoder/last" not in state:
            raise ValueError(
                "Invalid value for argument `state`: the dict `initial_state` returns, "
                "with its 'decoder/last' entry. Received: "
                + (f"state of type {type(state).__name__}" if not isinstance(state, dict)
                   else f"a state holding {sorted(state)[:4]}...")
            )
        last = state["decoder/last"]
        check_state_tensor("decoder/last", last, (None,), "int32")
        rest = {name: value for name, value in state.items() if name != "decoder/last"}
        held = rest.get("logit_length")
        if held is not None and tuple(held.shape) != tuple(last.shape):
            raise ValueError(
                "Invalid value for argument `state`: 'decoder/last' and 'logit_length' "
                f"hold different batch sizes. Received: shapes {tuple(last.shape)} and "
                f"{tuple(held.shape)}"
            )
        return streamer, last, rest

    def _greedy(self, logits, state, new_state, last):
        frames = ops.shape(logits)[1]
        new_state = dict(new_state)
        if frames == 0:
            new_state["decoder/last"] = last
            return {"logits": logits,
                    "token_ids": ops.zeros((ops.shape(logits)[0], 0), "int32")}, new_state
        real = new_state["logit_length"] - state["logit_length"]  # (B,) real frames
        valid = ops.less(ops.expand_dims(ops.arange(frames), 0), ops.expand_dims(real, 1))
        best = ops.cast(ops.argmax(ops.cast(logits, "float32"), axis=-1), "int32")  # (B, k)
        previous = ops.concatenate([ops.expand_dims(last, 1), best[:, :-1]], axis=1)
        keep = valid & ops.not_equal(best, 0) & ops.not_equal(best, previous)
        # The last real frame's token (a blank included) carries on.
        index = ops.maximum(real - 1, 0)
        final = ops.take_along_axis(best, ops.expand_dims(index, 1), axis=1)[:, 0]
        new_state["decoder/last"] = ops.where(real > 0, final, last)
        return {"logits": logits, "token_ids": ops.where(keep, best, -1)}, new_state

    def outputs_are_logits(self):
        return True  # CTC logits: a probability loss is refused

    def check_arrays(self, named):
        if self.conformer_config.input_type == "waveform":
            signal, lengths = named.get("waveform"), named.get("waveform_length")
            name = "waveform_length"
        else:
            signal, lengths = named.get("features"), named.get("feature_length")
            name = "feature_length"
        if signal is None or lengths is None or np.ndim(signal) < 2:
            return
        check_ids(name, lengths, IdSpec(0, np.shape(signal)[1] + 1,
                                        "at most the padded length"))

    def guard_relations(self, named):
        if self.conformer_config.input_type == "waveform":
            signal, lengths = named.get("waveform"), named.get("waveform_length")
        else:
            signal, lengths = named.get("features"), named.get("feature_length")
        if signal is None or lengths is None:
            return 1.0
        lengths = ops.cast(lengths, "int32")
        ok = ops.all(ops.logical_and(lengths >= 0, lengths <= ops.shape(signal)[1]))
        return ops.where(ok, 1.0, float("nan"))

    def _check_data(self, x, y=None):
        super()._check_data(x, y)
        if y is None or isinstance(y, dict):
            return
        named, labels = self._named(x), concrete_value(y)
        if labels is not None and labels.ndim == 2:
            gaps = _interior_padding(labels)
            if np.any(gaps):
                rows = np.flatnonzero(gaps)
                raise ValueError(
                    "`labels` must be each transcript's ids followed by 0s (the "
                    "padding); a 0 between two labels would train on a "
                    f"transcript that is neither. Received: labels with a 0 "
                    f"inside row(s) {rows[:5].tolist()}, e.g. {labels[rows[0]].tolist()}"
                )
        frames = self._frames(named)
        if labels is None or frames is None or labels.ndim != 2:
            return
        needed = ctc_frames_needed(labels)
        emitted = frames
        for _ in range(2):  # subsampled_length, in NumPy
            emitted = np.maximum((emitted - 3) // 2 + 1, 0)
        short = int(np.sum(needed > emitted))
        if short:
            warnings.warn(
                f"{short} of {len(labels)} utterance(s) have more labels than "
                "their logits can emit after 4x subsampling (CTC needs one frame "
                "per label plus one between repeated labels); their loss is "
                "NaN, so a training step on them is skipped and fit stops "
                "there. Received: "
                f"labels needing {needed[needed > emitted][:5].tolist()} frames, "
                f"logits of {emitted[needed > emitted][:5].tolist()}",
                stacklevel=3,
            )

    def _frames(self, named):
        """Feature frames per utterance `(B,)` from concrete inputs, or None."""
        if "waveform_length" in named:
            lengths = np.asarray(named["waveform_length"]).astype("int64")
            return 1 + lengths // self.conformer_config.frame_step
        if "feature_length" in named:
            return np.asarray(named["feature_length"]).astype("int64")
        return None

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, guard = self.guard_labels(y)
        labels = ops.cast(labels, "int32")
        label_lengths = ops.sum(ops.cast(labels > 0, "int32"), axis=1)
        logit_lengths = ops.cast(y_pred["logit_lengths"], "int32")
        # Where Python cannot refuse them (`_check_data`), labels with a 0
        # inside and transcripts longer than their logits can emit make the
        # loss NaN, so the step is skipped: never a finite loss on a
        # transcript that is not the one given, nor CTC's clipped value for
        # an impossible alignment (706.9 on TensorFlow, 99999.3 on JAX).
        real = labels > 0
        gaps = ops.any(ops.logical_and(ops.logical_not(real[:, :-1]), real[:, 1:]), axis=1)
        repeats = ops.logical_and(real[:, 1:], ops.equal(labels[:, 1:], labels[:, :-1]))
        needed = label_lengths + ops.sum(ops.cast(repeats, "int32"), axis=1)  # (B,)
        feasible = ops.logical_and(ops.logical_not(gaps), needed <= logit_lengths)
        guard = guard * ops.where(feasible, 1.0, float("nan"))  # (B,)
        losses = ops.ctc_loss(
            labels,
            ops.cast(y_pred["logits"], "float32"),
            label_lengths,
            logit_lengths,
            mask_index=0,
        )  # (B,)
        # The regularization losses added to every utterance add them once
        # to the mean, scaled for the replicas like the CTC term; a label out
        # of range makes the loss NaN (the step is skipped).
        losses = (losses + sum(self.losses, 0.0)) * guard * self.guard_inputs(x)  # (B,)
        return _BatchMean(name="ctc_loss")(losses, losses)

    def decode(self, inputs, strategy="greedy", beam_width=16):
        """Token ids `(B, T')`, -1 after each transcript's end.

        `strategy` is `"greedy"` or `"beam_search"` (keras.ops.ctc_decode).
        On JAX, inputs whose values exist now (NumPy arrays, JAX arrays) go
        through the model's predict step (`predict_on_batch`, compiled unless
        the model was compiled with `jit_compile=False`; checked first like a
        call): called op by op, JAX compiled every primitive of the encoder
        again, ~8 s a batch for a tiny model on the CPU. TensorFlow and
        PyTorch run eager calls fast and call the model directly, as do
        traced inputs (a `tf.function` export).
        """
        named = inputs if isinstance(inputs, dict) else {"": inputs}
        values = {name: concrete_value(value) for name, value in named.items()}
        if keras.backend.backend() == "jax" and all(v is not None for v in values.values()):
            self.check_inputs(inputs)
            concrete = values if isinstance(inputs, dict) else values[""]
            outputs = self._keeping_variables(lambda: self.predict_on_batch(concrete))
        else:
            outputs = self(inputs, training=False)
        decoded, _ = ops.ctc_decode(
            ops.cast(outputs["logits"], "float32"),
            ops.cast(outputs["logit_lengths"], "int32"),
            strategy=strategy,
            beam_width=beam_width,
            mask_index=0,
        )
        return decoded[0]


def ctc_greedy_ids(logits, lengths, blank=0):
    """Greedy CTC decoding in `keras.ops` only: the best token of each of
    an utterance's first `length` frames, repeats merged, blanks dropped.

    `keras.ops.ctc_decode` gives the same tokens, but on TensorFlow it is a
    sparse CTC kernel that neither tf2onnx nor LiteRT converts; this is
    argmax, comparisons, a cumulative sum and a scatter by comparison, which both
    hold. Returns int32 `(B, T)` ids, each row's transcript first and -1
    after it (the width is the frames', not the longest transcript's). A
    row whose logits hold NaN (the model's answer to a length past the
    waveform or below 0) is all -2: never a plausible transcript.

    >>> logits = np.log(np.eye(4)[[[1, 1, 0, 1, 2, 3, 3]]] + 1e-3)
    >>> np.asarray(ctc_greedy_ids(logits, np.array([6]))).tolist()
    [[1, 1, 2, 3, -1, -1, -1]]
    """
    # The first maximum, found without `ops.argmax` of floats: on TensorFlow
    # that checks for -0.0 with a bitcast, which ONNX has no op for.
    is_best = ops.greater_equal(logits, ops.max(logits, axis=-1, keepdims=True))
    best = ops.cast(ops.argmax(ops.cast(is_best, "int32"), axis=-1), "int32")  # (B, T)
    steps = ops.shape(best)[1]
    valid = ops.less(ops.expand_dims(ops.arange(steps), 0),
                     ops.expand_dims(ops.cast(lengths, "int32"), 1))
    previous = ops.pad(best[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
    keep = valid & ops.not_equal(best, blank) & ops.not_equal(best, previous)
    slot = ops.cumsum(ops.cast(keep, "int32"), axis=1) - 1  # where each kept token goes
    slot = ops.where(keep, slot, -1)  # dropped frames go nowhere
    columns = ops.expand_dims(ops.arange(steps), (0, 1))  # (1, 1, T)
    scatter = ops.cast(ops.equal(ops.expand_dims(slot, -1), columns), "int32")  # (B, T, T)
    placed = ops.sum(scatter * ops.expand_dims(best + 1, -1), axis=1)  # (B, T): id + 1 or 0
    broken = ops.any(ops.isnan(ops.cast(logits, "float32")), axis=(1, 2))  # (B,)
    return ops.where(ops.expand_dims(broken, 1), -2, placed - 1)


def _interior_padding(labels):
    """`(B,)`: whether each row of `labels` `(B, L)` has a 0 before a label."""
    real = np.asarray(labels) > 0
    return np.any(~real[:, :-1] & real[:, 1:], axis=1)


def ctc_frames_needed(labels):
    """Frames CTC needs to emit each row of `labels` `(B, L)` (0 pads): one
    per label plus one blank between two equal labels in a row.

    >>> ctc_frames_needed(np.array([[3, 3, 4, 0], [1, 2, 0, 0]])).tolist()
    [4, 2]
    """
    labels = np.asarray(labels)
    real = labels > 0
    repeats = real[:, 1:] & (labels[:, 1:] == labels[:, :-1])
    return real.sum(axis=1) + repeats.sum(axis=1)


def build_conformer(config=DEFAULT_PRESET, **overrides):
    """A `ConformerCTC` from a `ConformerConfig`, a preset name or a dict,
    with `overrides` (fields; `vocabulary_size` is required unless the config
    has it) applied.

    Example:

    >>> model = build_conformer("conformer_tiny", vocabulary_size=12)
    >>> model.output["logits"].shape
    (None, None, 13)
    """
    config = get_conformer_config(config, **overrides)
    return ConformerCTC(**dataclasses.asdict(config))
