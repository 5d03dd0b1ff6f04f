"""Log-mel features with per-utterance normalisation, inside the model."""

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_choice
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_static_shape
from keras_attn.layers.streaming import check_audio_range
from keras_attn.layers.streaming import check_built
from keras_attn.layers.streaming import check_counter
from keras_attn.layers.streaming import check_state_tensor

# How the power spectrum is computed: the backend's FFT (Keras's
# MelSpectrogram), or the DFT as a convolution (for ONNX and LiteRT).
STFT_MODES = ("fft", "convolution")
# What the decibels become: per-utterance floor and mean / variance
# normalisation (reads the whole utterance), or none (each frame on its
# own, so the features can be computed as the audio arrives).
NORMALIZATIONS = ("utterance", "none")
# A stream's sample and frame counters count from an origin that moves
# forward (by whole frames) once `next_frame` passes this many frames
# (about 3 h at 16 kHz and 10 ms frames): int32 counters of samples would
# wrap after 2**31 samples (37 h), and a stream may run for days.
REBASE_FRAMES = 2 ** 20


def outside_lengths(lengths, size):
    """`(B,)` bool: which of `lengths` lie outside `[0, size]`, compared in
    their own dtype (a cast to int32 first would wrap an int64 2**32 + 3 to
    a valid 3); `size` an int or a scalar tensor."""
    if isinstance(lengths, (np.ndarray, np.generic, list)) and isinstance(size, int):
        # Compared in NumPy: JAX without x64 would make an int64 array int32
        # itself (wrapped) in `convert_to_tensor`.
        values = np.asarray(lengths)
        return ops.convert_to_tensor((values < 0) | (values > size))
    lengths = ops.convert_to_tensor(lengths)
    if keras.backend.standardize_dtype(lengths.dtype) == "bool":
        lengths = ops.cast(lengths, "int32")
    return ops.logical_or(lengths < 0, lengths > ops.cast(size, lengths.dtype))


def int32_or_minus_one(lengths):
    """NumPy integer `lengths` with each value past int32 replaced by -1
    (and as int32); anything else as it is."""
    if not isinstance(lengths, (np.ndarray, np.generic)) or lengths.dtype.kind not in "iu":
        return lengths
    values = np.asarray(lengths)
    outside = (values < -2 ** 31) | (values > 2 ** 31 - 1)
    return np.where(outside, -1, values).astype("int32") if outside.any() else lengths


def windowed_dft_kernel(window):
    """`(N, 1, 2F)` float32, `F = N // 2 + 1`: the cosines and minus the
    sines of the `N`-point DFT times `window` (`(N,)`, the FFT's length; a
    shorter window zero-padded around its centre), the kernel with which
    `stft_power_by_convolution` computes an STFT. NumPy: a constant
    wherever it is converted, in any trace."""
    window = np.asarray(window, "float64")
    n = window.shape[0]
    angles = 2 * np.pi * np.outer(np.arange(n), np.arange(n // 2 + 1)) / n
    kernel = np.concatenate([window[:, None] * np.cos(angles),
                             -window[:, None] * np.sin(angles)], axis=1)
    return kernel[:, None, :].astype("float32")


def stft_power_by_convolution(padded, kernel, frame_step):
    """The power spectrum `|X|^2` `(B, T, F)` of the uncentred frames of
    `padded` `(B, N)` (frame `t` is samples `t * frame_step ..` + the FFT's
    length), the DFT as a strided convolution with `kernel`
    (`windowed_dft_kernel`, `(N, 1, 2F)`). The front ends' exportable STFT:
    tf2onnx refuses the Real/Imag ops after an RFFT and LiteRT has no
    builtin for them, while a convolution is everywhere. The FFT's numbers
    within float32 rounding (tested)."""
    spectrum = ops.conv(ops.expand_dims(padded, -1), kernel, strides=frame_step)  # (B, T, 2F)
    bins = kernel.shape[-1] // 2
    return ops.square(spectrum[..., :bins]) + ops.square(spectrum[..., bins:])


class WaveformLengths:
    """Mixed into the front ends (before `keras.layers.Layer`): a NumPy
    `waveform_length` past int32 becomes -1 (NaN features, as any length
    outside [0, N]) before Keras converts it: JAX without x64 makes an int64
    array int32 there, wrapped (2**32 + 3 -> a valid 3)."""

    def __call__(self, *args, **kwargs):
        if len(args) > 1:
            args = (args[0], int32_or_minus_one(args[1])) + args[2:]
        elif "waveform_length" in kwargs:
            kwargs["waveform_length"] = int32_or_minus_one(kwargs["waveform_length"])
        return super().__call__(*args, **kwargs)


@keras.saving.register_keras_serializable(package="keras_attn")
class LogMelFeatures(WaveformLengths, keras.layers.Layer):
    """Waveform `(B, N)` -> log-mel features `(B, T, num_mel_bins)`.

    `keras.layers.MelSpectrogram` (centred frames, so `T = 1 + N // frame_step`),
    in decibels floored at `top_db` below the utterance's own loudest valid
    frame, then, per utterance and per mel bin, mean and variance
    normalisation over the utterance's valid frames only; padded frames are
    set to 0. Keeping it in the model means a SavedModel takes raw audio.

    An utterance's features depend on its own `waveform_length` samples
    only, never on the padding after them or on the other utterances of the
    batch: samples past the length are zeroed, the frames near the end see
    zeros past it whether or not more padding follows, and the decibel floor
    is per utterance (Keras's is over the whole batch). A `waveform_length`
    below 0 or above the padded length `N` gives NaN features (an error that
    cannot go unseen where no Python check runs).

    Args:
        sampling_rate: audio sampling rate in Hz.
        num_mel_bins: mel bands.
        frame_length: window length in samples (400 = 25 ms at 16 kHz).
        frame_step: hop in samples (160 = 10 ms).
        fft_length: FFT size (>= frame_length).
        epsilon: added to the variance.
        top_db: the dynamic range kept below each utterance's loudest bin.
        normalization: `"utterance"` (the decibel floor and the mean and
            variance normalisation above) or `"none"`: the decibels floored
            at -100 dB, each frame on its own, which is what streaming needs
            (the utterance's loudest frame, mean and variance are not known
            while it is spoken).
        stft: `"fft"` (the backend's FFT, through `keras.layers.MelSpectrogram`)
            or `"convolution"` (the DFT as a strided convolution: the same
            numbers within float32 rounding, and a graph ONNX and LiteRT can
            hold; the ONNX / LiteRT speech export switches to it). No
            weights depend on it.
        **kwargs: base layer arguments.

    Call arguments:
        waveform: `(B, N)` float audio in [-1, 1] (a row with a valid
            sample outside it gets NaN features).
        waveform_length: `(B,)` valid samples per utterance (default: all N).

    Returns:
        `(B, T, num_mel_bins)`.

    Streaming (`normalization="none"`): `initial_state(batch_size)`, then
    `stream_step(samples, state, chunk_length)` for each chunk of samples and
    `flush(state)` at the end give, frame by frame, the features of the
    whole-utterance call; the state carries the samples the next frames'
    windows still need (a window overlaps the next `frame_length` / `frame_step`
    ones) and each utterance's valid length.

    Example:

    >>> import numpy as np
    >>> layer = LogMelFeatures(num_mel_bins=40)
    >>> tuple(layer(np.zeros((2, 16000), "float32")).shape)
    (2, 101, 40)
    """

    def __init__(
        self,
        sampling_rate=16000,
        num_mel_bins=80,
        frame_length=400,
        frame_step=160,
        fft_length=512,
        epsilon=1e-5,
        top_db=80.0,
        stft="fft",
        normalization="utterance",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sampling_rate = check_positive_int("sampling_rate", sampling_rate)
        self.num_mel_bins = check_positive_int("num_mel_bins", num_mel_bins)
        self.frame_length = check_positive_int("frame_length", frame_length)
        self.frame_step = check_positive_int("frame_step", frame_step)
        self.fft_length = check_positive_int("fft_length", fft_length)
        if self.fft_length < self.frame_length:
            raise ValueError(
                "`fft_length` must be at least `frame_length`. Received: "
                f"fft_length={fft_length}, frame_length={frame_length}"
            )
        self.epsilon = check_positive_float("epsilon", epsilon)
        if stft not in STFT_MODES:
            raise ValueError(f"`stft` must be one of {STFT_MODES}. Received: stft={stft!r}")
        # Not a weight: ONNX and LiteRT export switch it to "convolution".
        self.stft = stft
        self.top_db = check_positive_float("top_db", top_db)
        self.normalization = check_choice("normalization", normalization, NORMALIZATIONS)

    def build(self, waveform_shape, waveform_length_shape=None):
        self.mel_spectrogram = keras.layers.MelSpectrogram(
            fft_length=self.fft_length,
            sequence_stride=self.frame_step,
            sequence_length=self.frame_length,
            sampling_rate=self.sampling_rate,
            num_mel_bins=self.num_mel_bins,
            power_to_db=False,  # in `call`, per utterance
            dtype=self.dtype_policy,
            name="mel_spectrogram",
        )
        # Built here, not at its first call: a model loaded from a .keras file
        # is not called before `model.quantize("int8")`, which refuses unbuilt
        # layers.
        self.mel_spectrogram.build(waveform_shape)
        self.built = True

    def num_frames(self, waveform_length):
        """Frames of an utterance of `waveform_length` samples (centred STFT)."""
        return 1 + waveform_length // self.frame_step

    def call(self, waveform, waveform_length=None):
        waveform = ops.cast(waveform, "float32")  # (B, N)
        samples = ops.shape(waveform)[1]
        steps = 1 + samples // self.frame_step  # frames of the padded batch
        if waveform_length is None:
            lengths = None
        else:
            # Out of [0, N] in the lengths' own dtype: an int64 2**32 + 3
            # cast to int32 first would wrap to a valid 3.
            bad = outside_lengths(waveform_length, samples)  # (B,)
            lengths = ops.cast(waveform_length, "int32")  # (B,)
            inside = ops.less(ops.expand_dims(ops.arange(samples), 0), ops.expand_dims(lengths, 1))
            waveform = ops.where(inside, waveform, 0.0)
        # A valid sample outside [-1, 1] (16-bit PCM given as floats,
        # x 32768) would make other features, not an error: that row's
        # features become NaN, as for a length outside [0, N] (where Python
        # runs, the models refuse it first, naming the sample).
        loud = ops.any(ops.greater(ops.abs(waveform), 1.0), axis=1)  # (B,)
        bad = loud if lengths is None else ops.logical_or(bad, loud)
        # Zeros after the end: the last valid frames' windows reach half an
        # FFT past the length and must see zeros there whether or not the
        # batch pads this utterance (the STFT reflects the array's own end).
        waveform = ops.pad(waveform, [[0, 0], [0, self.fft_length // 2]])
        # The STFT and the logarithm run in float32 whatever the policy.
        if self.stft == "fft":
            power = self.mel_spectrogram(waveform)  # (B, M, T + extra)
        else:
            power = self._mel_power_by_convolution(waveform)
        power = ops.cast(ops.transpose(power, (0, 2, 1)), "float32")[:, :steps]  # (B, T, M)
        # dB, floored at -100 (a power of 1e-10) after the logarithm: the same
        # numbers as flooring the power first, but with no constant below
        # float16's range (LiteRT's float16 export stores constants in float16:
        # a 1e-10 floor became 0, log10(0) = -inf, and every logit NaN).
        features = ops.maximum(10.0 * ops.log10(power), -100.0)
        if lengths is None:
            valid = ops.ones_like(features[:, :, :1])
        else:
            frames = self.num_frames(lengths)
            valid = ops.less(ops.expand_dims(ops.arange(steps), 0), ops.expand_dims(frames, 1))
            valid = ops.expand_dims(ops.cast(valid, "float32"), -1)  # (B, T, 1)
        if self.normalization == "utterance":
            features = self._normalise(features, valid)
        else:
            features = features * valid
        features = ops.where(ops.expand_dims(bad, (1, 2)), float("nan"), features)
        return ops.cast(features, self.compute_dtype)

    def _normalise(self, features, valid):
        """Per utterance: the decibel floor `top_db` below the loudest valid
        frame, then mean and variance normalisation over the valid frames."""
        loudest = ops.max(features * valid + (valid - 1.0) * 1e9, axis=(1, 2), keepdims=True)
        features = ops.maximum(features, loudest - self.top_db)
        count = ops.maximum(ops.sum(valid, axis=1, keepdims=True), 1.0)  # (B, 1, 1)
        mean = ops.sum(features * valid, axis=1, keepdims=True) / count
        variance = ops.sum(ops.square(features - mean) * valid, axis=1, keepdims=True) / count
        return (features - mean) / ops.sqrt(variance + self.epsilon) * valid

    def _mel_power_by_convolution(self, waveform):
        """What `keras.layers.MelSpectrogram` computes (centred STFT with
        reflect padding, periodic Hann window, power, mel matrix), with the
        DFT as a strided convolution (`stft_power_by_convolution`), which
        the converters can take. Equal to the FFT path within float32
        rounding (tested)."""
        n = self.fft_length
        x = ops.pad(waveform, [[0, 0], [n // 2, n // 2]], mode="reflect")
        return ops.transpose(self._power_by_convolution(x), (0, 2, 1))

    def _power_by_convolution(self, padded, mel_matrix=None, kernel=None):
        """Mel power `(B, T, M)` of the uncentred frames of `padded` `(B, N)`
        (frame `t` is samples `t * frame_step ..` + fft_length); `mel_matrix`
        defaults to `_mel_matrix()`, `kernel` to `_dft_kernel()` (the
        streaming export passes both, computed at run time)."""
        if kernel is None:
            kernel = ops.convert_to_tensor(self._dft_kernel())  # (N, 1, 2F)
        power = stft_power_by_convolution(padded, kernel, self.frame_step)  # (B, T, F)
        return ops.matmul(power, self._mel_matrix() if mel_matrix is None else mel_matrix)

    def _dft_kernel(self):
        """The windowed DFT's cosines and sines, `(N, 1, 2F)` float32, in
        NumPy: made once per layer and safe to reuse in any trace (a NumPy
        array is a constant wherever it is converted)."""
        if getattr(self, "_dft_kernel_cache", None) is None:
            n, length = self.fft_length, self.frame_length
            window = np.zeros(n)  # the periodic Hann window, centred in the FFT
            start = (n - length) // 2
            window[start:start + length] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)
            self._dft_kernel_cache = windowed_dft_kernel(window)
        return self._dft_kernel_cache

    def _mel_matrix(self):
        """Keras's mel weight matrix `(F, M)`, computed where it is called
        (in a trace, as part of it): the whole-utterance call and the
        exports trace it once per graph."""
        mel = self.mel_spectrogram
        matrix = mel.linear_to_mel_weight_matrix(
            num_mel_bins=mel.num_mel_bins, num_spectrogram_bins=self.fft_length // 2 + 1,
            sampling_rate=mel.sampling_rate, lower_edge_hertz=mel.min_freq,
            upper_edge_hertz=mel.max_freq)
        return ops.cast(matrix, "float32")

    def _eager_mel_matrix(self):
        """`_mel_matrix()` as a NumPy array, computed at the first streaming
        step and kept (not a weight: saved files and `weights` do not
        change). Only `_step` calls it, and `_step` runs eagerly on every
        backend (it reads its inputs and state to NumPy first, which fails
        inside a `jax.jit` trace or a `tf.function`), so the array is always
        the eager matrix, never a tracer or a graph tensor of one trace.
        The same numbers as computing it at every step."""
        if getattr(self, "_mel_matrix_cache", None) is None:
            self._mel_matrix_cache = ops.convert_to_numpy(self._mel_matrix())
        return self._mel_matrix_cache

    def _power_by_fft(self, padded, mel_matrix):
        """What `self.mel_spectrogram` computes from a waveform, for the
        uncentred frames of `padded` (its centring done by the caller)."""
        mel = self.mel_spectrogram
        real, imag = ops.stft(padded, sequence_length=self.frame_length,
                              sequence_stride=self.frame_step, fft_length=self.fft_length,
                              window=mel.window, center=False)
        magnitude = ops.sqrt(ops.square(real) + ops.square(imag))
        return ops.tensordot(ops.power(magnitude, mel.mag_exp), mel_matrix, axes=1)

    # === Streaming ===

    def initial_state(self, batch_size):
        """The streaming state before the first sample.

        `samples` `(B, s)`: the samples the next frames still need (before
        the first frame, the utterances' first samples; then the centred
        STFT's padded samples from the next frame's window start on);
        `received` `()`: samples fed so far; `next_frame` `()`: frames given
        so far; `length` `(B,)`: each utterance's valid samples; `ended`
        `(B,)`: whether it has ended (a chunk shorter than the others).
        The three counters count from the stream's start until `next_frame`
        passes `REBASE_FRAMES`, then from an origin moved forward by whole
        frames (an ended utterance's `length` held at 0), so that they stay
        far below int32's limit however long the stream runs.
        """
        self._check_streamable()
        check_built(self)
        return {
            "samples": ops.zeros((batch_size, 0), "float32"),
            "received": ops.convert_to_tensor(0, "int32"),
            "next_frame": ops.convert_to_tensor(0, "int32"),
            "length": ops.zeros((batch_size,), "int32"),
            "ended": ops.zeros((batch_size,), "bool"),
        }

    def check_state(self, state, batch_size, prefix=""):
        """A ValueError naming the entry of `state` that does not fit."""
        shapes = {"samples": ((batch_size, None), "float32"), "received": ((), "int32"),
                  "next_frame": ((), "int32"), "length": ((batch_size,), "int32"),
                  "ended": ((batch_size,), "bool")}
        if not isinstance(state, dict) or set(state) != set(shapes):
            raise ValueError(
                f"Invalid value for argument `state`: a dict of {sorted(shapes)}, as "
                "`initial_state` returns. Received: state="
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        for name, (shape, dtype) in shapes.items():
            check_state_tensor(prefix + name, state[name], shape, dtype)
        for name, unit in (("received", "samples"), ("next_frame", "frames"),
                           ("length", "samples")):
            check_counter(prefix + name, state[name], unit)

    def stream_step(self, samples, state, chunk_length=None):
        """The frames that the samples received so far complete.

        Args:
            samples: `(B, n)`, the next `n` samples of every utterance.
            state: the previous step's state (`initial_state` at the start).
            chunk_length: `(B,)` valid samples of each row of `samples`
                (default: all `n`). A row given fewer than `n` has ended:
                its later chunks must give it 0.

        Returns:
            `(features (B, f, num_mel_bins), frame_mask (B, f), new_state)`:
            the next `f` frames of the whole-utterance call with
            `waveform_length` the utterances' lengths, and which of them are
            real; `state` is not changed.
        """
        return self._step(samples, state, chunk_length, final=False)

    def flush(self, state):
        """The last frames (whose windows reach past the end, into zeros):
        `(features, frame_mask, new_state)` as `stream_step`."""
        if not isinstance(state, dict) or not hasattr(state.get("length"), "shape"):
            self.check_state(state, None)
        batch = state["length"].shape[0]
        return self._step(ops.zeros((batch, 0), "float32"), state, None, final=True)

    def _step(self, samples, state, chunk_length, final):
        self._check_streamable()
        if len(samples.shape) != 2:
            raise ValueError(
                "Invalid value for argument `samples`: a chunk is (B, n) samples. "
                f"Received: samples.shape={tuple(samples.shape)}"
            )
        batch, width = samples.shape
        self.check_state(state, batch)
        samples = ops.cast(samples, "float32")
        values = ops.convert_to_numpy(samples)
        if not np.isfinite(values).all():
            rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
            raise ValueError(
                "Invalid value for argument `samples`: audio samples must be "
                f"finite. Received: samples with NaN or inf in row(s) {rows.tolist()}"
            )
        check_audio_range("samples", values)
        if chunk_length is None:
            chunk_length = ops.full((batch,), width, "int32")
        # Read before the int32 cast, which would wrap an int64 2**32 + 5 to 5.
        lengths = np.asarray(ops.convert_to_numpy(chunk_length)).astype("int64")
        chunk_length = ops.convert_to_tensor(np.clip(lengths, -1, width + 1).astype("int32"))
        check_static_shape("chunk_length", chunk_length, (batch,), "(B,)")
        ended = ops.convert_to_numpy(state["ended"])
        if (lengths < 0).any() or (lengths > width).any() or (ended & (lengths > 0)).any():
            raise ValueError(
                "Invalid value for argument `chunk_length`: each row's valid "
                f"samples, between 0 and the chunk's {width}, and 0 for an "
                "utterance that has ended. Received: chunk_length="
                f"{lengths.tolist()} (ended: {ended.tolist()})"
            )
        inside = ops.less(ops.expand_dims(ops.arange(width), 0), ops.expand_dims(chunk_length, 1))
        samples = ops.where(inside, samples, 0.0)  # (B, n), zeros past each end
        # The counters in Python ints and int64 (an int32 sum could wrap);
        # moved back to small int32 values below.
        length = ops.convert_to_numpy(state["length"]).astype("int64") + lengths  # (B,)
        half, hop = self.fft_length // 2, self.frame_step
        before = int(ops.convert_to_numpy(state["received"]))
        received = before + width
        first = int(ops.convert_to_numpy(state["next_frame"]))
        buffer = ops.concatenate([state["samples"], samples], axis=1)
        started = before >= half + 1  # the buffer already holds the centring
        if final:
            # The whole-utterance call pads half an FFT of zeros at the end.
            buffer = ops.pad(buffer, [[0, 0], [0, half]])
        if not started and (received >= half + 1 or (final and received > 0)):
            # The centred STFT reflects the first samples about sample 0.
            buffer = ops.concatenate([ops.flip(buffer[:, 1:half + 1], axis=1), buffer], axis=1)
            started = True
        last = received // hop if final else (received - half) // hop
        count = max(last - first + 1, 0) if started else 0
        # The frames' centres against the lengths, in int64 (frame x hop can
        # pass int32's limit before the counters are moved back).
        frames = (first + np.arange(count, dtype="int64")) * hop  # (f,)
        valid = ops.convert_to_tensor(frames[None, :] <= length[:, None])  # (B, f)
        moved, next_frame = 0, first + count
        if next_frame > REBASE_FRAMES and not final:
            # Keep 2 frames: the samples still held then cover the centring
            # (received stays > half), so `started` reads the same.
            moved = (next_frame - 2) * hop
            next_frame = 2
        new_state = {
            "samples": buffer[:, count * hop:],
            "received": ops.convert_to_tensor(received - moved, "int32"),
            "next_frame": ops.convert_to_tensor(next_frame, "int32"),
            # An utterance that ended before the new origin: 0 (every later
            # frame's centre lies past it, as before).
            "length": ops.convert_to_tensor(np.maximum(length - moved, 0).astype("int32")),
            # After the flush every utterance has ended: more samples are refused.
            "ended": (ops.ones_like(state["ended"]) if final else
                      ops.logical_or(state["ended"], ops.less(chunk_length, width))),
        }
        if count == 0:
            features = ops.zeros((batch, 0, self.num_mel_bins), self.compute_dtype)
            return features, ops.zeros((batch, 0), "bool"), new_state
        window = buffer[:, :(count - 1) * hop + self.fft_length]
        mel_matrix = ops.convert_to_tensor(self._eager_mel_matrix())
        if self.stft == "fft":
            power = self._power_by_fft(window, mel_matrix)  # (B, f, M)
        else:
            power = self._power_by_convolution(window, mel_matrix)
        features = ops.maximum(10.0 * ops.log10(ops.cast(power, "float32")), -100.0)
        features = features * ops.expand_dims(ops.cast(valid, "float32"), -1)
        return ops.cast(features, self.compute_dtype), valid, new_state

    def _check_streamable(self):
        if self.normalization != "none":
            raise ValueError(
                "Streaming needs features that do not depend on the rest of the "
                "utterance: build the layer with normalization='none'. Received: "
                f"normalization={self.normalization!r}"
            )

    def compute_output_shape(self, waveform_shape, waveform_length_shape=None):
        # Declared rather than traced: JAX cannot trace the STFT's reflect
        # padding for an unknown number of samples.
        samples = waveform_shape[1]
        frames = None if samples is None else 1 + samples // self.frame_step
        return (waveform_shape[0], frames, self.num_mel_bins)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sampling_rate": self.sampling_rate,
                "num_mel_bins": self.num_mel_bins,
                "frame_length": self.frame_length,
                "frame_step": self.frame_step,
                "fft_length": self.fft_length,
                "epsilon": self.epsilon,
                "top_db": self.top_db,
                "stft": self.stft,
                "normalization": self.normalization,
            }
        )
        return config
