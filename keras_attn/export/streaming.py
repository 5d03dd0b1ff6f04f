"""The streaming step of a `ConformerCTC` (or a `ConformerTransducer`,
below) as a stateful ONNX or LiteRT model of fixed shapes, for a device
that has no TensorFlow:

```
chunk (B, n) float32, chunk_length (B,) int32, state tensors
  -> logits (B, C, V + 1), token_ids (B, C) int32 (-1: none), next state tensors
```

`n = chunk_size x 4 x frame_step` samples (one attention chunk of `C =
chunk_size` encoder frames; `8 x frame_step` per encoder frame for the
FastConformer's `subsampling="fast"`). The step is the Keras streaming code
(`ConformerStreamer`): `LogMelFeatures`'s frames (the STFT as a
convolution, as in the offline export), `ConvSubsampling` (or
`FastConvSubsampling.stream_step`, stage by stage), each
`ConformerBlock.stream_step` and the CTC head, with the greedy decoding of
`ConformerCTC.stream_step`. Keras's step carries state of varying length
(nothing before the first chunk, the samples, feature frames and encoder
frames still waiting after it); the exported one carries their steady
lengths from the start, the first chunk's missing part as masked frames:

- `log_mel_samples` `(B, R)`: the samples the next frames' windows still
  need; before the first chunk the step puts `d` frames' worth of zeros and
  the reflection that centres the STFT there, the `d` frames (`next_frame`
  < 0) masked;
- `subsampling_frames` / `_mask` `(B, S, mels)` / `(B, S)` (for
  `FastConvSubsampling`, `subsampling_frames_<i>` / `_mask_<i>` `(B, S_i,
  bins, channels)` / `(B, S_i)`, each stage's input frames, the masked zero
  frame before the first chunk its left padding), `encoder_frames`
  / `_mask` `(B, P, D)` / `(B, P)`: frames received and not yet used;
- `block_<i>_key` / `_value` `(B, L, N, H)`, `_mask` `(B, L)`, `_conv`
  `(B, K - 1, C')`: each block's attention and convolution caches;
- `log_mel_length` (samples so far), `log_mel_next_frame`, `ended`,
  `logit_length` (real encoder frames so far), `decoder_last` (the last
  frame's greedy token, so a token repeated across chunks is emitted once).
  The first two count from an origin moved forward by whole frames once
  `log_mel_next_frame` passes `REBASE_FRAMES` (as `LogMelFeatures` does), so
  that no counter nears int32's limit however long a stream runs
  (`logit_length` counts 40 ms frames: 2**31 of them are 2.7 years).

Nothing raises inside the step: a row whose given samples lie outside
[-1, 1] or are not finite, or whose counters are negative, gets NaN logits
and token ids -2 (never -1, which is silence; the runtime's Python wrapper
refuses such input by name before the step).

So the exported step's `k`-th output is the `k`-th non-empty output of
Keras's `stream_step` (the first call's output is one chunk of masked
frames, no tokens): the same tokens. The end of a stream: the last chunk
zero-padded with its valid samples in `chunk_length` (a row that ends
stays ended), then `flush_chunks` chunks of zeros with `chunk_length` 0.

A `ConformerTransducer`'s step is the same encoder chunk projected to its
joint's width, then its greedy walk over the chunk's frames in one while
loop (`transducer_greedy_ids` from the carried state): outputs `frames (B,
C, P)` and `token_ids (B, C x max_symbols_per_step)` (the labels emitted,
-1 after them, -2 for a refused row); its decoder state is
`ConformerTransducer.stream_step`'s (`decoder_prediction`,
`decoder_lstm_<i>`, `decoder_skip`), whose start values (the prediction
network after the blank, one row broadcast to the batch) `serving.json`
records as the entries' `initial`.

`serving.json` records all of it under `"streaming"` (each state tensor's
input and output names, shape, dtype and initial value, the chunk length
in samples, the sampling rate, `flush_chunks`, the blank id and the
vocabulary); `keras_attn.export.streaming_runtime` drives it with NumPy
and the runtime alone.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attn.export.portable import PORTABLE_FORMATS
from keras_attn.export.portable import check_format
from keras_attn.layers.log_mel_features import REBASE_FRAMES
from keras_attn.ops.masking import nan_where
from keras_attn.models.conformer.conformer_model import greedy_chunk_tokens

# Feature frames per encoder frame (ConvSubsampling's two stride-2 convolutions).
SUBSAMPLING = 4


def export_streaming(model, path, format, precision="float32", chunk_size=None,
                     batch_size=1, vocabulary=None, verbose=False):
    """Writes the streaming step of `model` as a stateful ONNX or LiteRT
    model of fixed shapes into the directory `path`, with `serving.json`.

    Args:
        model: a streamable `ConformerCTC` or `ConformerTransducer` on
            waveforms (built with
            `chunk_size`, `left_context`, `causal_conv=True`,
            `feature_normalization="none"`).
        path: the directory to write (atomically).
        format: `"onnx"` or `"litert"`.
        precision: `"float32"`, `"float16"` (weights) or, for LiteRT,
            `"int8"` (dynamic-range int8 weights).
        chunk_size: encoder frames per chunk (default: the model's).
        batch_size: utterances streamed side by side (fixed).
        vocabulary: the tokens of ids 1..V (id 0 is the blank), written
            into `serving.json` for a runtime's decoding.

    Returns:
        `path`.

    Raises:
        ValueError: a model that cannot stream, a format or precision the
            converters do not offer, a `vocabulary` of the wrong size.
    """
    from keras_attn._checks import check_positive_int
    from keras_attn.export.portable import export_portable
    from keras_attn.export.saved_model import require_tensorflow_backend

    if format not in PORTABLE_FORMATS:
        raise ValueError(f"The streaming step is exported as {PORTABLE_FORMATS}. "
                         f"Received: format={format!r}")
    check_format(format, precision, onnx_int8=False)
    require_tensorflow_backend("export_streaming")
    batch_size = check_positive_int("batch_size", batch_size)
    streamer = model.streamer(chunk_size)  # a ValueError for a model that cannot stream
    if streamer.log_mel is None:
        raise ValueError(
            "Invalid value for argument `model`: the exported step takes audio chunks "
            "(a model with input_type='waveform'). Received: a model with "
            f"input_type={streamer.input_type!r}")
    from keras_attn.models.conformer import ConformerTransducer

    transducer = isinstance(model, ConformerTransducer)
    if vocabulary is not None and len(vocabulary) != model.vocabulary_size:
        raise ValueError(
            f"Invalid value for argument `vocabulary`: the {model.vocabulary_size} tokens of "
            f"ids 1..{model.vocabulary_size}. Received: {len(vocabulary)} tokens")
    geometry = _steady_geometry(streamer, batch_size)
    step = (_TransducerStreamingStep if transducer else _StreamingStep)(model, streamer, geometry)
    inputs = {"chunk": keras.Input(batch_shape=(batch_size, geometry["chunk_samples"]),
                                   dtype="float32", name="chunk"),
              "chunk_length": keras.Input(batch_shape=(batch_size,), dtype="int32",
                                          name="chunk_length")}
    for spec in step.state_specs:
        inputs[spec["input"]] = keras.Input(batch_shape=tuple(spec["shape"]),
                                            dtype=spec["dtype"], name=spec["input"])
    # A list of inputs: export_portable's signature is one spec per input, in order.
    serving = keras.Model(list(inputs.values()), step(inputs), name="conformer_streaming_step")
    config = model.conformer_config
    streaming = {
        "chunk_samples": geometry["chunk_samples"],
        "chunk_size": streamer.chunk_size,
        "left_context": streamer.left_context,
        "sampling_rate": int(config.sampling_rate),
        "batch_size": batch_size,
        "flush_chunks": geometry["flush_chunks"],
        "chunk_input": "chunk",
        "chunk_length_input": "chunk_length",
        "state": step.state_specs,
        "blank_id": 0,
        "vocabulary": list(vocabulary) if vocabulary is not None else None,
        "chunk_ms": 1000.0 * geometry["chunk_samples"] / config.sampling_rate,
    }
    return export_portable(
        serving, path, format, precision, verbose=verbose,
        preprocessing={"chunk": "float32 audio in [-1, 1] at the model's sampling rate, "
                                f"{geometry['chunk_samples']} samples per call",
                       "sampling_rate": int(config.sampling_rate),
                       "token_ids": step.token_ids_note},
        extra={"streaming": streaming})


def _steady_geometry(streamer, batch_size):
    """The state's steady lengths, read from Keras's own streaming code run
    on three chunks of silence: `R` samples, `S` feature frames and `P`
    encoder frames held between chunks, the same after every chunk from the
    first on (else a ValueError: a geometry this export cannot hold)."""
    import numpy as np

    log_mel = streamer.log_mel
    samples = streamer.chunk_size * streamer.step
    state = streamer.initial_state(batch_size)
    # The subsampling's frames: ConvSubsampling's "frames", or each
    # FastConvSubsampling stage's "frames_<i>" (one or two a stage).
    buffers = [name for name in streamer.state_names()
               if name.startswith("subsampling/frames")]
    held = []
    for _ in range(3):
        _, state = streamer.stream_step(np.zeros((batch_size, samples), "float32"), state)
        held.append((int(state["log_mel/samples"].shape[1]),
                     tuple(int(state[name].shape[1]) for name in buffers),
                     int(state["encoder/frames"].shape[1])))
    (r, stages, p), half, hop = held[0], log_mel.fft_length // 2, log_mel.frame_step
    if held.count(held[0]) != 3 or (r - half) % hop or r < half:
        raise ValueError(
            "Invalid value for argument `chunk_size`: the streaming state must hold as "
            "much after the first chunk as after the next ones for a fixed-shape export. "
            f"Received: chunk_size={streamer.chunk_size}, held lengths {held}")
    # Encoder frames still to come at the end of a stream, from the frames
    # and samples held, through the end's half a window of zeros.
    # A frame held by stage i (from 0) stands for 2**i feature frames; a
    # FastConvSubsampling's stages end on their zero frame after the
    # utterance (an encoder frame more at most: `factor` feature frames).
    factor = streamer.subsampling_factor
    held_frames = sum(count << stage for stage, count in enumerate(stages))
    right_padding = 0 if factor == SUBSAMPLING else factor
    mel_left = held_frames + math.ceil((r + half) / hop) + 1 + right_padding
    encoder_left = p + math.ceil(mel_left / factor)
    steady = {name: count for name, count in zip(buffers, stages)}
    steady.update({name.replace("/frames", "/mask"): count for name, count in steady.items()})
    steady.update({"log_mel/samples": r, "encoder/frames": p, "encoder/mask": p})
    return {"batch_size": batch_size, "chunk_samples": samples, "samples": r,
            "steady": steady, "pending": p, "dummy_frames": (r - half) // hop,
            "flush_chunks": math.ceil(encoder_left / streamer.chunk_size)}


class _StreamingStep(keras.layers.Layer):
    """One chunk of `ConformerStreamer` with every state tensor of a
    fixed shape (the module docstring). The layers are the model's,
    shared."""

    token_ids_note = ("greedy CTC per frame: ids 1..V, -1 where the frame emits none "
                      "(blank, a repeat, past the end), -2 on every frame of a row refused "
                      "(NaN logits)")
    # The decoder's state entries, after the streamer's, and their start
    # values beside the steady geometry's (a list: one row, broadcast).
    decoder_names = ("decoder/last",)

    def __init__(self, model, streamer, geometry):
        super().__init__(name="streaming_step")
        self.model, self.streamer, self.geometry = model, streamer, geometry
        self.state_specs = self._state_specs()

    def decoder_initial(self, keras_state):
        return {"decoder/last": -1}

    def _state_specs(self):
        """`{name, input, output, shape, dtype, initial}` of each state
        tensor: Keras's entries (`ConformerStreamer.state_names`) at their
        steady lengths, and the greedy decoder's last token."""
        g, specs = self.geometry, []
        steady = g["steady"]
        keras_state = self.model.initial_state(1, self.streamer.chunk_size)
        initial = {"log_mel/next_frame": -g["dummy_frames"], **self.decoder_initial(keras_state)}
        # `received` counts samples: `next_frame` says the same with chunks of one length.
        for name in [*self.streamer.state_names(), *self.decoder_names]:
            # The chunk size is the step's shapes': nothing to carry.
            if name in ("log_mel/received", "chunk_size"):
                continue
            shape = [g["batch_size"], *(int(dim) for dim in keras_state[name].shape[1:])]
            if name in steady:
                shape[1] = steady[name]
            specs.append({"name": name, "input": name.replace("/", "_"),
                          "output": "next_" + name.replace("/", "_"), "shape": shape,
                          "dtype": keras.backend.standardize_dtype(keras_state[name].dtype),
                          "initial": initial.get(name, 0)})
        # Keras's frame counter is one for the batch; here each row has one.
        next_frame = next(spec for spec in specs if spec["name"] == "log_mel/next_frame")
        next_frame["shape"] = [g["batch_size"]]
        return specs

    def call(self, inputs):
        state = {spec["name"]: inputs[spec["input"]] for spec in self.state_specs}
        x, real, invalid, new = self._encode(inputs, state)
        result = self._decode(x, real, invalid, state, new)
        for spec in self.state_specs:
            result[spec["output"]] = ops.cast(new[spec["name"]], spec["dtype"])
        return result

    def _invalid_decoder_state(self, state):
        return ops.less(state["decoder/last"], -1)

    def _decode(self, x, real, invalid, state, new):
        """The CTC head's logits of the chunk's frames `x` and their greedy
        tokens, with the decoder's next state in `new`."""
        logits = nan_where(invalid, ops.cast(self.streamer.head(x), "float32"))  # (B, C, V + 1)
        token_ids, new["decoder/last"] = greedy_chunk_tokens(logits, real, state["decoder/last"])
        # -2 on every frame of an invalid row: -1 means "no token" (silence),
        # and a runtime reading only the tokens must not hear silence there.
        token_ids = ops.where(ops.expand_dims(invalid, 1), -2, token_ids)
        return {"logits": logits, "token_ids": token_ids}

    def _encode(self, inputs, state):
        """The chunk through the front end, the subsampling and the blocks:
        the last blocks' frames `(B, C, D)` of the attention chunk that
        completed, their real count `(B,)`, the rows refused `(B,)` and the
        encoder's next state."""
        streamer, g = self.streamer, self.geometry
        log_mel, subsampling = streamer.log_mel, streamer.subsampling
        chunk = ops.cast(inputs["chunk"], "float32")
        width, hop, half = g["chunk_samples"], log_mel.frame_step, log_mel.fft_length // 2
        ended = state["log_mel/ended"]
        given = ops.where(ended, 0, ops.clip(inputs["chunk_length"], 0, width))  # (B,)
        inside = ops.less(ops.expand_dims(ops.arange(width), 0), ops.expand_dims(given, 1))
        # Nothing can raise here: a row given samples outside [-1, 1] (int16
        # audio as floats) or not finite, or a state whose counters cannot
        # be (a negative count), gets NaN logits, never another transcript.
        outside = ops.logical_and(inside, ops.logical_not(ops.less_equal(ops.abs(chunk), 1.0)))
        invalid = ops.any(outside, axis=1)  # (B,): NaN fails the comparison too
        for name in ("log_mel/length", "logit_length"):
            invalid = ops.logical_or(invalid, ops.less(state[name], 0))
        invalid = ops.logical_or(invalid, self._invalid_decoder_state(state))
        samples = ops.where(inside, chunk, 0.0)  # (B, n), zeros past each end
        length = state["log_mel/length"] + given
        first = ops.less(state["log_mel/next_frame"], 0)  # (B,): before the first chunk
        # The first chunk: d masked frames' zeros, then the centred STFT's
        # reflection of the first samples about sample 0.
        start = ops.concatenate(
            [ops.zeros((g["batch_size"], g["samples"] - half), "float32"),
             ops.flip(samples[:, 1:half + 1], axis=1)], axis=1)  # (B, R)
        held = ops.where(ops.expand_dims(first, 1), start, state["log_mel/samples"])
        buffer = ops.concatenate([held, samples], axis=1)  # (B, R + n)
        frames_count = width // hop
        window = buffer[:, :(frames_count - 1) * hop + log_mel.fft_length]
        power = _mel_power(log_mel, window, inputs["chunk_length"])  # (B, F, mels)
        features = ops.maximum(10.0 * ops.log10(ops.cast(power, "float32")), -100.0)
        frames = (ops.expand_dims(state["log_mel/next_frame"], 1)
                  + ops.expand_dims(ops.arange(frames_count, dtype="int32"), 0))  # (B, F)
        valid = ops.logical_and(ops.greater_equal(frames, 0), ops.less_equal(
            frames * hop, ops.expand_dims(length, 1)))
        features = features * ops.expand_dims(ops.cast(valid, "float32"), -1)
        # The counters from an origin moved forward by whole frames past
        # REBASE_FRAMES (as LogMelFeatures.stream_step does): samples in
        # int32 would wrap after 2**31 (37 h at 16 kHz).
        next_frame = state["log_mel/next_frame"] + frames_count  # (B,)
        moved = ops.where(next_frame > REBASE_FRAMES, next_frame - 2, 0)  # (B,) frames
        new = {"log_mel/samples": buffer[:, frames_count * hop:],
               "log_mel/next_frame": next_frame - moved,
               "log_mel/length": ops.maximum(length - moved * hop, 0),
               "log_mel/ended": ops.logical_or(ended, ops.less(inputs["chunk_length"], width))}
        if streamer.subsampling_factor == SUBSAMPLING:
            # ConvSubsampling: output t reads frames 4t .. 4t + 6; real when
            # its first (not a masked start) and last frames are.
            frames_in = ops.concatenate([state["subsampling/frames"],
                                         ops.cast(features, subsampling.compute_dtype)], axis=1)
            mask_in = ops.concatenate([state["subsampling/mask"], valid], axis=1)
            encoded = subsampling(frames_in, padding_mask=mask_in)  # (B, E, D)
            steps = encoded.shape[1]
            encoded_mask = ops.logical_and(mask_in[:, 0::SUBSAMPLING][:, :steps],
                                           mask_in[:, 6::SUBSAMPLING][:, :steps])
            new["subsampling/frames"] = frames_in[:, SUBSAMPLING * steps:]
            new["subsampling/mask"] = mask_in[:, SUBSAMPLING * steps:]
        else:
            # FastConvSubsampling's own step: its shapes are the state's and
            # the chunk's. A masked frame reads as zeros, so the masked start
            # (the d frames, then the zeros held) is the left padding; the
            # stages keep it an odd number of frames, as in Keras's stream.
            sub_state = {name[len("subsampling/"):]: value for name, value in state.items()
                         if name.startswith("subsampling/")}
            encoded, encoded_mask, sub_new = subsampling.stream_step(features, sub_state, valid)
            new.update({"subsampling/" + name: value for name, value in sub_new.items()})
        if streamer.input_scale is not None:
            encoded = encoded * streamer.input_scale
        # One attention chunk through the blocks and the head.
        size = streamer.chunk_size
        pending = ops.concatenate([state["encoder/frames"], encoded], axis=1)
        pending_mask = ops.concatenate([state["encoder/mask"], encoded_mask], axis=1)
        new["encoder/frames"], new["encoder/mask"] = pending[:, size:], pending_mask[:, size:]
        x, mask = pending[:, :size], pending_mask[:, :size]
        for i, block in enumerate(streamer.blocks):  # ConformerBlock.stream_step, cache by cache
            prefix = f"block_{i}/"
            x, cache = block.stream_step(
                x, {entry: state[prefix + entry] for entry in ("key", "value", "mask", "conv")},
                padding_mask=mask)
            new.update({prefix + entry: value for entry, value in cache.items()})
        real = ops.sum(ops.cast(pending_mask[:, :size], "int32"), axis=1)
        new["logit_length"] = state["logit_length"] + real
        return x, real, invalid, new


class _TransducerStreamingStep(_StreamingStep):
    """`_StreamingStep` of a `ConformerTransducer`: the encoder's chunk as
    there, projected (`encoder_projector`), then the greedy walk over its
    frames from the decoder's state (`ConformerTransducer.stream_step`'s:
    the prediction network's output and LSTM states, a TDT move past the
    chunk's end), one while loop (`transducer_greedy_ids`)."""

    token_ids_note = ("greedy transducer labels of the chunk's frames: ids 1..V, -1 after "
                      "the last (chunk_size x max_symbols_per_step wide), -2 on every slot "
                      "of a row refused (NaN frames)")

    def __init__(self, model, streamer, geometry):
        self.decoder_names = tuple(model.decoder_state_names())
        super().__init__(model, streamer, geometry)

    def decoder_initial(self, keras_state):
        # The start (after the blank) is one row of values, the same for every row.
        return {name: (0 if name == "decoder/skip" else
                       np.asarray(keras_state[name], "float32")[0].tolist())
                for name in self.decoder_names}

    def _invalid_decoder_state(self, state):
        return ops.less(state["decoder/skip"], 0)

    def _decode(self, x, real, invalid, state, new):
        from keras_attn.models.conformer import transducer_greedy_ids

        model, size = self.model, self.streamer.chunk_size
        frames = nan_where(invalid, ops.cast(self.streamer.head(x), "float32"))  # (B, C, P)
        names = self.decoder_names
        ids, (pointer, prediction, states) = transducer_greedy_ids(
            ops.where(ops.expand_dims(invalid, (1, 2)), 0.0, frames),
            ops.where(invalid, 0, real), model.predictor, model.joint, blank_id=0,
            durations=model.durations, max_symbols_per_step=model.max_symbols_per_step,
            initial_state=(state["decoder/skip"], state["decoder/prediction"],
                           [state[name] for name in names[1:-1]]),
            return_state=True)
        new["decoder/prediction"] = prediction
        new.update(dict(zip(names[1:-1], states)))
        new["decoder/skip"] = ops.maximum(pointer - size, 0)
        return {"frames": frames, "token_ids": ops.where(ops.expand_dims(invalid, 1), -2, ids)}


def _mel_power(log_mel, padded, chunk_length):
    """`LogMelFeatures._power_by_convolution(padded)` with the STFT's kernels
    and the mel matrix chosen at run time, by a condition on `chunk_length`
    that always holds and that the converter cannot fold: LiteRT's int8
    option quantizes the constant weights of convolutions and matmuls, these
    included (the streaming digits' test WER went from 0 to 4.4%: raw
    decibels read the leakage); a tensor computed at run time stays float32,
    the encoder's weights int8. No value changes."""
    always = ops.greater_equal(chunk_length[0], np.iinfo("int32").min)  # True, at run time
    kernel = ops.where(always, ops.convert_to_tensor(log_mel._dft_kernel()), 0.0)
    mel_matrix = ops.where(always, log_mel._mel_matrix(), 0.0)
    return log_mel._power_by_convolution(padded, mel_matrix=mel_matrix, kernel=kernel)
