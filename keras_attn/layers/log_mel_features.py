"""Log-mel features with per-utterance normalisation, inside the model."""

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int

# How the power spectrum is computed: the backend's FFT (Keras's
# MelSpectrogram), or the DFT as a convolution (for ONNX and LiteRT).
STFT_MODES = ("fft", "convolution")


@keras.saving.register_keras_serializable(package="keras_attn")
class LogMelFeatures(keras.layers.Layer):
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
        stft: `"fft"` (the backend's FFT, through `keras.layers.MelSpectrogram`)
            or `"convolution"` (the DFT as a strided convolution: the same
            numbers within float32 rounding, and a graph ONNX and LiteRT can
            hold; the ONNX / LiteRT speech export switches to it). No
            weights depend on it.
        **kwargs: base layer arguments.

    Call arguments:
        waveform: `(B, N)` float audio in [-1, 1].
        waveform_length: `(B,)` valid samples per utterance (default: all N).

    Returns:
        `(B, T, num_mel_bins)`.

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
            lengths = ops.cast(waveform_length, "int32")  # (B,)
            inside = ops.less(ops.expand_dims(ops.arange(samples), 0), ops.expand_dims(lengths, 1))
            waveform = ops.where(inside, waveform, 0.0)
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
        loudest = ops.max(features * valid + (valid - 1.0) * 1e9, axis=(1, 2), keepdims=True)
        features = ops.maximum(features, loudest - self.top_db)
        count = ops.maximum(ops.sum(valid, axis=1, keepdims=True), 1.0)  # (B, 1, 1)
        mean = ops.sum(features * valid, axis=1, keepdims=True) / count
        variance = ops.sum(ops.square(features - mean) * valid, axis=1, keepdims=True) / count
        features = (features - mean) / ops.sqrt(variance + self.epsilon) * valid
        if lengths is not None:
            bad = ops.logical_or(lengths < 0, lengths > samples)  # (B,)
            features = ops.where(ops.expand_dims(bad, (1, 2)), float("nan"), features)
        return ops.cast(features, self.compute_dtype)

    def _mel_power_by_convolution(self, waveform):
        """What `keras.layers.MelSpectrogram` computes (centred STFT with
        reflect padding, periodic Hann window, power, mel matrix), with the
        DFT as a strided convolution whose kernels are the windowed cosines
        and sines. Written here because the converters cannot take the FFT:
        tf2onnx refuses the Real/Imag ops after RFFT and LiteRT has no
        builtin for them, while a convolution and a matmul are everywhere.
        Equal to the FFT path within float32 rounding (tested)."""
        mel = self.mel_spectrogram
        n, length = self.fft_length, self.frame_length
        window = np.zeros(n)
        start = (n - length) // 2
        window[start:start + length] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)
        angles = 2 * np.pi * np.outer(np.arange(n), np.arange(n // 2 + 1)) / n
        kernel = np.concatenate([window[:, None] * np.cos(angles),
                                 -window[:, None] * np.sin(angles)], axis=1)
        kernel = ops.convert_to_tensor(kernel[:, None, :].astype("float32"))  # (N, 1, 2F)
        x = ops.pad(waveform, [[0, 0], [n // 2, n // 2]], mode="reflect")
        spectrum = ops.conv(ops.expand_dims(x, -1), kernel, strides=self.frame_step)  # (B, T, 2F)
        bins = n // 2 + 1
        power = ops.square(spectrum[..., :bins]) + ops.square(spectrum[..., bins:])
        matrix = mel.linear_to_mel_weight_matrix(
            num_mel_bins=mel.num_mel_bins, num_spectrogram_bins=bins,
            sampling_rate=mel.sampling_rate, lower_edge_hertz=mel.min_freq,
            upper_edge_hertz=mel.max_freq)
        return ops.transpose(ops.matmul(power, ops.cast(matrix, "float32")), (0, 2, 1))

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
            }
        )
        return config
