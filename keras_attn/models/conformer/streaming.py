"""Streaming inference for a `ConformerCTC` (logits as the audio arrives)
or a `ConformerTransducer`'s encoder (its projected frames).

```
chunk of samples (B, n)  --LogMelFeatures.stream_step-->  new feature frames
  --ConvSubsampling.stream_step-->  new encoder frames (40 ms; 80 ms with the
                                    FastConformer's FastConvSubsampling)
  --wait for a whole chunk of `chunk_size` encoder frames-->
  --L x ConformerBlock.stream_step (cached keys / values, conv frames)-->
  --Dense-->  CTC logits of that chunk (a transducer: the frames its
             joint reads, `encoder_projector`)
```

Each layer carries what its next outputs still need (the STFT window's
overlap, the subsampling's receptive field, the attention's left context,
the causal convolution's last frames) in a flat dict of tensors, so the
logits of an utterance streamed in chunks of any size are those of the
whole-utterance forward with the chunk mask (`full_forward_with_chunk_mask`),
to float rounding. The model must have been built streamable: causal
convolution modules and, for waveform input, log-mel features without
per-utterance normalisation (the package's `LogMelFeatures`; Parakeet's
front end normalises each feature over the whole utterance, which a stream
cannot know).
"""

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn.layers.conformer_block import ConformerBlock
from keras_attn.layers.fast_conv_subsampling import FastConvSubsampling
from keras_attn.models.conformer.conformer_config import encoder_length
from keras_attn.layers.log_mel_features import outside_lengths
from keras_attn._guard import concrete_value
from keras_attn.layers.streaming import check_audio_range
from keras_attn.layers.streaming import check_counter
from keras_attn.layers.streaming import check_left_context
from keras_attn.layers.streaming import check_state_tensor
from keras_attn.layers.streaming import chunk_attention_mask

# Feature frames per encoder frame (ConvSubsampling's two stride-2 convolutions).
SUBSAMPLING = 4


def subsampling_factor(layer):
    """Feature frames per encoder frame of a model's subsampling layer:
    4 (`ConvSubsampling`) or `FastConvSubsampling`'s factor (8)."""
    return layer.subsampling_factor if isinstance(layer, FastConvSubsampling) else SUBSAMPLING


def _prefixed(prefix, entries):
    return {f"{prefix}/{name}": value for name, value in entries.items()}


def _unprefixed(prefix, state):
    start = prefix + "/"
    return {name[len(start):]: value for name, value in state.items() if name.startswith(start)}


class ConformerStreamer:
    """Chunk-by-chunk inference of a streamable `ConformerCTC` (its
    logits), or of a `ConformerTransducer`'s encoder (its projected frames,
    which the model's `stream_step` decodes).

    Encoder frame `t` attends to the frames of its chunk
    (`t // chunk_size`) and to the `left_context` frames before that chunk,
    as `chunk_attention_mask` says; logits come out a chunk at a time, when
    its last encoder frame has arrived (algorithmic latency: `chunk_size`
    encoder frames of 4 feature frames each, 8 for the FastConformer's
    `subsampling="fast"`, whose encoder frame `t` reads feature frames up to
    `8t + 7`, the last of its own eight).

    Args:
        model: a built `ConformerCTC` or `ConformerTransducer` whose blocks have causal convolution
            modules (`causal_conv=True`) and, for `input_type="waveform"`,
            whose log-mel layer has `normalization="none"`.
        chunk_size: encoder frames per attention chunk (40 ms each by default).
        left_context: encoder frames before a chunk that it attends to (the
            keys and values cached per block).

    A state is a flat dict of tensors (`initial_state`); `stream_step` and
    `flush` return a new one and never change the one given, so a caller
    whose call failed still holds a valid state.

    Example:

        streamer = ConformerStreamer(model, chunk_size=4, left_context=8)
        state = streamer.initial_state(batch_size=1)
        for chunk in chunks:  # (1, n) samples, n a multiple of 4 * frame_step
            logits, state = streamer.stream_step(chunk, state)
        logits, state = streamer.flush(state)
    """

    def __init__(self, model, chunk_size, left_context, compiled=True):
        self.compiled = compiled
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.left_context = check_left_context(left_context)
        self.model = model
        config = getattr(model, "conformer_config", None)
        if config is None or not model.built:
            raise ValueError(
                "Invalid value for argument `model`: a built ConformerCTC or "
                f"ConformerTransducer. Received: model={type(model).__name__}"
            )
        self.input_type = config.input_type
        self.blocks = [layer for layer in model.layers if isinstance(layer, ConformerBlock)]
        not_causal = [b.name for b in self.blocks if not b.conv_module.causal]
        if not_causal:
            raise ValueError(
                "Invalid value for argument `model`: streaming needs causal "
                "convolution modules (a centred kernel reads the next chunk's "
                f"frames). Received: a model whose blocks {not_causal} have causal_conv=False"
            )
        self.log_mel = model.get_layer("log_mel") if self.input_type == "waveform" else None
        if self.log_mel is not None and not hasattr(self.log_mel, "stream_step"):
            raise ValueError(
                "Invalid value for argument `model`: streaming waveform input needs the "
                "package's log-mel features (front_end='log_mel'); Parakeet's front end "
                "normalises each feature over the whole utterance, which a stream cannot "
                f"know. Received: a model whose log_mel is {type(self.log_mel).__name__}"
            )
        if self.log_mel is not None and self.log_mel.normalization != "none":
            raise ValueError(
                "Invalid value for argument `model`: streaming waveform input "
                "needs log-mel features without per-utterance normalisation "
                "(it reads the whole utterance). Received: a model whose log_mel "
                f"has normalization={self.log_mel.normalization!r}"
            )
        self.subsampling = model.get_layer("subsampling")
        # The CTC logits, or a transducer's projection to the joint's width.
        names = {layer.name for layer in model.layers}
        self.head = model.get_layer("ctc_logits" if "ctc_logits" in names
                                    else "encoder_projector")
        self.num_mel_bins = config.num_mel_bins
        self.subsampling_factor = subsampling_factor(self.subsampling)
        # Parakeet's x sqrt(D) on the subsampling's output.
        self.input_scale = float(config.hidden_dim) ** 0.5 if config.scale_input else None
        # Samples (waveform) or feature frames (features) per encoder frame.
        self.step = self.subsampling_factor * (
            config.frame_step if self.log_mel is not None else 1)
        self._chunk_model = _ChunkStep(self.blocks, self.head) if compiled else None

    # === State ===

    def initial_state(self, batch_size):
        """The state before the first chunk of a batch of `batch_size`."""
        batch_size = check_positive_int("batch_size", batch_size)
        state = {}
        if self.log_mel is not None:
            state.update(_prefixed("log_mel", self.log_mel.initial_state(batch_size)))
        state.update(_prefixed("subsampling", self.subsampling.initial_state(batch_size)))
        width = self.subsampling.hidden_dim
        state["encoder/frames"] = ops.zeros((batch_size, 0, width), self.subsampling.compute_dtype)
        state["encoder/mask"] = ops.zeros((batch_size, 0), "bool")
        state["logit_length"] = ops.zeros((batch_size,), "int32")
        # The chunk size the stream started with: the blocks' caches hold
        # that chunk mask's keys, so a step at another size would mix two.
        state["chunk_size"] = ops.convert_to_tensor(self.chunk_size, "int32")
        for i, block in enumerate(self.blocks):
            state.update(_prefixed(f"block_{i}", block.initial_state(batch_size, self.left_context)))
        return state

    def check_state(self, state, batch_size=None):
        """A ValueError naming what in `state` does not belong to this
        streamer and a batch of `batch_size`: a missing or foreign entry
        (another model's layer count), another batch size, shape or dtype."""
        if not isinstance(state, dict):
            raise ValueError(
                "Invalid value for argument `state`: a dict of tensors, as "
                f"`initial_state` returns. Received: state of type {type(state).__name__}"
            )
        expected = set(self.state_names())
        if set(state) != expected:
            missing, foreign = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(
                "Invalid value for argument `state`: it is not a state of this "
                f"streamer ({len(self.blocks)} blocks). Received: a state missing "
                f"{missing} and holding unknown {foreign}"
            )
        held = state["logit_length"]
        check_state_tensor("logit_length", held, (None,), "int32")
        # 2**31 encoder frames of 40 ms are 2.7 years: int32 does not wrap.
        check_counter("logit_length", held, "encoder frames")
        check_state_tensor("chunk_size", state["chunk_size"], (), "int32")
        started = concrete_value(state["chunk_size"])
        if started is not None and int(started) != self.chunk_size:
            raise ValueError(
                f"Invalid value for argument `chunk_size`: this state streams chunks of "
                f"{int(started)} encoder frames (its caches hold that chunk mask's keys); "
                "start a new stream from `initial_state` for another size. Received: "
                f"chunk_size={self.chunk_size}, state['chunk_size']={int(started)}"
            )
        if batch_size is not None and held.shape[0] != batch_size:
            raise ValueError(
                f"Invalid value for argument `state`: it holds a batch of "
                f"{held.shape[0]}, the chunk one of {batch_size}. Received: "
                f"state['logit_length'].shape={tuple(held.shape)}"
            )
        batch = held.shape[0]
        if self.log_mel is not None:
            self.log_mel.check_state(_unprefixed("log_mel", state), batch, "log_mel/")
        self.subsampling.check_state(_unprefixed("subsampling", state), batch, "subsampling/")
        dtype = self.subsampling.compute_dtype
        check_state_tensor("encoder/frames", state["encoder/frames"],
                           (batch, None, self.subsampling.hidden_dim), dtype)
        check_state_tensor("encoder/mask", state["encoder/mask"], (batch, None), "bool")
        for i, block in enumerate(self.blocks):
            block.check_state(_unprefixed(f"block_{i}", state), batch, f"block_{i}/")
            if state[f"block_{i}/mask"].shape[1] != self.left_context:
                raise ValueError(
                    f"Invalid value for argument `state`: block_{i}'s cache holds "
                    f"{state[f'block_{i}/mask'].shape[1]} frames, this streamer's "
                    f"left_context is {self.left_context}. Received: "
                    f"state['block_{i}/mask'].shape={tuple(state[f'block_{i}/mask'].shape)}"
                )
        return batch

    def state_names(self):
        """The state's entry names, in order."""
        names = []
        if self.log_mel is not None:
            names += [f"log_mel/{n}" for n in ("samples", "received", "next_frame",
                                               "length", "ended")]
        names += [f"subsampling/{n}" for n in self.subsampling.initial_state(1)]
        names += ["encoder/frames", "encoder/mask", "logit_length", "chunk_size"]
        for i in range(len(self.blocks)):
            names += [f"block_{i}/{n}" for n in ("key", "value", "mask", "conv")]
        return names

    # === Steps ===

    def stream_step(self, chunk, state, chunk_length=None):
        """Feed the next chunk of every utterance of the batch.

        Args:
            chunk: `(B, n)` float samples in [-1, 1] (`input_type="waveform"`,
                `n` a multiple of `4 * frame_step`, `8 * frame_step` for
                `subsampling="fast"`) or `(B, n, num_mel_bins)` features (`n`
                a multiple of 4, or 8), finite.
            state: the previous step's state (`initial_state` at the start).
            chunk_length: `(B,)` valid samples (frames) of each row; a row
                given fewer than `n` has ended (a final partial chunk) and
                gets 0 in later chunks. Default: all `n`.

        Returns:
            `(logits (B, k, vocabulary_size + 1), new_state)` (a
            transducer's: its frames `(B, k, predictor_dim)`): the logits of
            the `k` encoder frames whose chunks are complete (`k` a multiple
            of `chunk_size`, 0 included); `new_state["logit_length"]` counts
            each utterance's real frames so far.
        """
        batch = self._check_chunk(chunk)
        self.check_state(state, batch)
        if chunk.shape[1] % self.step:
            unit = "samples" if self.log_mel is not None else "frames"
            raise ValueError(
                f"Invalid value for argument `chunk`: its length must be a multiple "
                f"of the subsampling step, {self.step} {unit} (pad a final partial "
                f"chunk and give `chunk_length`). Received: chunk.shape={tuple(chunk.shape)}"
            )
        return self._advance(chunk, state, chunk_length, final=False)

    def flush(self, state):
        """End of stream: the logits of the frames still held (the last
        partial chunk). Returns `(logits, new_state)` as `stream_step`."""
        batch = self.check_state(state)
        if self.log_mel is not None:
            empty = ops.zeros((batch, 0), "float32")
        else:
            empty = ops.zeros((batch, 0, self.num_mel_bins), "float32")
        return self._advance(empty, state, None, final=True)

    def _check_chunk(self, chunk):
        rank = 2 if self.log_mel is not None else 3
        shape = tuple(getattr(chunk, "shape", np.shape(chunk)))
        if len(shape) != rank or (rank == 3 and shape[2] != self.num_mel_bins):
            what = "(B, n) samples" if rank == 2 else f"(B, n, {self.num_mel_bins}) features"
            raise ValueError(
                f"Invalid value for argument `chunk`: a chunk is {what}. "
                f"Received: chunk.shape={shape}"
            )
        values = ops.convert_to_numpy(chunk)
        if not np.issubdtype(values.dtype, np.floating) or not np.isfinite(values).all():
            raise ValueError(
                "Invalid value for argument `chunk`: finite float samples. Received: "
                f"chunk of dtype {values.dtype}"
                + ("" if not np.issubdtype(values.dtype, np.floating) else " with NaN or inf")
            )
        if rank == 2:  # waveforms (features are decibels, of any scale)
            check_audio_range("chunk", values)
        return shape[0]

    def _advance(self, chunk, state, chunk_length, final):
        batch = chunk.shape[0]
        new_state = {}
        if self.log_mel is not None:
            features, frame_mask, mel_state = (
                self.log_mel.flush(_unprefixed("log_mel", state)) if final else
                self.log_mel.stream_step(chunk, _unprefixed("log_mel", state), chunk_length))
            new_state.update(_prefixed("log_mel", mel_state))
        else:
            features, frame_mask = self._feature_chunk(chunk, chunk_length, state)
        if self.subsampling_factor == SUBSAMPLING:
            encoded, encoded_mask, sub_state = self.subsampling.stream_step(
                features, _unprefixed("subsampling", state), frame_mask)
        else:  # its padded stages add the zeros after the utterance at the end
            encoded, encoded_mask, sub_state = self.subsampling.stream_step(
                features, _unprefixed("subsampling", state), frame_mask, final=final)
        if self.input_scale is not None:
            encoded = encoded * self.input_scale
        new_state.update(_prefixed("subsampling", sub_state))
        pending = ops.concatenate([state["encoder/frames"], encoded], axis=1)  # (B, p, D)
        pending_mask = ops.concatenate([state["encoder/mask"], encoded_mask], axis=1)
        size = pending.shape[1]
        ready = size if final else size - size % self.chunk_size
        caches = {name: value for name, value in state.items() if name.startswith("block_")}
        logits = []
        for start in range(0, ready, self.chunk_size):
            x = pending[:, start:start + self.chunk_size]
            mask = pending_mask[:, start:start + self.chunk_size]
            if self._chunk_model is not None and x.shape[1] == self.chunk_size:
                outputs = self._chunk_model.predict_on_batch(dict(caches, x=x, mask=mask))
                outputs = {name: ops.convert_to_tensor(value) for name, value in outputs.items()}
            else:  # eager: the flushed partial chunk, or compiled=False
                outputs = self._chunk_model_call(dict(caches, x=x, mask=mask))
            logits.append(outputs.pop("logits"))
            caches = outputs
        new_state.update(caches)
        new_state["encoder/frames"] = pending[:, ready:]
        new_state["encoder/mask"] = pending_mask[:, ready:]
        real = ops.sum(ops.cast(pending_mask[:, :ready], "int32"), axis=1)
        new_state["logit_length"] = state["logit_length"] + real
        new_state["chunk_size"] = state["chunk_size"]
        if logits:
            logits = ops.concatenate(logits, axis=1)
        else:
            logits = ops.zeros((batch, 0, self.head.units), self.head.compute_dtype)
        return logits, new_state

    def _chunk_model_call(self, inputs):
        return _run_chunk(self.blocks, self.head, inputs)

    def _feature_chunk(self, chunk, chunk_length, state):
        """Features input: the chunk and its frame mask, from `chunk_length`."""
        batch, width = chunk.shape[0], chunk.shape[1]
        if chunk_length is None:
            return ops.cast(chunk, self.subsampling.compute_dtype), ops.ones((batch, width), "bool")
        lengths = ops.convert_to_numpy(chunk_length).astype("int64")
        if lengths.shape != (batch,) or (lengths < 0).any() or (lengths > width).any():
            raise ValueError(
                "Invalid value for argument `chunk_length`: (B,) valid frames, "
                f"each between 0 and {width}. Received: chunk_length={lengths.tolist()}"
            )
        mask = ops.less(ops.expand_dims(ops.arange(width), 0),
                        ops.expand_dims(ops.convert_to_tensor(lengths, "int32"), 1))
        return ops.cast(chunk, self.subsampling.compute_dtype), mask

    # === The offline reference ===

    def full_forward_with_chunk_mask(self, inputs, lengths):
        """The same layers over whole utterances, with the chunk mask.

        Args:
            inputs: `(B, N)` waveforms or `(B, T, num_mel_bins)` features.
            lengths: `(B,)` valid samples (frames) of each utterance.

        Returns:
            `{"logits": (B, T', vocabulary_size + 1), "logit_lengths": (B,)}`,
            what the streamed logits equal (a transducer's frames under the
            same key).
        """
        self._check_chunk(inputs)
        # Checked in the lengths' own dtype before the int32 cast, which
        # would wrap an int64 2**32 + 3 to a valid 3.
        bad = outside_lengths(lengths, ops.shape(inputs)[1])  # (B,)
        found = concrete_value(bad)
        if found is not None and found.any():
            raise ValueError(
                "Invalid value for argument `lengths`: (B,) valid samples (frames), each "
                f"between 0 and {ops.shape(inputs)[1]}. Received: "
                f"lengths={np.asarray(concrete_value(lengths)).tolist()}")
        lengths = ops.cast(lengths, "int32")
        if self.log_mel is not None:
            features = self.log_mel(inputs, lengths)
            frame_lengths = self.log_mel.num_frames(lengths)
        else:
            features, frame_lengths = ops.cast(inputs, self.subsampling.compute_dtype), lengths
        frames = ops.shape(features)[1]
        frame_mask = ops.less(ops.expand_dims(ops.arange(frames), 0),
                              ops.expand_dims(frame_lengths, 1))
        x = self.subsampling(features, padding_mask=frame_mask)  # (B, T', D)
        if self.input_scale is not None:
            x = x * self.input_scale
        logit_lengths = encoder_length(self.model.conformer_config, frame_lengths)
        steps = ops.shape(x)[1]
        mask = ops.less(ops.expand_dims(ops.arange(steps), 0), ops.expand_dims(logit_lengths, 1))
        attention_mask = chunk_attention_mask(steps, self.chunk_size, self.left_context)
        for block in self.blocks:
            x = block(x, padding_mask=mask, attention_mask=attention_mask, training=False)
        logits = self.head(x)
        if found is None:  # traced: such an utterance's logits are NaN
            logits = ops.where(ops.expand_dims(bad, (1, 2)), ops.cast(float("nan"), logits.dtype),
                               logits)
        return {"logits": logits, "logit_lengths": logit_lengths}


def _run_chunk(blocks, head, inputs):
    """One attention chunk through the blocks and the CTC head:
    `inputs` holds `x (B, C, D)`, `mask (B, C)` and each block's cache
    (`block_<i>/<entry>`); returns the logits and the new caches."""
    x, mask = inputs["x"], inputs["mask"]
    outputs = {}
    for i, block in enumerate(blocks):
        x, cache = block.stream_step(x, _unprefixed(f"block_{i}", inputs), padding_mask=mask)
        outputs.update(_prefixed(f"block_{i}", cache))
    outputs["logits"] = head(x)
    return outputs


class _ChunkStep(keras.Model):
    """The blocks and head of a `ConformerCTC` (shared, not copied) as a
    model whose `predict_on_batch` runs one attention chunk of fixed shapes:
    Keras compiles it the way it compiles `predict` on each backend
    (`tf.function` on TensorFlow, `jax.jit` with the weights passed as
    state on JAX, eager on PyTorch), so the per-chunk cost is one compiled
    call while the layers stay `keras.ops` only and no backend is imported
    here. Each new batch size or chunk size traces once."""

    def __init__(self, blocks, head):
        super().__init__(name="conformer_chunk_step")
        self.blocks = list(blocks)
        self.head = head
        self.built = True

    def call(self, inputs, training=False):
        return _run_chunk(self.blocks, self.head, inputs)
