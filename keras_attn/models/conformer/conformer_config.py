"""Conformer hyper-parameters and presets."""

import dataclasses

from keras_attn.models._config import replace_fields
from keras_attn.models._config import resolve_config


INPUT_TYPES = ("waveform", "features")


@dataclasses.dataclass(frozen=True)
class ConformerConfig:
    """Conformer hyper-parameters; the fields are the arguments of
    `ConformerCTC` / `build_conformer`.

    The front end turns 16 kHz audio into 80 log-mel bins with 25 ms windows
    (400 samples) every 10 ms (160 samples), as in the paper's section 3.1.

    Attributes:
        vocabulary_size: the labels 1..V (0 is the CTC blank). No default:
            it is the task's, so every build names it.
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
    """

    vocabulary_size: int = None
    num_layers: int = 16
    hidden_dim: int = 144
    num_heads: int = 4
    intermediate_dim: int = None
    kernel_size: int = 32
    dropout: float = 0.1
    attention_dropout: float = 0.0
    layer_norm_epsilon: float = 1e-5
    sampling_rate: int = 16000
    num_mel_bins: int = 80
    frame_length: int = 400
    frame_step: int = 160
    fft_length: int = 512
    freq_mask_count: int = 2
    freq_mask_width: int = 27
    time_mask_count: int = 10
    time_mask_ratio: float = 0.05
    input_type: str = "waveform"
    remat: bool = False


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


DEFAULT_PRESET = "conformer_small"


def get_conformer_config(config=DEFAULT_PRESET, **overrides):
    """A `ConformerConfig` from a config, a preset name or a dict of fields,
    with `overrides` (fields) applied; an unknown name or field is a
    `ValueError`."""
    return resolve_config(config, ConformerConfig, CONFORMER_PRESETS, "Conformer",
                          **overrides)


def replace_conformer_config(config, **overrides):
    """`dataclasses.replace` that names an unknown field in its error."""
    return replace_fields(config, "Conformer", **overrides)
