"""The log-mel features of NVIDIA's Parakeet (NeMo's preprocessor, as
transformers' `ParakeetFeatureExtractor` computes it), inside the model."""

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_choice
from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int
from keras_attn._checks import check_rate
from keras_attn.layers.log_mel_features import STFT_MODES
from keras_attn.layers.log_mel_features import WaveformLengths
from keras_attn.layers.log_mel_features import outside_lengths
from keras_attn.layers.log_mel_features import stft_power_by_convolution
from keras_attn.layers.log_mel_features import windowed_dft_kernel

# What NeMo adds to the mel power before the logarithm: far below speech's
# mel power, and the log of silence stays finite (log(2**-24) = -16.6).
LOG_GUARD = 2.0 ** -24


def slaney_mel_filters(num_mel_bins, fft_length, sampling_rate):
    """`(fft_length // 2 + 1, num_mel_bins)` float32: triangular filters
    between 0 Hz and `sampling_rate / 2`, spaced on Slaney's mel scale
    (linear below 1 kHz, logarithmic above) and scaled to the same area
    (Slaney's normalisation: 2 / the filter's width in Hz), as librosa's
    default `filters.mel` and transformers' `mel_filter_bank(norm="slaney",
    mel_scale="slaney")` make them. Keras's `MelSpectrogram` uses the HTK
    scale without normalisation, another matrix."""
    linear_top, linear_step = 1000.0, 200.0 / 3  # Hz; Hz per mel below 1 kHz
    log_step = np.log(6.4) / 27.0  # log-Hz per mel above 1 kHz

    def to_mel(hertz):
        hertz = np.asarray(hertz, "float64")
        logarithmic = linear_top / linear_step + np.log(np.maximum(hertz, linear_top)
                                                        / linear_top) / log_step
        return np.where(hertz < linear_top, hertz / linear_step, logarithmic)

    def to_hertz(mels):
        mels = np.asarray(mels, "float64")
        top = linear_top / linear_step
        return np.where(mels < top, mels * linear_step,
                        linear_top * np.exp(log_step * (np.maximum(mels, top) - top)))

    # num_mel_bins + 2 edges: filter m rises from edge m to m + 1, falls to m + 2.
    edges = to_hertz(np.linspace(to_mel(0.0), to_mel(sampling_rate / 2), num_mel_bins + 2))
    bins = np.linspace(0.0, sampling_rate // 2, fft_length // 2 + 1)  # the FFT bins' Hz
    rising = (bins[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - bins[:, None]) / (edges[2:] - edges[1:-1])
    weights = np.maximum(0.0, np.minimum(rising, falling))  # (F, M)
    return (weights * (2.0 / (edges[2:] - edges[:-2]))).astype("float32")


def symmetric_hann(frame_length, fft_length):
    """`(fft_length,)`: the symmetric Hann window of `frame_length` samples
    (`torch.hann_window(periodic=False)`), zero-padded on both sides to
    `fft_length` as `torch.stft` centres a shorter window."""
    n = np.arange(frame_length)
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / max(frame_length - 1, 1))
    start = (fft_length - frame_length) // 2
    padded = np.zeros(fft_length)
    padded[start:start + frame_length] = window
    return padded.astype("float32")


@keras.saving.register_keras_serializable(package="keras_attn")
class ParakeetLogMelFeatures(WaveformLengths, keras.layers.Layer):
    """Waveform `(B, N)` -> Parakeet's log-mel features `(B, T, num_mel_bins)`.

    The features NVIDIA's Parakeet / FastConformer checkpoints were trained
    on (NeMo's `AudioToMelSpectrogramPreprocessor`; transformers'
    `ParakeetFeatureExtractor` computes the same), so that a model built
    with them takes 16 kHz audio, as `LogMelFeatures` gives the package's
    own Conformer. Per utterance, on its first `waveform_length` samples:

    1. pre-emphasis `y[t] = x[t] - preemphasis * x[t - 1]` (`y[0] = x[0]`);
    2. a centred STFT: `fft_length // 2` zeros on each side (not a
       reflection), frames of `fft_length` every `frame_step` samples, the
       symmetric Hann window of `frame_length` centred in them; the power
       `|X|^2` (by the backend's FFT, or with `stft="convolution"` by a
       strided convolution, which ONNX and LiteRT can hold);
    3. Slaney mel filters (`slaney_mel_filters`), then `log(mel + 2**-24)`;
    4. over the utterance's `(L + 2 * (fft_length // 2) - fft_length) //
       frame_step` valid frames (`L // frame_step` for an even FFT: one
       frame fewer than `LogMelFeatures`' `1 + L // frame_step`), each mel
       bin minus its mean, divided by its standard deviation (unbiased:
       `n - 1`) plus `epsilon`; the frames after them are 0.

    The array holds `1 + N // frame_step` frames, as `ParakeetFeatureExtractor`'s
    `input_features`; `num_frames(waveform_length)` is its `attention_mask`'s
    sum. Samples past `waveform_length` are zeroed first, so an utterance's
    features never depend on the padding or the batch. An utterance of one
    valid frame gets zeros (transformers' divides 0 by 0 there); a
    `waveform_length` outside `[0, N]` gives NaN features.

    The mel matrix, the window and the convolution's DFT kernel are NumPy
    constants made here: not weights (a checkpoint holds none of them, and
    `.keras` files stay as they were), and Keras has no Slaney filter bank
    to build them from.

    Args:
        sampling_rate: audio sampling rate in Hz.
        num_mel_bins: mel bands (Parakeet: 80; some NeMo models 128).
        frame_length: window length in samples (400 = 25 ms at 16 kHz).
        frame_step: hop in samples (160 = 10 ms).
        fft_length: FFT size, at least `frame_length`.
        preemphasis: the pre-emphasis coefficient in [0, 1), or None for
            none (Parakeet's checkpoints: 0.97).
        epsilon: added to each bin's standard deviation.
        stft: `"fft"` (`keras.ops.stft`) or `"convolution"` (the DFT as a
            strided convolution, as `LogMelFeatures(stft=...)`: the same
            numbers within float32 rounding, and a graph ONNX and LiteRT can
            hold; the ONNX / LiteRT speech export switches to it). No
            weights depend on it.
        **kwargs: base layer arguments.

    Call arguments:
        waveform: `(B, N)` float audio in [-1, 1].
        waveform_length: `(B,)` valid samples per utterance (default: all N).

    Returns:
        `(B, 1 + N // frame_step, num_mel_bins)`, float32 arithmetic cast to
        the layer's compute dtype.

    Example:

    >>> import numpy as np
    >>> layer = ParakeetLogMelFeatures(num_mel_bins=80, preemphasis=0.97)
    >>> tuple(layer(np.zeros((2, 16000), "float32")).shape)
    (2, 101, 80)
    >>> int(layer.num_frames(16000))
    100
    """

    def __init__(
        self,
        sampling_rate=16000,
        num_mel_bins=80,
        frame_length=400,
        frame_step=160,
        fft_length=512,
        preemphasis=None,
        epsilon=1e-5,
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
        self.preemphasis = None if preemphasis is None else check_rate("preemphasis", preemphasis)
        self.epsilon = check_positive_float("epsilon", epsilon)
        # Not a weight: ONNX and LiteRT export switch it to "convolution".
        self.stft = check_choice("stft", stft, STFT_MODES)
        self._window = symmetric_hann(self.frame_length, self.fft_length)
        self._mel_matrix = slaney_mel_filters(self.num_mel_bins, self.fft_length,
                                              self.sampling_rate)

    def num_frames(self, waveform_length):
        """Valid frames of an utterance of `waveform_length` samples
        (`ParakeetFeatureExtractor`'s `attention_mask.sum(-1)`)."""
        half = self.fft_length // 2
        return (waveform_length + 2 * half - self.fft_length) // self.frame_step

    def call(self, waveform, waveform_length=None):
        waveform = ops.cast(waveform, "float32")  # (B, N)
        samples = ops.shape(waveform)[1]
        if waveform_length is None:
            lengths = ops.zeros_like(waveform[:, 0], "int32") + samples  # (B,)
            bad = None
        else:
            bad = outside_lengths(waveform_length, samples)  # (B,), in the lengths' dtype
            lengths = ops.cast(waveform_length, "int32")
        inside = ops.less(ops.expand_dims(ops.arange(samples), 0), ops.expand_dims(lengths, 1))
        waveform = ops.where(inside, waveform, 0.0)
        # A valid sample outside [-1, 1] (16-bit PCM given as floats): that
        # row's features become NaN, as in `LogMelFeatures`.
        loud = ops.any(ops.greater(ops.abs(waveform), 1.0), axis=1)  # (B,)
        bad = loud if bad is None else ops.logical_or(bad, loud)
        if self.preemphasis is not None:
            emphasised = waveform[:, 1:] - self.preemphasis * waveform[:, :-1]
            waveform = ops.where(inside, ops.concatenate([waveform[:, :1], emphasised], axis=1),
                                 0.0)
        half = self.fft_length // 2
        padded = ops.pad(waveform, [[0, 0], [half, half]])  # centred, zeros at both ends
        if self.stft == "fft":
            real, imag = ops.stft(padded, sequence_length=self.fft_length,
                                  sequence_stride=self.frame_step, fft_length=self.fft_length,
                                  window=self._window, center=False)  # (B, T, F) each
            power = ops.square(real) + ops.square(imag)
        else:
            power = stft_power_by_convolution(
                padded, ops.convert_to_tensor(self._dft_kernel()), self.frame_step)
        mel = ops.matmul(power, ops.convert_to_tensor(self._mel_matrix))  # (B, T, M)
        features = ops.log(mel + LOG_GUARD)
        steps = ops.shape(features)[1]
        frames = self.num_frames(lengths)  # (B,)
        valid = ops.less(ops.expand_dims(ops.arange(steps), 0), ops.expand_dims(frames, 1))
        valid = ops.expand_dims(ops.cast(valid, "float32"), -1)  # (B, T, 1)
        count = ops.sum(valid, axis=1, keepdims=True)  # (B, 1, 1)
        mean = ops.sum(features * valid, axis=1, keepdims=True) / ops.maximum(count, 1.0)
        squares = ops.sum(ops.square(features - mean) * valid, axis=1, keepdims=True)
        std = ops.sqrt(squares / ops.maximum(count - 1.0, 1.0))  # unbiased, as NeMo
        features = (features - mean) / (std + self.epsilon) * valid
        features = ops.where(ops.expand_dims(bad, (1, 2)), float("nan"), features)
        return ops.cast(features, self.compute_dtype)

    def _dft_kernel(self):
        """`windowed_dft_kernel` of the layer's window, made once (NumPy:
        safe to reuse in any trace)."""
        if getattr(self, "_dft_kernel_cache", None) is None:
            self._dft_kernel_cache = windowed_dft_kernel(self._window)
        return self._dft_kernel_cache

    def compute_output_shape(self, waveform_shape, waveform_length_shape=None):
        samples = waveform_shape[1]
        half = self.fft_length // 2
        frames = (None if samples is None
                  else 1 + (samples + 2 * half - self.fft_length) // self.frame_step)
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
                "preemphasis": self.preemphasis,
                "epsilon": self.epsilon,
                "stft": self.stft,
            }
        )
        return config
