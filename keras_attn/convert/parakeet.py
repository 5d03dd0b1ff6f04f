"""NVIDIA's Parakeet CTC (the FastConformer) from a Hugging Face
`ParakeetForCTC` directory (`config.json` and `model.safetensors`).

The encoder is the package's `ConformerCTC` with `subsampling="fast"`
(`FastConvSubsampling`), `scale_input` (Parakeet's `xscale`), PyTorch's
BatchNorm epsilon (1e-5) and `input_type="features"`: it takes the log-mel
features of transformers' `ParakeetFeatureExtractor` (`input_features`,
and the lengths `attention_mask.sum(-1)`) as `{"features",
"feature_length"}`.

CTC vocabulary: Parakeet's blank is its last index (`pad_token_id =
vocab_size - 1`), keras_attn's is index 0. The loader moves the head's blank
row first, so keras_attn's logits are transformers' with the last column
moved to the front (`np.roll(hf_logits, 1, axis=-1)`), and keras_attn's
label `i` is Parakeet's token `i - 1`.

Every tensor is checked against the shape the config implies before any
weight is assigned, and every tensor is used or refused by name
(`num_batches_tracked`, a counter of BatchNorm, holds no weight).
"""

import os

import numpy as np

from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_entries
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._checkpoint import transposed
from keras_attn.models.conformer import ConformerConfig
from keras_attn.models.conformer import build_conformer

_FILE = "config.json"
_ARCHITECTURES = ("ParakeetForCTC",)

# Encoder options the package's FastConformer computes with one value only.
_FIXED = {
    "hidden_act": "silu",
    "attention_bias": True,
    "convolution_bias": True,
    "subsampling_factor": 8,
    "subsampling_conv_kernel_size": 3,
    "subsampling_conv_stride": 2,
}
# PyTorch's defaults, which Parakeet's LayerNorm and BatchNorm keep.
_TORCH_NORM_EPSILON = 1e-5


def parakeet_config_from_hf(hf_config):
    """A `ConformerConfig` from a Hugging Face `ParakeetForCTC`
    `config.json`: `hf_config` is its dict, or the directory holding it."""
    if isinstance(hf_config, (str, os.PathLike)):
        hf_config = read_config(hf_config)
    encoder = hf_config.get("encoder_config")
    if not isinstance(encoder, dict):
        raise ValueError(
            f"{_FILE}: a ParakeetForCTC config holds its encoder's fields in "
            f"'encoder_config'. Received: encoder_config={encoder!r}")
    for key, value in _FIXED.items():
        if key in encoder and encoder[key] != value:
            raise ValueError(
                f"{_FILE}: keras_attn's FastConformer computes encoder_config.{key}="
                f"{value!r} only. Received: {key}={encoder[key]!r}")
    hidden = config_int(encoder, "hidden_size", _FILE)
    heads = config_int(encoder, "num_attention_heads", _FILE)
    for key in ("num_key_value_heads",):
        if key in encoder and encoder[key] != heads:
            raise ValueError(
                f"{_FILE}: keras_attn's FastConformer has as many key/value heads as "
                f"heads ({heads}). Received: {key}={encoder[key]!r}")
    if "head_dim" in encoder and encoder["head_dim"] not in (None, hidden // heads):
        raise ValueError(
            f"{_FILE}: keras_attn's FastConformer has heads of hidden_size / "
            f"num_attention_heads = {hidden // heads}. Received: "
            f"head_dim={encoder['head_dim']!r}")
    vocab = config_int(hf_config, "vocab_size", _FILE)
    blank = hf_config.get("pad_token_id", vocab - 1)
    if blank != vocab - 1:
        raise ValueError(
            f"{_FILE}: the CTC blank must be Parakeet's last index (vocab_size - 1 = "
            f"{vocab - 1}), which keras_attn moves to its index 0. Received: "
            f"pad_token_id={blank!r}")
    if vocab < 2:
        raise ValueError(f"{_FILE}: 'vocab_size' must count the blank and a token at "
                         f"least. Received: vocab_size={vocab}")
    mels = config_int(encoder, "num_mel_bins", _FILE, 80)
    scale = encoder.get("scale_input", True)
    if not isinstance(scale, bool):
        raise ValueError(f"{_FILE}: 'scale_input' must be true or false. "
                         f"Received: scale_input={scale!r}")
    return ConformerConfig(
        vocabulary_size=vocab - 1,
        num_layers=config_int(encoder, "num_hidden_layers", _FILE),
        hidden_dim=hidden,
        num_heads=heads,
        intermediate_dim=config_int(encoder, "intermediate_size", _FILE),
        kernel_size=config_int(encoder, "conv_kernel_size", _FILE, 9),
        dropout=config_float(encoder, "dropout", _FILE, 0.1),
        attention_dropout=config_float(encoder, "attention_dropout", _FILE, 0.1),
        layer_norm_epsilon=_TORCH_NORM_EPSILON,
        batch_norm_epsilon=_TORCH_NORM_EPSILON,
        num_mel_bins=mels,
        freq_mask_width=min(27, mels),
        input_type="features",
        subsampling="fast",
        subsampling_filters=config_int(encoder, "subsampling_conv_channels", _FILE, 256),
        scale_input=scale,
    )


def _layout(model):
    """The `Entry` of every weight of `model` under transformers' names."""
    config = model.conformer_config
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    H, K, C = D // N, config.kernel_size, config.subsampling_filters
    entries = []

    def dense(layer, name, shape):  # torch Linear (out, in) -> Keras (in, out)
        kernel, bias = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", shape, kernel, transposed))
        entries.append(Entry(name + ".bias", shape[:1], bias))

    def norm(layer, name):
        gamma, beta = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", (D,), gamma))
        entries.append(Entry(name + ".bias", (D,), beta))

    def conv2d(layer, name, shape, axes):
        kernel, bias = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", shape, kernel,
                             lambda a, axes=axes: np.transpose(a, axes)))
        entries.append(Entry(name + ".bias", shape[:1], bias))

    p = "encoder.subsampling."
    subsampling = model.get_layer("subsampling")
    # torch (out, in / groups, kh, kw) -> Keras (kh, kw, in, out); depthwise
    # (C, 1, kh, kw) -> (kh, kw, C, 1).
    conv2d(subsampling.conv_1, p + "layers.0", (C, 1, 3, 3), (2, 3, 1, 0))
    for stage, (depthwise, pointwise) in enumerate(zip(subsampling.depthwise_convs,
                                                       subsampling.pointwise_convs)):
        index = 2 + 3 * stage  # [conv, relu] then [depthwise, pointwise, relu] per stage
        conv2d(depthwise, f"{p}layers.{index}", (C, 1, 3, 3), (2, 3, 0, 1))
        conv2d(pointwise, f"{p}layers.{index + 1}", (C, C, 1, 1), (2, 3, 1, 0))
    flat = subsampling.projection.kernel.shape[0]
    dense(subsampling.projection, p + "linear", (D, flat))

    for i in range(config.num_layers):
        hf = f"encoder.layers.{i}."
        block = model.get_layer(f"conformer_block_{i}")
        for j in (1, 2):
            feed_forward = getattr(block, f"feed_forward_{j}")
            dense(feed_forward.intermediate_dense, f"{hf}feed_forward{j}.linear1", (F, D))
            dense(feed_forward.output_dense, f"{hf}feed_forward{j}.linear2", (D, F))
            norm(getattr(block, f"feed_forward_{j}_layer_norm"), f"{hf}norm_feed_forward{j}")
        norm(block.self_attention_layer_norm, hf + "norm_self_att")
        attention = block.self_attention
        for layer, name in ((attention.query_dense, "q_proj"), (attention.key_dense, "k_proj"),
                            (attention.value_dense, "v_proj")):
            kernel, bias = layer_weights(layer, 2)
            entries.append(Entry(f"{hf}self_attn.{name}.weight", (D, D), kernel,
                                 lambda a: a.T.reshape(D, N, H)))
            entries.append(Entry(f"{hf}self_attn.{name}.bias", (D,), bias,
                                 lambda a: a.reshape(N, H)))
        (position,) = layer_weights(attention.position_dense, 1)
        entries.append(Entry(hf + "self_attn.relative_k_proj.weight", (D, D), position,
                             lambda a: a.T.reshape(D, N, H)))
        kernel, bias = layer_weights(attention.output_dense, 2)
        entries.append(Entry(hf + "self_attn.o_proj.weight", (D, D), kernel,
                             lambda a: a.T.reshape(N, H, D)))
        entries.append(Entry(hf + "self_attn.o_proj.bias", (D,), bias))
        entries.append(Entry(hf + "self_attn.bias_u", (N, H), attention.content_bias))
        entries.append(Entry(hf + "self_attn.bias_v", (N, H), attention.position_bias))
        conv = block.conv_module
        norm(conv.layer_norm, hf + "norm_conv")  # the module's own LayerNorm
        kernel, bias = layer_weights(conv.pointwise_conv_1, 2)
        entries.append(Entry(hf + "conv.pointwise_conv1.weight", (2 * D, D, 1), kernel,
                             lambda a: a[:, :, 0].T))
        entries.append(Entry(hf + "conv.pointwise_conv1.bias", (2 * D,), bias))
        kernel, bias = layer_weights(conv.depthwise_conv, 2)
        entries.append(Entry(hf + "conv.depthwise_conv.weight", (D, 1, K), kernel,
                             lambda a: np.transpose(a, (2, 0, 1))))
        entries.append(Entry(hf + "conv.depthwise_conv.bias", (D,), bias))
        gamma, beta, mean, variance = layer_weights(conv.batch_norm, 4)
        for variable, name in ((gamma, "weight"), (beta, "bias"), (mean, "running_mean"),
                               (variance, "running_var")):
            entries.append(Entry(f"{hf}conv.norm.{name}", (D,), variable))
        kernel, bias = layer_weights(conv.pointwise_conv_2, 2)
        entries.append(Entry(hf + "conv.pointwise_conv2.weight", (D, D, 1), kernel,
                             lambda a: a[:, :, 0].T))
        entries.append(Entry(hf + "conv.pointwise_conv2.bias", (D,), bias))
        norm(block.output_layer_norm, hf + "norm_out")

    # The CTC head, a kernel-1 Conv1d (V + 1, D, 1); Parakeet's blank (its
    # last row) becomes keras_attn's index 0.
    V = config.vocabulary_size + 1
    kernel, bias = layer_weights(model.get_layer("ctc_logits"), 2)
    entries.append(Entry("ctc_head.weight", (V, D, 1), kernel,
                         lambda a: np.roll(a[:, :, 0].T, 1, axis=1)))
    entries.append(Entry("ctc_head.bias", (V,), bias, lambda a: np.roll(a, 1)))
    return entries


def load_hf_parakeet(path):
    """A keras_attn `ConformerCTC` (the FastConformer) with the weights of a
    Hugging Face `ParakeetForCTC` directory.

    Args:
        path: directory with `config.json` and `model.safetensors`.

    Returns:
        A `ConformerCTC` built with `input_type="features"`: given
        `{"features": input_features, "feature_length":
        attention_mask.sum(-1)}`, its logits over each utterance's
        `logit_lengths` frames equal transformers' with the blank moved from
        the last index to index 0 (`np.roll(hf_logits, 1, axis=-1)`).

    Raises:
        ValueError: a malformed file, a config option the model does not
            compute, a tensor missing or of another shape than `config.json`
            implies, or a tensor the model has no place for (each named;
            nothing is assigned then).
    """
    path = os.fspath(path)
    hf_config = read_config(path)
    names = hf_config.get("architectures") or []
    if names and not any(name in _ARCHITECTURES for name in names):
        raise ValueError(
            f"{os.path.join(path, _FILE)} names architectures {names}; this loader "
            f"reads {list(_ARCHITECTURES)}. Received: architectures={names!r}")
    config = parakeet_config_from_hf(hf_config)
    ckpt = Tensors(read_safetensors(path), path)
    model = build_conformer(config)
    plan = read_entries(_layout(model), ckpt, model)  # raises before anything is assigned
    # BatchNorm's step counter is no weight; the sinusoids are recomputed.
    ckpt.check_all_used(ignored=tuple(
        f"encoder.layers.{i}.conv.norm.num_batches_tracked" for i in range(config.num_layers)))
    for variable, array in plan:
        variable.assign(array.astype(variable.dtype))
    return model


__all__ = ["load_hf_parakeet", "parakeet_config_from_hf"]
