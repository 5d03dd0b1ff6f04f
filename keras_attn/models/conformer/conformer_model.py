"""The Conformer encoder with a CTC head, from raw audio to token logits.

```
waveform (B, N), waveform_length (B,)
 -> LogMelFeatures            (B, T, mels), normalised per utterance (or, with
                              front_end="parakeet", ParakeetLogMelFeatures)
 -> SpecAugment               training only, inside valid frames
 -> ConvSubsampling           (B, T/4, D), 10 ms -> 40 ms frames (or, with
                              subsampling="fast", FastConvSubsampling: (B, T/8, D),
                              the FastConformer's; x sqrt(D) with scale_input)
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
from keras_attn._guard import IdSpec
from keras_attn._guard import check_ids
from keras_attn._guard import concrete_value
from keras_attn.models._config import ConfigModel
from keras_attn.models._config import config_arguments
from keras_attn._remat import remat_scope
from keras_attn._checks import check_static_shape
from keras_attn.ops.masking import integer_ids
from keras_attn.ops.masking import checked_positions
from keras_attn.ops.masking import nan_where
from keras_attn.models._guarded import GuardedModel
from keras_attn.models._packing import any_invalid
from keras_attn.models._packing import packed_inputs
from keras_attn.models._packing import refused
from keras_attn.layers.conformer_block import ConformerBlock
from keras_attn.layers.conv_subsampling import SUBSAMPLING
from keras_attn.layers.conv_subsampling import ConvSubsampling
from keras_attn.layers.conv_subsampling import subsampled_segment_ids
from keras_attn.layers.fast_conv_subsampling import FastConvSubsampling
from keras_attn.layers.log_mel_features import LogMelFeatures
from keras_attn.layers.log_mel_features import outside_lengths
from keras_attn.layers.parakeet_log_mel_features import ParakeetLogMelFeatures
from keras_attn.layers.streaming import check_audio_range
from keras_attn.layers.spec_augment import SpecAugment
from keras_attn.layers.streaming import chunk_mask_of
from keras_attn.models.conformer.conformer_config import DEFAULT_PRESET
from keras_attn.models.conformer.conformer_config import DYNAMIC_CHUNK_MAX
from keras_attn.models.conformer.conformer_config import FINE_TUNING_FIELDS
from keras_attn.models.conformer.conformer_config import ConformerConfig
from keras_attn.models.conformer.conformer_config import check_vocabulary_size
from keras_attn.models.conformer.conformer_config import encoder_length
from keras_attn.models.conformer.conformer_config import feature_frames
from keras_attn.models.conformer.conformer_config import get_conformer_config
from keras_attn.models.conformer.conformer_config import replace_conformer_config

# The most labels `ConformerCTC.with_vocabulary` gives a new head: 2**20, four
# times the largest published text vocabularies (~256k); a CTC vocabulary is
# a few thousand. Above it the head's (hidden_dim, V + 1) kernel would be
# built before anything says the number is wrong.
MAX_NEW_VOCABULARY = 2**20


class BatchMean(keras.losses.Loss):
    """The mean of per-example losses (`y_pred`), reduced as Keras reduces a
    compiled loss: under `tf.distribute` each replica's mean is scaled by
    1 / replicas, so the replicas' summed gradients are those of the mean over
    the global batch. A plain `ops.mean` would make them `replicas` times
    larger. No scaling on one device or on JAX."""

    def call(self, y_true, y_pred):
        return y_pred


def row_weights(sample_weight, labels):
    """`sample_weight` as one float32 weight per row `(B,)` (an utterance,
    or a packed row's utterances), or None; `ValueError` for another shape."""
    if sample_weight is None:
        return None
    weights = ops.convert_to_tensor(sample_weight)
    shape = tuple(weights.shape)
    if len(shape) == 2 and shape[1] == 1:
        weights, shape = ops.squeeze(weights, axis=1), shape[:1]
    rows = labels.shape[0]
    if len(shape) != 1 or (None not in (shape[0], rows) and shape[0] != rows):
        raise ValueError(
            "`sample_weight` of ConformerCTC must hold one weight per utterance (per "
            f"packed row), shape (B,) or (B, 1) for labels of B={rows} rows. "
            f"Received: sample_weight of shape {shape}")
    return ops.cast(weights, "float32")


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
    frames of `sequence (B, T, F)`) is negative or past `T`, or whose valid
    frames of `sequence` hold a value that is not finite (the front end's
    NaN rows, e.g. for audio outside [-1, 1]: the subsampling's ReLUs
    would turn them into zeros under XLA)."""

    def compute_output_shape(self, x_shape, sequence_shape, lengths_shape):
        return tuple(x_shape)

    def call(self, x, sequence, lengths):
        steps = ops.shape(sequence)[1]
        bad = outside_lengths(lengths, steps)  # (B,), in the lengths' dtype
        valid = ops.less(ops.expand_dims(ops.arange(steps), 0),
                         ops.expand_dims(ops.cast(lengths, "int32"), 1))  # (B, T)
        broken = ops.logical_and(ops.expand_dims(valid, -1),
                                 ops.logical_not(ops.isfinite(sequence)))
        bad = ops.logical_or(bad, ops.any(broken, axis=(1, 2)))
        return ops.where(ops.expand_dims(bad, (1, 2)), ops.cast(float("nan"), x.dtype), x)


def _chunk_mask_at(positions, chunk_size, left_context):
    """`chunk_mask_of` for frames at `positions` `(B, T)` (each frame's
    position in its utterance): `(B, T, T)`, query `t` seeing key `s` when
    `s`'s position lies in `t`'s chunk or the `left_context` before it
    (the segment mask keeps the other utterances out)."""
    start = (positions // chunk_size) * chunk_size  # (B, T): each frame's chunk start
    queries, keys = ops.expand_dims(start, 2), ops.expand_dims(positions, 1)
    return ops.logical_and(ops.greater_equal(keys, queries - left_context),
                           ops.less(keys, queries + chunk_size))


@keras.saving.register_keras_serializable(package="keras_attn")
class ChunkMask(SpecFromCall, keras.layers.Layer):
    """`x (B, T', D)` -> the `(T', T')` chunked attention mask
    (`chunk_attention_mask(T', chunk_size, left_context)`).

    With `dynamic=True`, in training each call (batch) draws its chunk size
    as WeNet's dynamic chunk training does (Zhang et al., 2020, section
    2.3): the whole utterance with probability 1/2, else uniformly in
    `1..max_chunk_size` frames; `chunk_size` at inference.

    With `positions` `(B, T')` (packed utterances: each frame's position in
    its utterance) the chunks are counted in each utterance from its first
    frame, as alone: a `(B, T', T')` mask.
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

    def call(self, x, training=None, positions=None):
        steps = ops.shape(x)[1]
        mask_of = chunk_mask_of if positions is None else (
            lambda _, size, left: _chunk_mask_at(positions, size, left))
        if not (self.dynamic and training):
            return mask_of(steps, self.chunk_size, self.left_context)
        draw = keras.random.uniform((2,), seed=self.seed_generator)
        drawn = 1 + ops.minimum(ops.cast(draw[1] * self.max_chunk_size, "int32"),
                                self.max_chunk_size - 1)
        # Whole utterance: one chunk at least as long as it.
        size = ops.where(draw[0] < 0.5, ops.maximum(ops.cast(steps, "int32"), 1), drawn)
        return mask_of(steps, size, self.left_context)

    def get_config(self):
        config = super().get_config()
        config.update({"chunk_size": self.chunk_size, "left_context": self.left_context,
                       "dynamic": self.dynamic, "max_chunk_size": self.max_chunk_size,
                       "seed": self.seed})
        return config


def conformer_encoder_graph(config, dtype=None, make_head=None):
    """The Conformer encoder's functional graph, shared by `ConformerCTC`
    and `ConformerTransducer` (the same layer names, so the same weight
    paths and converter layout): the inputs `input_type` says, the last
    block's frames `(B, T', hidden_dim)`, their lengths `(B,)`, and the
    layer `make_head()` made (None without it). The head is made after the
    encoder's layers and before they are called, where `ConformerCTC` has
    always made it: a layer's initializers take their default seeds when it
    is made, so the order keeps a seeded model's weights what they were."""
    frontend = log_mel_front_end(config, dtype=dtype)
    spec_augment = SpecAugment(
        freq_mask_count=config.freq_mask_count, freq_mask_width=config.freq_mask_width,
        time_mask_count=config.time_mask_count, time_mask_ratio=config.time_mask_ratio,
        dtype=dtype, name="spec_augment",
    )
    if config.subsampling == "fast":
        subsampling = FastConvSubsampling(
            config.hidden_dim, filters=config.subsampling_filters, dtype=dtype,
            name="subsampling")
    else:
        subsampling = ConvSubsampling(config.hidden_dim, filters=config.subsampling_filters,
                                      dtype=dtype, name="subsampling")
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
                batch_norm_epsilon=config.batch_norm_epsilon,
                dtype=dtype, name=name,
            )
            for name in block_names
        ]
    head = None if make_head is None else make_head()
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
    if config.scale_input:  # Parakeet's xscale
        x = x * float(config.hidden_dim) ** 0.5
    logit_lengths = encoder_length(config, frame_lengths)  # (B,)
    mask = LengthMask(name="encoder_mask")(x, logit_lengths)
    x = input_dropout(x)
    attention_mask = None
    if config.chunk_size is not None:
        attention_mask = ChunkMask(
            config.chunk_size, config.left_context, dynamic=config.dynamic_chunk_training,
            max_chunk_size=DYNAMIC_CHUNK_MAX, dtype=dtype, name="chunk_mask")(x)
    for block in blocks:
        x = block(x, padding_mask=mask, attention_mask=attention_mask)
    return inputs, x, logit_lengths, head


class ChunkStreaming:
    """`streamer`, shared by `ConformerCTC` and `ConformerTransducer` (a
    model built with `chunk_size`): the encoder's `ConformerStreamer` at a
    chunk size, which each model's `stream_step` decodes its own way."""

    def streamer(self, chunk_size=None):
        """The `ConformerStreamer` of this model's encoder at `chunk_size` encoder
        frames (default: the configured one; another size serves another
        latency, as dynamic chunk training allows), with the configured
        `left_context`; made once per size."""
        from keras_attn.models.conformer.streaming import ConformerStreamer

        config = self.conformer_config
        if config.input_type == "waveform" and config.front_end == "parakeet":
            # Named first: a chunk_size would be refused for the same reason.
            raise ValueError(
                "A model on waveforms streams with the package's front end "
                "(front_end='log_mel', feature_normalization='none'); the \"parakeet\" "
                "front end normalises each feature over the whole utterance, which a "
                "stream cannot know. Received: a model with front_end='parakeet', "
                "input_type='waveform'"
            )
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


class AudioInputChecks:
    """The checks of a Conformer's audio inputs, shared by `ConformerCTC`
    and `ConformerTransducer` (mixed in before `GuardedModel`): lengths
    within their arrays and finite samples in [-1, 1] in Python, the same
    as a loss factor in a compiled step, and NaN outputs for a wide length
    that `Functional`'s int32 cast would wrap."""

    def check_arrays(self, named):
        if self.conformer_config.input_type == "waveform":
            signal, lengths = named.get("waveform"), named.get("waveform_length")
            name = "waveform_length"
        else:
            signal, lengths = named.get("features"), named.get("feature_length")
            name = "feature_length"
        if signal is None or np.ndim(signal) < 2:
            return
        if lengths is not None:
            check_ids(name, lengths, IdSpec(0, np.shape(signal)[1] + 1,
                                            "at most the padded length"))
        if self.conformer_config.input_type == "waveform" and np.ndim(signal) == 2:
            # The valid samples only: padding may hold anything. Outside
            # [-1, 1] the front end makes NaN features (a compiled step
            # cannot raise); here the sample is named first.
            values = np.asarray(signal, "float32")
            if lengths is not None:
                valid = np.arange(values.shape[1])[None, :] < np.asarray(lengths).reshape(-1, 1)
                values = np.where(valid, values, 0.0)
            if not np.isfinite(values).all():
                rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
                raise ValueError(
                    "Invalid value for argument `waveform`: audio samples must be finite. "
                    f"Received: waveform with NaN or inf in row(s) {rows.tolist()}")
            check_audio_range("waveform", values)

    def guard_relations(self, named):
        if self.conformer_config.input_type == "waveform":
            signal, lengths = named.get("waveform"), named.get("waveform_length")
        else:
            signal, lengths = named.get("features"), named.get("feature_length")
        if signal is None:
            return 1.0
        guard = 1.0
        if self.conformer_config.input_type == "waveform" and len(signal.shape) == 2:
            # A valid sample outside [-1, 1] (the front end's NaN features
            # do not survive every op under XLA: the loss checks it itself).
            loud = ops.greater(ops.abs(ops.cast(signal, "float32")), 1.0)
            if lengths is not None:
                index = ops.expand_dims(ops.arange(ops.shape(signal)[1]), 0)
                loud = ops.logical_and(loud, ops.less(index, ops.expand_dims(
                    ops.cast(lengths, "int32"), 1)))
            guard = ops.where(ops.any(loud), float("nan"), 1.0)
        if lengths is None:
            return guard
        # In the lengths' own dtype: an int64 2**32 + 3 cast first would wrap to 3.
        ok = ops.logical_not(ops.any(outside_lengths(lengths, ops.shape(signal)[1])))
        return guard * ops.where(ok, 1.0, float("nan"))

    def _frames(self, named):
        """Feature frames per utterance `(B,)` from concrete inputs, or None."""
        if "waveform_length" in named:
            lengths = np.asarray(named["waveform_length"]).astype("int64")
            return feature_frames(self.conformer_config, lengths)
        if "feature_length" in named:
            return np.asarray(named["feature_length"]).astype("int64")
        return None

    def _nan_where_lengths_wrap(self, inputs, outputs):
        """`outputs` with NaN in `outputs[self.nan_output_key]` (the
        logits, the frames) for each utterance whose length, of a
        dtype wider than the graph's int32 input, lies outside `[0, N]`:
        `Functional` casts the input to int32 first, which wraps an int64
        2**32 + 3 to a valid 3 (a call with values is refused before this,
        by `check_inputs`)."""
        named = self._named_tensors(inputs)
        if self.conformer_config.input_type == "waveform":
            signal, lengths = named.get("waveform"), named.get("waveform_length")
        else:
            signal, lengths = named.get("features"), named.get("feature_length")
        if signal is None or lengths is None or isinstance(lengths, keras.KerasTensor):
            return outputs
        lengths = ops.convert_to_tensor(lengths)
        if keras.backend.standardize_dtype(lengths.dtype) not in ("int64", "uint32", "uint64"):
            return outputs
        bad = outside_lengths(lengths, ops.shape(signal)[1])  # (B,)
        key = self.nan_output_key
        value = outputs[key]
        return dict(outputs, **{key: ops.where(ops.expand_dims(bad, (1, 2)),
                                               ops.cast(float("nan"), value.dtype), value)})


@keras.saving.register_keras_serializable(package="keras_attn")
class ConformerCTC(ChunkStreaming, AudioInputChecks, GuardedModel, ConfigModel, keras.Model):
    """A Conformer encoder trained with CTC; build it with `build_conformer`.

    Inputs: `{"waveform": (B, N) float32, "waveform_length": (B,) int32}`,
    or with `input_type="features"` precomputed log-mel features
    `{"features": (B, T, num_mel_bins), "feature_length": (B,) int32}`.
    Outputs: `{"logits": (B, T', vocabulary_size + 1), "logit_lengths": (B,)}`.
    Labels for `fit` are `(B, L)` int token ids in `1..vocabulary_size`,
    padded with 0 (the blank, never a label); the CTC loss uses each
    utterance's own logit and label lengths. The loss is the mean of the
    utterances' CTC losses; with `fit(sample_weight=...)` (one weight per
    utterance, `(B,)`), their weighted mean `sum(w * loss) / sum(w)`.

    Packed utterances (docs/packing.md; `input_type="features"`): a dict of
    `features` `(B, T, num_mel_bins)`, `feature_length` (the rows' length
    `T` will do) and the optional inputs `segment_ids` and `positions`
    `(B, T)` int, as `keras_attn.data.packing.pack_utterances` gives them
    (each utterance starting at a multiple of 4 frames). The attention is
    block-diagonal by utterance and the convolutions read each utterance's
    own frames, so each utterance gets at inference the logits it gets
    alone. The outputs add
    `logit_segment_ids` `(B, T')`, the utterance of each logit frame (0
    between utterances); `unpack_utterances` gives each utterance's logits.
    Labels are `(B, K, L)`, one transcript per utterance of a row (0 past
    its last), and the loss is the mean over the batch's utterances of
    their CTC losses, as for the same utterances padded one per row (with
    `sample_weight` `(B,)`, each utterance weighs its row's weight). A bad
    packing (see `keras_attn.ops.masking.SEGMENT_RULE`, an utterance not
    starting at a multiple of 4) is a `ValueError` naming the input in an
    eager call and NaN for that row in a compiled step.
    """

    config_attribute = "conformer_config"
    nan_output_key = "logits"

    @config_arguments(ConformerConfig, "Conformer")
    def __init__(self, config, dtype=None, **kwargs):
        check_vocabulary_size("vocabulary_size", config.vocabulary_size, allow_none=False)
        kwargs.setdefault("name", "conformer_ctc")

        inputs, x, logit_lengths, ctc_head = conformer_encoder_graph(
            config, dtype=dtype, make_head=lambda: keras.layers.Dense(
                config.vocabulary_size + 1, dtype=dtype, name="ctc_logits"))
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

    # === A new vocabulary (fine-tuning) ===

    def with_vocabulary(self, vocabulary_size, dtype=None, **overrides):
        """A new `ConformerCTC` with this model's encoder and a fresh CTC
        head over another vocabulary: what transformers'
        `from_pretrained(..., vocab_size=N, ignore_mismatched_sizes=True)`
        gives, e.g. a Parakeet checkpoint (1,024 SentencePiece tokens) to
        fine-tune on your transcripts' characters.

        Every weight but the head's (`ctc_logits`) is copied by its path,
        the BatchNorm statistics included; the head is drawn anew (seeded by
        `keras.utils.set_random_seed`). This model is left as it is.

        Args:
            vocabulary_size: the new labels 1..V (0 is the CTC blank): the
                head has `vocabulary_size + 1` outputs.
            dtype: the new model's dtype policy (e.g. `"mixed_bfloat16"`);
                None: this model's.
            **overrides: fields of `FINE_TUNING_FIELDS` to set anew
                (`dropout`, `attention_dropout`, SpecAugment's mask counts
                and widths, `remat`, `input_type`): none holds a weight.

        Returns:
            A `ConformerCTC` of this model's config with `vocabulary_size`
            and `overrides`.

        Raises:
            ValueError: a `vocabulary_size` that is not a positive int or is
                above `MAX_NEW_VOCABULARY` (2**20, checked before the head is
                built), an
                override of another field (it would change the encoder), or
                a model whose weights are not those its config builds (e.g.
                with LoRA adapters: merge them first).

        Example:

        >>> model = build_conformer("parakeet_ctc_tiny", vocabulary_size=1024)
        >>> mine = model.with_vocabulary(28)  # a-z, apostrophe and space
        >>> mine.output["logits"].shape
        (None, None, 29)
        """
        return with_new_vocabulary(
            self, vocabulary_size, dtype, overrides, fresh=("ctc_logits/",),
            make=lambda config, dtype: ConformerCTC(**dataclasses.asdict(config), dtype=dtype,
                                                    name=self.name))

    def optional_input_names(self):
        # Refused for a waveform model by `call`, naming why.
        return PACKED_INPUT_NAMES

    # === Packed utterances ===

    def call(self, inputs, training=None, mask=None):
        self.check_input_keys(inputs)  # a dict is read by name, never by position
        packed = packed_inputs(inputs, PACKED_INPUT_NAMES)
        if packed is None:  # the functional graph, as without packing
            outputs = super().call(inputs, training=training, mask=mask)
            return self._nan_where_lengths_wrap(inputs, outputs)
        config = self.conformer_config
        if config.subsampling != "conv":
            raise ValueError(
                "Invalid value for argument `inputs`: packed utterances are not built "
                "for the FastConformer's subsampling yet (subsampling=\"conv\" packs). "
                "Received: "
                f"segment_ids for a model with subsampling={config.subsampling!r}"
            )
        if config.input_type != "features":
            raise ValueError(
                "Invalid value for argument `inputs`: packed utterances are feature "
                "frames (a model built with input_type='features'); the log-mel "
                "front end normalises and pads each waveform on its own. Received: "
                f"segment_ids for a model with input_type={config.input_type!r}"
            )
        features = inputs["features"]
        segment_ids, positions, invalid = _checked_utterances(
            features, packed["segment_ids"], packed["positions"], inputs["feature_length"])
        frame_mask = segment_ids > 0  # (B, T)
        # SpecAugment draws its masks per row, inside the row's span of
        # utterances (docs/packing.md).
        frames = ops.expand_dims(ops.arange(ops.shape(segment_ids)[1]), 0)  # (1, T)
        last = ops.max(ops.where(frame_mask, frames, -1), axis=1, keepdims=True)  # (B, 1)
        x = self.get_layer("spec_augment")(
            features, padding_mask=frames <= last, training=training)
        x = self.get_layer("subsampling")(x, padding_mask=frame_mask)  # (B, T', D)
        logit_segment_ids = subsampled_segment_ids(segment_ids)  # (B, T')
        steps = ops.shape(logit_segment_ids)[1]
        x = self.get_layer("input_dropout")(x, training=training)
        attention_mask = None
        if config.chunk_size is not None:
            # Each logit frame's position in its utterance (starts are aligned).
            logit_positions = positions[:, ::SUBSAMPLING][:, :steps] // SUBSAMPLING
            attention_mask = self.get_layer("chunk_mask")(
                x, training=training, positions=logit_positions)  # (B, T', T')
        # The blocks group each gap with the utterance before it and mask it.
        grouped = _grouped(logit_segment_ids)  # (B, T')
        for i in range(config.num_layers):
            x = self.get_layer(f"conformer_block_{i}")(
                x, padding_mask=logit_segment_ids > 0, attention_mask=attention_mask,
                training=training, segment_ids=grouped)
        logits = nan_where(invalid, self.get_layer("ctc_logits")(x))
        return {"logits": logits,
                "logit_lengths": ops.zeros_like(logit_segment_ids[:, 0]) + steps,
                "logit_segment_ids": logit_segment_ids}

    def compute_output_spec(self, inputs, training=None, mask=None):
        # A symbolic call with the packed inputs is not one the functional
        # graph was built for: the outputs' shapes are known.
        if packed_inputs(inputs, PACKED_INPUT_NAMES) is None:
            return super().compute_output_spec(inputs, training=training, mask=mask)
        features = inputs["features"]
        batch, steps = features.shape[0], features.shape[1]
        steps = None if steps is None else encoder_length(self.conformer_config, steps)
        return {
            "logits": keras.KerasTensor((batch, steps, self.vocabulary_size + 1),
                                        self.compute_dtype),
            "logit_lengths": keras.KerasTensor((batch,), "int32"),
            "logit_segment_ids": keras.KerasTensor((batch, steps), "int32"),
        }

    # === Streaming (a model built with `chunk_size`) ===

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
            chunk: `(B, n)` samples (`n` a multiple of `4 * frame_step`,
                `8 * frame_step` with `subsampling="fast"`) or, with
                `input_type="features"`, `(B, n, num_mel_bins)`.
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
        from keras_attn.layers.streaming import check_counter
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
        check_counter("decoder/last", last, "the last token id (-1: none)", low=-1)
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
        token_ids, new_state["decoder/last"] = greedy_chunk_tokens(
            ops.cast(logits, "float32"), real, last)
        return {"logits": logits, "token_ids": token_ids}, new_state

    def outputs_are_logits(self):
        return True  # CTC logits: a probability loss is refused

    def _check_data(self, x, y=None):
        super()._check_data(x, y)
        if y is None or isinstance(y, dict):
            return
        named, labels = self._named(x), concrete_value(y)
        frames = self._frames(named)
        packed = packed_inputs(x, PACKED_INPUT_NAMES)
        if labels is not None and labels.ndim == 3 and packed is not None:
            segment_ids = concrete_value(packed["segment_ids"])
            frames = None
            if segment_ids is not None:  # each utterance's labels and frames
                labels, frames = utterance_labels_and_frames(labels, segment_ids)
            else:
                labels = labels.reshape(-1, labels.shape[-1])
        if labels is not None and labels.ndim == 2:
            gaps = interior_padding(labels)
            if np.any(gaps):
                rows = np.flatnonzero(gaps)
                raise ValueError(
                    "`labels` must be each transcript's ids followed by 0s (the "
                    "padding); a 0 between two labels would train on a "
                    f"transcript that is neither. Received: labels with a 0 "
                    f"inside row(s) {rows[:5].tolist()}, e.g. {labels[rows[0]].tolist()}"
                )
        if labels is None or frames is None or labels.ndim != 2:
            return
        needed = ctc_frames_needed(labels)
        emitted = encoder_length(self.conformer_config, np.asarray(frames))
        short = int(np.sum(needed > emitted))
        if short:
            warnings.warn(
                f"{short} of {len(labels)} utterance(s) have more labels than "
                "their logits can emit after the subsampling (CTC needs one frame "
                "per label plus one between repeated labels); their loss is "
                "NaN, so a training step on them is skipped and fit stops "
                "there. Received: "
                f"labels needing {needed[needed > emitted][:5].tolist()} frames, "
                f"logits of {emitted[needed > emitted][:5].tolist()}",
                stacklevel=3,
            )

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, guard = self.guard_labels(y)
        labels = ops.cast(labels, "int32")
        weights = row_weights(sample_weight, labels)  # (B,) or None
        if "logit_segment_ids" in y_pred:  # packed utterances: (B, K, L) labels
            return self._packed_loss(x, labels, y_pred, guard, weights)
        losses = self._ctc_losses(labels, y_pred["logits"], y_pred["logit_lengths"], guard)
        # The regularization losses added to every utterance add them once
        # to the mean, scaled for the replicas like the CTC term; a label out
        # of range makes the loss NaN (the step is skipped).
        losses = (losses + sum(self.losses, 0.0)) * self.guard_inputs(x)  # (B,)
        if weights is not None:  # sum(w * loss) / sum(w)
            return BatchMean(name="ctc_loss", reduction="mean_with_sample_weight")(
                losses, losses, sample_weight=weights)
        return BatchMean(name="ctc_loss")(losses, losses)

    def _packed_loss(self, x, labels, y_pred, guard, weights=None):
        """The mean CTC loss over the utterances of packed rows: each
        utterance's logits unpacked into a row of its own, as padded; with
        `weights` `(B,)`, each utterance weighs its row's weight."""
        batch, slots = ops.shape(labels)[0], ops.shape(labels)[1]
        logits, lengths = unpack_utterances(y_pred["logits"], y_pred["logit_segment_ids"],
                                            slots)  # (B, K, T', V), (B, K)
        counts = ops.max(ops.cast(x["segment_ids"], "int32"), axis=1)  # (B,) utterances
        present = ops.less(ops.expand_dims(ops.arange(slots), 0),
                           ops.expand_dims(counts, 1))  # (B, K)
        # Labels for no utterance, or utterances without a slot: NaN.
        real = ops.any(labels > 0, axis=2)  # (B, K)
        fits = ops.logical_and(ops.all(ops.logical_or(present, ops.logical_not(real))),
                               ops.all(counts <= slots))
        guard = guard * ops.where(fits, 1.0, float("nan"))
        # An empty slot gets one frame (a finite loss, left out below).
        lengths = ops.where(present, lengths, ops.maximum(lengths, 1))
        steps = ops.shape(logits)[2]
        losses = self._ctc_losses(
            ops.reshape(labels, (batch * slots, -1)),
            ops.reshape(logits, (batch * slots, steps, -1)),
            ops.reshape(lengths, (-1,)), guard)  # (B * K,)
        present = ops.cast(ops.reshape(present, (-1,)), "float32")
        losses = ops.where(present > 0, losses + sum(self.losses, 0.0), 0.0)
        if weights is not None:  # sum(w * loss) / sum(w) over the present utterances
            weights = ops.reshape(ops.repeat(ops.expand_dims(weights, 1), slots, axis=1),
                                  (-1,)) * present  # (B * K,)
            losses = losses * self.guard_inputs(x)
            return BatchMean(name="ctc_loss", reduction="mean_with_sample_weight")(
                losses, losses, sample_weight=weights)
        # BatchMean divides by B * K: the mean over the present utterances.
        scale = ops.cast(batch * slots, "float32") / ops.maximum(ops.sum(present), 1.0)
        losses = losses * scale * self.guard_inputs(x)
        return BatchMean(name="ctc_loss")(losses, losses)

    def _ctc_losses(self, labels, logits, logit_lengths, guard):
        """Per-utterance CTC losses `(B,)` of `labels` `(B, L)` on `logits`
        `(B, T', V)`, times `guard`, and NaN where they cannot be right."""
        label_lengths = ops.sum(ops.cast(labels > 0, "int32"), axis=1)
        logit_lengths = ops.cast(logit_lengths, "int32")
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
            ops.cast(logits, "float32"),
            label_lengths,
            logit_lengths,
            mask_index=0,
        )  # (B,)
        return losses * guard

    def decode(self, inputs, strategy="greedy", beam_width=16):
        """Token ids `(B, T')`, -1 after each transcript's end (all -2 for
        a row the model answers NaN where nothing can raise: an export).

        `strategy` is `"greedy"` or `"beam_search"` (keras.ops.ctc_decode).
        On JAX, inputs whose values exist now (NumPy arrays, JAX arrays) go
        through the model's predict step (`predict_on_batch`, compiled unless
        the model was compiled with `jit_compile=False`; checked first like a
        call): called op by op, JAX compiled every primitive of the encoder
        again, ~8 s a batch for a tiny model on the CPU. TensorFlow and
        PyTorch run eager calls fast and call the model directly, as do
        traced inputs (a `tf.function` export).
        """
        outputs = model_outputs_for_decoding(self, inputs)
        logits = ops.cast(outputs["logits"], "float32")
        lengths = ops.cast(outputs["logit_lengths"], "int32")
        decoded, _ = ops.ctc_decode(logits, lengths, strategy=strategy,
                                    beam_width=beam_width, mask_index=0)
        # A row the model answered NaN (a sample outside [-1, 1], a length
        # outside [0, N], where nothing raised: a traced export) decodes to
        # blanks, i.e. an empty transcript: all -2 instead, as
        # `ctc_greedy_ids` answers it, never a plausible transcript.
        valid = ops.less(ops.expand_dims(ops.arange(ops.shape(logits)[1]), 0),
                         ops.expand_dims(lengths, 1))  # (B, T')
        broken = ops.any(ops.logical_and(
            ops.expand_dims(valid, -1), ops.logical_not(ops.isfinite(logits))), axis=(1, 2))
        return ops.where(ops.expand_dims(broken, 1), -2, decoded[0])


def with_new_vocabulary(model, vocabulary_size, dtype, overrides, fresh, make):
    """`with_vocabulary` of the Conformer models: `make(config, dtype)` a new
    model of `model`'s config with `vocabulary_size` and `overrides`, every
    weight copied by its path but those under the prefixes `fresh` (the
    layers whose shape follows the vocabulary, drawn anew)."""
    check_vocabulary_size("vocabulary_size", vocabulary_size, allow_none=False)
    if vocabulary_size > MAX_NEW_VOCABULARY:
        # Checked before anything is built: 10**9 labels would allocate a
        # (hidden_dim, 10**9 + 1) head, an out-of-memory error naming nothing.
        raise ValueError(
            f"`vocabulary_size` must be at most {MAX_NEW_VOCABULARY:,} (2**20, four times "
            "the largest published text vocabularies, ~256k; a speech vocabulary is a few "
            f"thousand labels). Received: vocabulary_size={vocabulary_size}")
    for name, value in overrides.items():
        if name not in FINE_TUNING_FIELDS:
            raise ValueError(
                f"`with_vocabulary` keeps the encoder as trained: only "
                f"{', '.join(FINE_TUNING_FIELDS)} may be set anew. Received: "
                f"{name}={value!r}")
    config = replace_conformer_config(model.conformer_config,
                                      vocabulary_size=vocabulary_size, **overrides)
    new = make(config, model.dtype_policy if dtype is None else dtype)
    ours = {v.path: v for v in model.weights if not v.path.startswith(fresh)}
    theirs = {v.path: v for v in new.weights if not v.path.startswith(fresh)}
    if set(ours) != set(theirs):
        extra, missing = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
        raise ValueError(
            "`with_vocabulary` needs a model holding the weights its config builds: "
            f"this one has {extra[:3]} beyond them and lacks {missing[:3]} (LoRA "
            "adapters? `merge_lora` first). Received: a model of "
            f"{len(ours)} encoder weights for {len(theirs)}")
    for path, variable in theirs.items():
        variable.assign(ours[path].value)
    return new


def model_outputs_for_decoding(model, inputs):
    """`model(inputs, training=False)`; on JAX, concrete inputs go through
    the predict step instead (checked first like a call): op by op, JAX
    compiles every primitive of the encoder again (`ConformerCTC.decode`)."""
    named = inputs if isinstance(inputs, dict) else {"": inputs}
    values = {name: concrete_value(value) for name, value in named.items()}
    if keras.backend.backend() == "jax" and all(v is not None for v in values.values()):
        model.check_inputs(inputs)
        concrete = values if isinstance(inputs, dict) else values[""]
        return model._keeping_variables(lambda: model.predict_on_batch(concrete))
    return model(inputs, training=False)


def greedy_chunk_tokens(logits, real, last):
    """Greedy CTC tokens of one streamed chunk: `logits` `(B, C, V + 1)`
    whose first `real` `(B,)` frames are real, `last` `(B,)` the previous
    frame's best token (-1: none). Returns `token_ids (B, C)` (-1 where a
    frame emits none; repeats across chunks merged) and the new `last`.
    The first maximum is found without `ops.argmax` of floats, whose
    TensorFlow form (a bitcast test for -0.0) neither LiteRT's builtins nor
    ONNX hold, so that the exported step (keras_attn.export.streaming) runs
    this same function."""
    frames = logits.shape[1]
    is_best = ops.greater_equal(logits, ops.max(logits, axis=-1, keepdims=True))
    best = ops.cast(ops.argmax(ops.cast(is_best, "int32"), axis=-1), "int32")  # (B, C)
    valid = ops.less(ops.expand_dims(ops.arange(frames), 0), ops.expand_dims(real, 1))
    previous = ops.concatenate([ops.expand_dims(last, 1), best[:, :-1]], axis=1)
    keep = valid & ops.not_equal(best, 0) & ops.not_equal(best, previous)
    # The last real frame's token (a blank included) carries on.
    final = ops.take_along_axis(best, ops.expand_dims(ops.maximum(real - 1, 0), 1), axis=1)[:, 0]
    return ops.where(keep, best, -1), ops.where(real > 0, final, last)


def first_argmax(x):
    """`ops.argmax(x, axis=-1)` as int32, the first maximum, found without
    `ops.argmax` of floats: on TensorFlow that checks for -0.0 with a
    bitcast, which ONNX has no op for (an export's graph holds this)."""
    is_best = ops.greater_equal(x, ops.max(x, axis=-1, keepdims=True))
    return ops.cast(ops.argmax(ops.cast(is_best, "int32"), axis=-1), "int32")


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
    best = first_argmax(logits)  # (B, T)
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


# Optional inputs of packed utterances (docs/packing.md), outside the
# functional graph: left out, the model runs that graph as before packing.
PACKED_INPUT_NAMES = ("segment_ids", "positions")


UTTERANCE_RULE = (
    "the frames of a row's k utterances hold 1, 2, ..., k in order, each "
    "contiguous, with 0 between and after them"
)


def _grouped(ids):
    """Packed utterance ids `(B, T)` (`UTTERANCE_RULE`, gaps of 0 between
    utterances) as the layers' segment ids: each gap joins the utterance
    before it, the padding after the last stays 0 (`SEGMENT_RULE`)."""
    previous = ops.concatenate([ops.zeros_like(ids[:, :1]), ids[:, :-1]], axis=1)
    starts = ops.logical_and(ids > 0, ops.not_equal(ids, previous))  # (B, T)
    count = ops.cumsum(ops.cast(starts, "int32"), axis=1)  # (B, T)
    frames = ops.expand_dims(ops.arange(ops.shape(ids)[1]), 0)  # (1, T)
    last = ops.max(ops.where(ids > 0, frames, -1), axis=1, keepdims=True)  # (B, 1)
    return ops.where(frames <= last, count, ops.zeros_like(count))


def _checked_utterances(features, segment_ids, positions, feature_length=None):
    """`(segment_ids, positions, invalid)` of packed utterances, checked
    under the inputs' names: `UTTERANCE_RULE`, positions that restart with
    each utterance, each utterance starting at a multiple of the
    subsampling (so that its logit frames are those it gets alone), and a
    `feature_length` that cuts no utterance. `invalid` `(B,)` (or None):
    the rows to make NaN in a graph."""
    ids = integer_ids("segment_ids", segment_ids, UTTERANCE_RULE)  # (B, T) int32
    check_static_shape("segment_ids", ids, tuple(features.shape[:2]), "features' (B, T)")
    broken = ops.logical_and(ops.not_equal(ids, 0), ops.not_equal(ids, _grouped(ids)))
    bad_ids = refused(
        ops.any(broken, axis=1), "segment_ids",
        lambda row: (
            f"{UTTERANCE_RULE}; row {row} breaks it at frame "
            f"{int(np.argmax(concrete_value(broken)[row]))}. Received: segment_ids[{row}]="
            f"{concrete_value(ids)[row].tolist()}"))
    positions, bad_positions = checked_positions(positions, ids, name="positions")
    frames = ops.expand_dims(ops.arange(ops.shape(ids)[1]), 0)  # (1, T)
    starts = ops.logical_and(ids > 0, ops.equal(positions, 0))  # (B, T)
    misaligned = ops.logical_and(starts, ops.not_equal(frames % SUBSAMPLING, 0))
    bad_starts = refused(
        ops.any(misaligned, axis=1), "segment_ids",
        lambda row: (
            f"each utterance must start at a multiple of {SUBSAMPLING} frames (the "
            "subsampling's stride: then its logit frames are those it gets alone; "
            "keras_attn.data.packing.pack_utterances aligns them). Received: row "
            f"{row} starts one at frame "
            f"{int(np.argmax(concrete_value(misaligned)[row]))}"))
    # Compared in the lengths' own dtype: an int64 2**32 + 3 cast to int32
    # first would wrap to a valid 3 (and in NumPy where the values exist:
    # JAX without x64 wraps an int64 array in `convert_to_tensor`).
    lengths, known_ids = concrete_value(feature_length), concrete_value(ids)
    if lengths is not None and known_ids is not None:
        lengths = np.asarray(lengths).astype("int64") if lengths.dtype == bool else lengths
        steps = np.arange(known_ids.shape[1])[None]  # (1, T)
        cut = (known_ids > 0) & (steps >= lengths[:, None])  # (B, T)
        bad = cut.any(axis=1) | (lengths < 0) | (lengths > known_ids.shape[1])
    else:
        lengths = ops.convert_to_tensor(feature_length)  # (B,)
        if keras.backend.standardize_dtype(lengths.dtype) == "bool":
            lengths = ops.cast(lengths, "int32")
        cut = ops.logical_and(ids > 0,
                              ops.cast(frames, lengths.dtype) >= ops.expand_dims(lengths, 1))
        bad = ops.logical_or(ops.any(cut, axis=1), outside_lengths(lengths, ops.shape(ids)[1]))
    bad_length = refused(
        bad, "feature_length",
        lambda row: (
            "it must not end a row before its last utterance does, nor lie outside "
            "[0, T] (the segment ids say which frames are real). Received: "
            f"feature_length[{row}]={int(concrete_value(lengths)[row])}"))
    return ids, positions, any_invalid(bad_ids, bad_positions, bad_starts, bad_length)


def log_mel_front_end(config, dtype=None):
    """The front end a waveform `ConformerCTC` of `config` puts in front of
    its encoder (named "log_mel"): `LogMelFeatures`, or with
    `front_end="parakeet"` `ParakeetLogMelFeatures`; the features a model
    built with `input_type="features"` takes, e.g. computed per utterance to
    pack them (`keras_attn.data.pack_utterances`)."""
    if config.front_end == "parakeet":
        return ParakeetLogMelFeatures(
            sampling_rate=config.sampling_rate, num_mel_bins=config.num_mel_bins,
            frame_length=config.frame_length, frame_step=config.frame_step,
            fft_length=config.fft_length, preemphasis=config.preemphasis,
            dtype=dtype, name="log_mel")
    return LogMelFeatures(
        sampling_rate=config.sampling_rate, num_mel_bins=config.num_mel_bins,
        frame_length=config.frame_length, frame_step=config.frame_step,
        fft_length=config.fft_length, normalization=config.feature_normalization,
        dtype=dtype, name="log_mel",
    )


def unpack_utterances(logits, logit_segment_ids, max_segments):
    """Each utterance's logits of packed rows in a row of its own.

    Args:
        logits: `(B, T', V)`, the packed model's `"logits"`.
        logit_segment_ids: `(B, T')`, its `"logit_segment_ids"`.
        max_segments: K, the utterances a row holds at most.

    Returns:
        `((B, K, T', V) logits, (B, K) lengths)`: utterance `k + 1` of row
        `b` in `[b, k, :lengths[b, k]]` (the frames after it are its
        neighbours', to be masked by the length), 0 frames past a row's
        last utterance.

    >>> logits = np.arange(6, dtype="float32").reshape(1, 6, 1)
    >>> out, lengths = unpack_utterances(logits, np.array([[1, 1, 0, 2, 2, 2]]), 2)
    >>> np.asarray(out)[0, :, :3, 0].tolist(), np.asarray(lengths).tolist()
    ([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [[2, 3]])
    """
    ids = ops.cast(logit_segment_ids, "int32")  # (B, T')
    steps = ops.shape(ids)[1]
    segments = ops.reshape(ops.arange(1, max_segments + 1, dtype="int32"), (1, -1, 1))
    member = ops.cast(ops.equal(ops.expand_dims(ids, 1), segments), "int32")  # (B, K, T')
    lengths = ops.sum(member, axis=2)  # (B, K)
    first = ops.cast(ops.argmax(member, axis=2), "int32")  # (B, K)
    index = ops.expand_dims(first, 2) + ops.reshape(ops.arange(steps, dtype="int32"),
                                                    (1, 1, -1))  # (B, K, T')
    index = ops.reshape(ops.minimum(index, steps - 1), (ops.shape(ids)[0], -1, 1))
    unpacked = ops.take_along_axis(logits, index, axis=1)  # (B, K * T', V)
    shape = ops.shape(logits)
    return ops.reshape(unpacked, (shape[0], max_segments, steps, shape[2])), lengths


def check_packed_rows(features, segment_ids, positions, feature_length, labels):
    """A `ValueError` naming the input unless packed rows are what a
    features-input Conformer trains on: what the model checks when called
    eagerly (segment ids, positions restarting with each utterance, each
    utterance at a multiple of the subsampling, a `feature_length` that cuts
    none) and one transcript per utterance in `labels` `(B, K, L)`. For data
    checked before training (prepared files), NumPy arrays. Returns
    `utterance_labels_and_frames(labels, segment_ids)`."""
    _checked_utterances(features, segment_ids, positions, feature_length)
    return utterance_labels_and_frames(labels, segment_ids)


def utterance_labels_and_frames(labels, segment_ids):
    """`(labels (B * K, L), frames (B * K,))` of packed rows: each
    utterance's transcript and its feature frames (0 for an empty slot), from
    `labels` `(B, K, L)` and `segment_ids` `(B, T)` (NumPy). A `ValueError`
    unless there is one transcript per utterance."""
    labels, segment_ids = np.asarray(labels), np.asarray(segment_ids)
    _per_utterance_labels(labels, segment_ids.max(axis=1))
    slots = np.arange(1, labels.shape[1] + 1)
    frames = (segment_ids[:, None, :] == slots[None, :, None]).sum(axis=2)  # (B, K)
    return labels.reshape(-1, labels.shape[-1]), frames.reshape(-1)


def _per_utterance_labels(labels, counts):
    """A `ValueError` when packed labels `(B, K, L)` do not give one
    transcript per utterance: a row with more utterances (`counts` `(B,)`)
    than K, or a transcript in a slot past a row's last utterance."""
    slots = labels.shape[1]
    if np.any(counts > slots):
        row = int(np.argmax(counts > slots))
        raise ValueError(
            "Invalid value for argument `labels`: packed rows need one transcript "
            f"per utterance, (B, K, L) with K at least the utterances of a row. "
            f"Received: labels with K={slots} and {int(counts[row])} utterances in "
            f"row {row}"
        )
    extra = (labels > 0).any(axis=2) & (np.arange(slots)[None, :] >= counts[:, None])
    if extra.any():
        row, slot = (int(i) for i in np.argwhere(extra)[0])
        raise ValueError(
            "Invalid value for argument `labels`: a transcript for an utterance the "
            f"row does not hold. Received: labels[{row}, {slot}]="
            f"{labels[row, slot].tolist()} beside {int(counts[row])} utterance(s)"
        )


def interior_padding(labels):
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

    Args:
        config: a `ConformerConfig`, a name from `CONFORMER_PRESETS`
            (`"conformer_small"`, `"conformer_tiny"`) or a dict of
            `ConformerConfig` fields.
        **overrides: `ConformerConfig` fields to change
            (`vocabulary_size=10`, `input_type="features"`, `chunk_size=8`);
            an unknown name is a `ValueError`.

    Returns:
        A `ConformerCTC` (a functional `keras.Model`: audio in,
            `{"logits", "logit_lengths"}` out).

    Example:

    >>> model = build_conformer("conformer_tiny", vocabulary_size=12)
    >>> model.output["logits"].shape
    (None, None, 13)
    """
    config = get_conformer_config(config, **overrides)
    return ConformerCTC(**dataclasses.asdict(config))
