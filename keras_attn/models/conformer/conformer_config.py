"""Conformer hyper-parameters and presets."""

import dataclasses
import functools

from keras_attn.models._config import ModelConfig
from keras_attn.models._config import check_heads_divide
from keras_attn.models._config import field
from keras_attn.models._config import flag
from keras_attn.models._config import one_of
from keras_attn.models._config import optional_positive_int
from keras_attn.models._config import positive_float
from keras_attn.models._config import positive_int
from keras_attn.models._config import rate
from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config


INPUT_TYPES = ("waveform", "features")
# The layers' choices (ConformerConvModule's NORMS, LogMelFeatures'
# NORMALIZATIONS), stated here too so a config imports no Keras.
CONV_NORMS = ("batch_norm", "layer_norm")
FEATURE_NORMALIZATIONS = ("utterance", "none")
# "conv": ConvSubsampling, the paper's 4x; "fast": FastConvSubsampling, the
# FastConformer's 8x depthwise-separable stages (NVIDIA's Parakeet).
SUBSAMPLINGS = ("conv", "fast")
# "log_mel": LogMelFeatures, the package's own (Keras's MelSpectrogram in
# decibels); "parakeet": ParakeetLogMelFeatures, the features NVIDIA's
# Parakeet checkpoints were trained on (transformers' ParakeetFeatureExtractor).
FRONT_ENDS = ("log_mel", "parakeet")
# The fields `ConformerCTC.with_vocabulary` (a trained encoder under a new
# CTC head) may set anew: none holds a weight or changes what one computes at
# inference. The regularisation a fine-tuning chooses, rematerialisation, and
# whether the model takes waveforms or the same front end's features.
FINE_TUNING_FIELDS = ("dropout", "attention_dropout", "freq_mask_count", "freq_mask_width",
                      "time_mask_count", "time_mask_ratio", "remat", "input_type")
# Dynamic chunk training (WeNet U2, Zhang et al. 2020, section 2.3): in
# training, a batch attends to the whole utterance with probability 1/2, else
# in chunks of a size drawn uniformly in 1..DYNAMIC_CHUNK_MAX encoder frames.
DYNAMIC_CHUNK_MAX = 25


def check_vocabulary_size(name, value, allow_none=True):
    """Labels 1..V: a positive integer; None in a config that has no
    vocabulary yet (a preset), never in a model."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`{name}` must be a positive integer (labels 1..V, 0 is "
            f"the CTC blank). Received: {name}={value!r}"
        )


def _non_negative(name, value, allow_none=False):
    if value is None and allow_none:
        return
    _count(name, value)


def _optional_rate(name, value):
    if value is not None:
        rate(name, value)


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"`{name}` must be a non-negative integer. Received: {name}={value!r}"
        )


@dataclasses.dataclass(frozen=True)
class ConformerConfig(ModelConfig):
    """Conformer hyper-parameters; the fields are the arguments of
    `ConformerCTC` / `build_conformer`, checked when a config is made.

    The front end turns 16 kHz audio into 80 log-mel bins with 25 ms windows
    (400 samples) every 10 ms (160 samples), as in the paper's section 3.1.

    Attributes:
        vocabulary_size: the labels 1..V (0 is the CTC blank). No default:
            it is the task's, so every build names it (a config without it,
            such as a preset, is valid; the model refuses it).
        num_layers: Conformer blocks.
        hidden_dim: model width (the paper's encoder dim).
        num_heads: attention heads per block.
        intermediate_dim: feed-forward hidden width; None for 4 x hidden_dim.
        kernel_size: depthwise convolution kernel of the convolution module.
        dropout: rate on every module's output and after the subsampling.
        attention_dropout: rate on the attention probabilities.
        layer_norm_epsilon: LayerNorm epsilon.
        sampling_rate: waveform samples per second.
        num_mel_bins: log-mel features per frame.
        frame_length: samples per analysis window (25 ms at 16 kHz).
        frame_step: samples between windows (10 ms at 16 kHz).
        fft_length: FFT size of the spectrogram.
        freq_mask_count: SpecAugment frequency masks per utterance (training).
        freq_mask_width: widest frequency mask in bins.
        time_mask_count: SpecAugment time masks per utterance (training).
        time_mask_ratio: widest time mask as a share of the utterance.
        input_type: `"waveform"`: inputs `{"waveform" (B, N),
            "waveform_length" (B,)}` and the log-mel front end inside the
            model; `"features"`: inputs `{"features" (B, T, num_mel_bins),
            "feature_length" (B,)}` already computed.
        remat: rematerialise each Conformer block in training (gradient
            checkpointing): activations are recomputed in the backward pass
            instead of stored; less memory for about one more forward pass per
            step, the same outputs and gradients.
        chunk_size: encoder frames (40 ms each, 80 ms with
            `subsampling="fast"`) per attention chunk: frame
            `t` attends to its chunk `t // chunk_size` and the `left_context`
            frames before it (`chunk_attention_mask`), in training and at
            inference, so the model streams (`ConformerCTC.stream_step`)
            with the logits of its offline call. None: whole-utterance
            attention (offline). Needs `causal_conv=True` and, for waveform
            input, `feature_normalization="none"`.
        left_context: encoder frames before a chunk that it attends to (the
            keys and values each block caches while streaming); set with
            `chunk_size`, None without.
        dynamic_chunk_training: in training, each batch attends to the whole
            utterance with probability 1/2, else in chunks of a size drawn
            uniformly in 1..25 frames (WeNet's dynamic chunk training), so
            one model serves several chunk sizes; the configured
            `chunk_size` at inference. Needs `chunk_size`.
        causal_conv: the convolution modules' depthwise convolution sees
            past frames only (left padding), as streaming needs.
        conv_norm: `"batch_norm"` (the paper's) or `"layer_norm"` in the
            convolution module.
        feature_normalization: `"utterance"`: log-mel features normalised
            by each utterance's mean and variance (it reads the whole
            utterance); `"none"`: decibels as they are (streamable).
        subsampling: `"conv"` (`ConvSubsampling`, 4x, the paper's) or
            `"fast"` (`FastConvSubsampling`, 8x, depthwise-separable: the
            FastConformer of NVIDIA's Parakeet; it streams with `chunk_size`
            as the Conformer does, 80 ms encoder frames; no packed rows yet).
        subsampling_filters: channels of the subsampling's convolutions;
            None for `hidden_dim`.
        scale_input: multiply the subsampling's output by
            `sqrt(hidden_dim)` before the blocks (Parakeet's `scale_input`).
        batch_norm_epsilon: the convolution modules' BatchNorm epsilon
            (Keras's 1e-3; PyTorch checkpoints use 1e-5).
        front_end: the log-mel features: `"log_mel"` (`LogMelFeatures`,
            decibels) or `"parakeet"` (`ParakeetLogMelFeatures`: NVIDIA
            Parakeet's pre-emphasis, Slaney mel filters, natural log and
            per-utterance normalisation, always on). A waveform model
            computes them; a features model takes them (what `save_hf`
            writes as the checkpoint's feature extractor).
        preemphasis: the `"parakeet"` front end's pre-emphasis coefficient
            in [0, 1) (the checkpoints': 0.97), or None for none; the
            `"log_mel"` front end has none (None).
    """

    vocabulary_size: int = field(None, check_vocabulary_size)
    num_layers: int = field(16, positive_int)
    hidden_dim: int = field(144, positive_int)
    num_heads: int = field(4, positive_int)
    intermediate_dim: int = field(None, optional_positive_int)
    kernel_size: int = field(32, positive_int)
    dropout: float = field(0.1, rate)
    attention_dropout: float = field(0.0, rate)
    layer_norm_epsilon: float = field(1e-5, positive_float)
    sampling_rate: int = field(16000, positive_int)
    num_mel_bins: int = field(80, positive_int)
    frame_length: int = field(400, positive_int)
    frame_step: int = field(160, positive_int)
    fft_length: int = field(512, positive_int)
    freq_mask_count: int = field(2, _count)
    freq_mask_width: int = field(27, _count)
    time_mask_count: int = field(10, _count)
    time_mask_ratio: float = field(0.05, rate)
    input_type: str = field("waveform", one_of(INPUT_TYPES))
    remat: bool = field(False, flag)
    chunk_size: int = field(None, optional_positive_int)
    left_context: int = field(None, functools.partial(_non_negative, allow_none=True))
    dynamic_chunk_training: bool = field(False, flag)
    causal_conv: bool = field(False, flag)
    conv_norm: str = field("batch_norm", one_of(CONV_NORMS))
    feature_normalization: str = field("utterance", one_of(FEATURE_NORMALIZATIONS))
    subsampling: str = field("conv", one_of(SUBSAMPLINGS))
    subsampling_filters: int = field(None, optional_positive_int)
    scale_input: bool = field(False, flag)
    batch_norm_epsilon: float = field(1e-3, positive_float)
    front_end: str = field("log_mel", one_of(FRONT_ENDS))
    preemphasis: float = field(None, _optional_rate)

    def check_relations(self):
        if self.freq_mask_count and self.freq_mask_width > self.num_mel_bins:
            raise ValueError(
                "A frequency mask cannot be wider than the features: "
                f"`freq_mask_width` must be at most num_mel_bins={self.num_mel_bins}. "
                f"Received: freq_mask_width={self.freq_mask_width}"
            )
        check_heads_divide(self)
        self._check_front_end()
        self._check_streaming()

    def _check_front_end(self):
        if self.front_end == "log_mel" and self.preemphasis is not None:
            raise ValueError(
                "`preemphasis` is an option of the \"parakeet\" front end; "
                "front_end=\"log_mel\" has none (None). Received: "
                f"preemphasis={self.preemphasis}, front_end='log_mel'"
            )
        if self.front_end == "parakeet" and self.feature_normalization != "utterance":
            raise ValueError(
                "The \"parakeet\" front end always normalises each utterance (its "
                "checkpoints were trained so): `feature_normalization` must be "
                "\"utterance\". Received: "
                f"feature_normalization={self.feature_normalization!r}, front_end='parakeet'"
            )

    def _check_streaming(self):
        chunked = self.chunk_size is not None
        if chunked and self.input_type == "waveform" and self.front_end == "parakeet":
            raise ValueError(
                "Chunked attention (`chunk_size`) on waveform input needs the package's "
                "front end, front_end=\"log_mel\" with feature_normalization=\"none\": "
                "the \"parakeet\" front end normalises each feature over the whole "
                "utterance, which a stream cannot know. Received: "
                f"chunk_size={self.chunk_size}, front_end='parakeet'"
            )
        if chunked != (self.left_context is not None):
            raise ValueError(
                "`chunk_size` and `left_context` go together: both set (chunked "
                "attention) or both None (offline). Received: "
                f"chunk_size={self.chunk_size}, left_context={self.left_context}"
            )
        if self.dynamic_chunk_training and not chunked:
            raise ValueError(
                "`dynamic_chunk_training` draws chunk sizes around a configured "
                "one: it needs `chunk_size`. Received: dynamic_chunk_training=True, "
                "chunk_size=None"
            )
        if chunked and not self.causal_conv:
            raise ValueError(
                "Chunked attention (`chunk_size`) needs `causal_conv=True`: a "
                "centred convolution kernel reads the next chunk's frames. "
                f"Received: chunk_size={self.chunk_size}, causal_conv=False"
            )
        if chunked and self.input_type == "waveform" and self.feature_normalization != "none":
            raise ValueError(
                "Chunked attention (`chunk_size`) on waveform input needs "
                "`feature_normalization=\"none\"`: per-utterance normalisation "
                f"reads the whole utterance. Received: chunk_size={self.chunk_size}, "
                f"feature_normalization={self.feature_normalization!r}"
            )


CONFORMER_PRESETS = {
    # Gulati et al. (2020) Table 1: encoder dim 144, 16 layers, 4 heads,
    # conv kernel 32 ("Conformer (S)", 10.3M with its LSTM decoder).
    "conformer_small": ConformerConfig(num_layers=16, hidden_dim=144, num_heads=4),
    # Table 1, "Conformer (M)": dim 256, 16 layers, 4 heads (30.7M).
    "conformer_medium": ConformerConfig(num_layers=16, hidden_dim=256, num_heads=4),
    # Table 1, "Conformer (L)": dim 512, 17 layers, 8 heads (118.8M).
    "conformer_large": ConformerConfig(num_layers=17, hidden_dim=512, num_heads=8),
    # Not in the paper: a CPU-sized encoder for the embedded speech task.
    "conformer_tiny": ConformerConfig(
        num_layers=2, hidden_dim=64, num_heads=2, kernel_size=15,
        num_mel_bins=40, freq_mask_width=8,
    ),
}

# NVIDIA's Parakeet CTC (the FastConformer, Rekesh et al. 2023): 8x
# depthwise-separable subsampling with 256 channels, x sqrt(D) input scaling,
# kernel 9, PyTorch's norm epsilons, the checkpoints' features (80 mels,
# pre-emphasis 0.97). Trainable parameters with their 1,024 SentencePiece
# tokens and the blank (vocabulary_size=1024), equal to transformers'
# ParakeetForCTC of the same config (tests/models/test_fast_conformer.py);
# `count_params()` adds the BatchNorm moving statistics (2 x 1024 a layer).
_PARAKEET = dict(
    subsampling="fast", subsampling_filters=256, scale_input=True, kernel_size=9,
    dropout=0.1, attention_dropout=0.1, layer_norm_epsilon=1e-5, batch_norm_epsilon=1e-5,
    num_mel_bins=80, front_end="parakeet", preemphasis=0.97,
)
CONFORMER_PRESETS.update({
    # nvidia/parakeet-ctc-0.6b (FastConformer XL): 24 layers, dim 1024, 8
    # heads, feed-forward 4096; 608,799,745 parameters.
    "parakeet_ctc_0_6b": ConformerConfig(num_layers=24, hidden_dim=1024, num_heads=8,
                                         **_PARAKEET),
    # nvidia/parakeet-ctc-1.1b (FastConformer XXL): 42 layers, otherwise as
    # the 0.6b; 1,062,540,289 parameters.
    "parakeet_ctc_1_1b": ConformerConfig(num_layers=42, hidden_dim=1024, num_heads=8,
                                         **_PARAKEET),
    # Not published: the same design at a CPU size (tests, small tasks).
    "parakeet_ctc_tiny": ConformerConfig(num_layers=2, hidden_dim=64, num_heads=2,
                                         **dict(_PARAKEET, subsampling_filters=64)),
})


DEFAULT_PRESET = "conformer_small"


def feature_frames(config, samples):
    """Feature frames of `samples` audio samples (an int or a NumPy array)
    through the front end of `config`: `LogMelFeatures`' `1 + samples //
    frame_step`, or `ParakeetLogMelFeatures`' `(samples + 2 * (fft_length
    // 2) - fft_length) // frame_step` (one fewer for an even FFT)."""
    if config.front_end == "parakeet":
        half = config.fft_length // 2
        return (samples + 2 * half - config.fft_length) // config.frame_step
    return 1 + samples // config.frame_step


def encoder_length(config, length):
    """Encoder (logit) frames from `length` feature frames, through the
    subsampling of `config` (`subsampled_length` or, for
    `subsampling="fast"`, `fast_subsampled_length`): an int, a NumPy array
    or a tensor."""
    from keras_attn.layers.conv_subsampling import subsampled_length
    from keras_attn.layers.fast_conv_subsampling import fast_subsampled_length

    if config.subsampling == "fast":
        return fast_subsampled_length(length)
    return subsampled_length(length)


def get_conformer_config(config=DEFAULT_PRESET, **overrides):
    """A `ConformerConfig` from a config, a preset name or a dict of fields,
    with `overrides` (fields) applied; an unknown name or field is a
    `ValueError`."""
    return resolve_config(config, ConformerConfig, CONFORMER_PRESETS, "Conformer",
                          **overrides)


def replace_conformer_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "Conformer", **overrides)
