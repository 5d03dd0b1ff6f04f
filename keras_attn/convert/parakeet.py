"""NVIDIA's Parakeet CTC (the FastConformer) from a Hugging Face
`ParakeetForCTC` directory (`config.json` and `model.safetensors`).

The encoder is the package's `ConformerCTC` with `subsampling="fast"`
(`FastConvSubsampling`), `scale_input` (Parakeet's `xscale`), PyTorch's
BatchNorm epsilon (1e-5) and `front_end="parakeet"`. From a directory with
the feature extractor's `preprocessor_config.json` it takes 16 kHz audio
(`{"waveform", "waveform_length"}`; `ParakeetLogMelFeatures` computes what
`ParakeetFeatureExtractor` does); with `input_type="features"` (the default
without that file) the extractor's log-mel features (`input_features`, and
the lengths `attention_mask.sum(-1)`) as `{"features", "feature_length"}`.
`save_hf_parakeet` writes such a model back (config.json, model.safetensors,
preprocessor_config.json).

The transducers, `ParakeetForRNNT` and `ParakeetForTDT`, load into a
`ConformerTransducer` over the same encoder: `encoder_projector`, the
prediction network (`decoder.*`: embedding, torch's LSTM, whose two biases
are summed into Keras's one, projection) and the joint (`joint.head`, the
TDT's duration logits after the vocabulary's). Their ids move as the CTC
head's: the blank (`blank_token_id`, the last id) is keras_attn's 0, token
`i` its label `i + 1`. `save_hf_parakeet` writes them back the same way
(with a generation_config.json whose decoder start is the blank and, for
TDT, the duration logits' ids suppressed).

CTC vocabulary: Parakeet's blank is its last index (`pad_token_id =
vocab_size - 1`), keras_attn's is index 0. The loader moves the head's blank
row first, so keras_attn's logits are transformers' with the last column
moved to the front (`np.roll(hf_logits, 1, axis=-1)`), and keras_attn's
label `i` is Parakeet's token `i - 1`.

Every tensor is checked against the shape the config implies before any
weight is assigned, and every tensor is used or refused by name
(`num_batches_tracked`, a counter of BatchNorm, holds no weight).
"""

import dataclasses
import os

import numpy as np

from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import json_text
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import check_sizes
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._checkpoint import transposed
from keras_attn.convert._registry import Converter
from keras_attn.convert._registry import entry_helpers
from keras_attn.convert._registry import load_weights
from keras_attn.convert._registry import register
from keras_attn.convert._registry import write_weights
from keras_attn.models.conformer import ConformerCTC
from keras_attn.models.conformer import ConformerConfig
from keras_attn.models.conformer import ConformerTransducer
from keras_attn.models.conformer import build_conformer

_FILE = "config.json"
_PREPROCESSOR = "preprocessor_config.json"
_ARCHITECTURES = ("ParakeetForCTC",)
# The transducers, read into a ConformerTransducer (not written back yet).
_TRANSDUCERS = {"ParakeetForRNNT": "parakeet_rnnt", "ParakeetForTDT": "parakeet_tdt"}
# The joint activations transformers' ACT2FN and Keras compute alike.
_JOINT_ACTIVATIONS = ("relu", "tanh", "sigmoid", "silu")
_INPUT_TYPES = (None, "waveform", "features")
# ParakeetFeatureExtractor's defaults (transformers 5.x), for a directory
# without preprocessor_config.json: what a features model records as the
# features it takes. preprocessor key -> (ConformerConfig field, default).
_FEATURE_FIELDS = {
    "sampling_rate": ("sampling_rate", 16000),
    "win_length": ("frame_length", 400),
    "hop_length": ("frame_step", 160),
    "n_fft": ("fft_length", 512),
}
_PREEMPHASIS = 0.97

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


def _front_end_fields(preprocessor, mels):
    """ConformerConfig fields of the front end from the dict of
    preprocessor_config.json (None: ParakeetFeatureExtractor's defaults)."""
    if preprocessor is None:
        fields = {field: default for field, default in _FEATURE_FIELDS.values()}
        return dict(fields, front_end="parakeet", preemphasis=_PREEMPHASIS)
    kind = preprocessor.get("feature_extractor_type", "ParakeetFeatureExtractor")
    if kind != "ParakeetFeatureExtractor":
        raise ValueError(
            f"{_PREPROCESSOR}: keras_attn computes ParakeetFeatureExtractor's features "
            f"only. Received: feature_extractor_type={kind!r}")
    for key, value in (("padding_value", 0.0), ("padding_side", "right")):
        if key in preprocessor and preprocessor[key] != value:
            raise ValueError(
                f"{_PREPROCESSOR}: keras_attn's front end pads each utterance with "
                f"{key}={value!r}. Received: {key}={preprocessor[key]!r}")
    size = config_int(preprocessor, "feature_size", _PREPROCESSOR, mels)
    if size != mels:
        raise ValueError(
            f"{_PREPROCESSOR}: the features must have the encoder's num_mel_bins={mels} "
            f"bins. Received: feature_size={size}")
    fields = {field: config_int(preprocessor, key, _PREPROCESSOR, default)
              for key, (field, default) in _FEATURE_FIELDS.items()}
    preemphasis = preprocessor.get("preemphasis", _PREEMPHASIS)
    if preemphasis is not None:
        preemphasis = config_float(preprocessor, "preemphasis", _PREPROCESSOR)
    return dict(fields, front_end="parakeet", preemphasis=preemphasis)


def parakeet_config_from_hf(hf_config, preprocessor=None, input_type="features"):
    """A `ConformerConfig` from a Hugging Face `ParakeetForCTC`
    `config.json`: `hf_config` is its dict, or the directory holding it
    (then its `preprocessor_config.json` too, when there is one);
    `preprocessor` the dict of `preprocessor_config.json` (the front end's
    sampling rate, window, hop, FFT and pre-emphasis; None:
    `ParakeetFeatureExtractor`'s defaults); `input_type` the config's."""
    if isinstance(hf_config, (str, os.PathLike)):
        directory = os.fspath(hf_config)
        hf_config = read_config(directory)
        if preprocessor is None and os.path.exists(os.path.join(directory, _PREPROCESSOR)):
            preprocessor = read_config(directory, _PREPROCESSOR)
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
    # The CTC blank is pad_token_id; a transducer's is blank_token_id (its
    # pad_token_id pads label arrays only).
    key = "blank_token_id" if _transducer_kind(hf_config) else "pad_token_id"
    blank = hf_config.get(key, vocab - 1)
    if blank != vocab - 1:
        raise ValueError(
            f"{_FILE}: the blank must be Parakeet's last index (vocab_size - 1 = "
            f"{vocab - 1}), which keras_attn moves to its index 0. Received: "
            f"{key}={blank!r}")
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
        input_type=input_type,
        subsampling="fast",
        subsampling_filters=config_int(encoder, "subsampling_conv_channels", _FILE, 256),
        scale_input=scale,
        **_front_end_fields(preprocessor, mels),
    )


def _layout(model):
    """The `Entry` of every weight of `model` under transformers' names."""
    config = model.conformer_config
    # intermediate_dim None: the Conformer's default width, 4 x hidden_dim.
    D, N = config.hidden_dim, config.num_heads
    F = config.intermediate_dim or 4 * D
    H, K, C = D // N, config.kernel_size, config.subsampling_filters
    entries = []
    dense, norm, heads_in, heads_out = entry_helpers(entries, D, N)

    def conv2d(layer, name, shape, axes):
        kernel, bias = layer_weights(layer, 2)
        entries.append(Entry(name + ".weight", shape, kernel,
                             lambda a, axes=axes: np.transpose(a, axes),
                             lambda a, axes=axes: np.transpose(a, np.argsort(axes))))
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
    dense(subsampling.projection, p + "linear", D, flat)

    for i in range(config.num_layers):
        hf = f"encoder.layers.{i}."
        block = model.get_layer(f"conformer_block_{i}")
        for j in (1, 2):
            feed_forward = getattr(block, f"feed_forward_{j}")
            dense(feed_forward.intermediate_dense, f"{hf}feed_forward{j}.linear1", F, D)
            dense(feed_forward.output_dense, f"{hf}feed_forward{j}.linear2", D, F)
            norm(getattr(block, f"feed_forward_{j}_layer_norm"), f"{hf}norm_feed_forward{j}")
        norm(block.self_attention_layer_norm, hf + "norm_self_att")
        attention = block.self_attention
        for layer, name in ((attention.query_dense, "q_proj"), (attention.key_dense, "k_proj"),
                            (attention.value_dense, "v_proj")):
            heads_in(layer, f"{hf}self_attn.{name}")
        heads_in(attention.position_dense, hf + "self_attn.relative_k_proj", bias=False)
        heads_out(attention.output_dense, hf + "self_attn.o_proj")
        entries.append(Entry(hf + "self_attn.bias_u", (N, H), attention.content_bias))
        entries.append(Entry(hf + "self_attn.bias_v", (N, H), attention.position_bias))
        conv = block.conv_module
        norm(conv.layer_norm, hf + "norm_conv")  # the module's own LayerNorm
        kernel, bias = layer_weights(conv.pointwise_conv_1, 2)
        entries.append(Entry(hf + "conv.pointwise_conv1.weight", (2 * D, D, 1), kernel,
                             lambda a: a[:, :, 0].T, lambda a: a.T[:, :, None]))
        entries.append(Entry(hf + "conv.pointwise_conv1.bias", (2 * D,), bias))
        kernel, bias = layer_weights(conv.depthwise_conv, 2)
        entries.append(Entry(hf + "conv.depthwise_conv.weight", (D, 1, K), kernel,
                             lambda a: np.transpose(a, (2, 0, 1)),
                             lambda a: np.transpose(a, (1, 2, 0))))
        entries.append(Entry(hf + "conv.depthwise_conv.bias", (D,), bias))
        gamma, beta, mean, variance = layer_weights(conv.batch_norm, 4)
        for variable, name in ((gamma, "weight"), (beta, "bias"), (mean, "running_mean"),
                               (variance, "running_var")):
            entries.append(Entry(f"{hf}conv.norm.{name}", (D,), variable))
        kernel, bias = layer_weights(conv.pointwise_conv_2, 2)
        entries.append(Entry(hf + "conv.pointwise_conv2.weight", (D, D, 1), kernel,
                             lambda a: a[:, :, 0].T, lambda a: a.T[:, :, None]))
        entries.append(Entry(hf + "conv.pointwise_conv2.bias", (D,), bias))
        norm(block.output_layer_norm, hf + "norm_out")

    if isinstance(model, ConformerTransducer):
        _transducer_entries(model, entries, dense)
        return entries
    # The CTC head, a kernel-1 Conv1d (V + 1, D, 1); Parakeet's blank (its
    # last row) becomes keras_attn's index 0.
    V = config.vocabulary_size + 1
    kernel, bias = layer_weights(model.get_layer("ctc_logits"), 2)
    entries.append(Entry("ctc_head.weight", (V, D, 1), kernel,
                         lambda a: np.roll(a[:, :, 0].T, 1, axis=1),
                         lambda a: np.roll(a, -1, axis=1).T[:, :, None]))
    entries.append(Entry("ctc_head.bias", (V,), bias, lambda a: np.roll(a, 1),
                         lambda a: np.roll(a, -1)))
    return entries


def _transducer_kind(hf_config):
    """"parakeet_rnnt" / "parakeet_tdt" for a transducer's config.json
    (by `architectures`, else `model_type`), None for CTC."""
    names = hf_config.get("architectures") or []
    for name in names:
        if name in _TRANSDUCERS:
            return _TRANSDUCERS[name]
    if not names and hf_config.get("model_type") in _TRANSDUCERS.values():
        return hf_config["model_type"]
    return None


def _transducer_arguments(hf_config):
    """`ConformerTransducer`'s own arguments from a `ParakeetForRNNT` /
    `ParakeetForTDT` config.json."""
    activation = hf_config.get("hidden_act", "relu")
    if activation not in _JOINT_ACTIVATIONS:
        raise ValueError(
            f"{_FILE}: keras_attn's joint computes hidden_act in {list(_JOINT_ACTIVATIONS)}. "
            f"Received: hidden_act={activation!r}")
    durations = None
    if _transducer_kind(hf_config) == "parakeet_tdt":
        durations = hf_config.get("durations", [0, 1, 2, 3, 4])
        if not isinstance(durations, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in durations):
            raise ValueError(f"{_FILE}: 'durations' must be a list of ints. "
                             f"Received: durations={durations!r}")
    return dict(
        predictor_dim=config_int(hf_config, "decoder_hidden_size", _FILE, 640),
        predictor_layers=config_int(hf_config, "num_decoder_layers", _FILE, 2),
        durations=durations, joint_activation=activation,
        max_symbols_per_step=config_int(hf_config, "max_symbols_per_step", _FILE, 10))


def _roll_rows(a, shift):
    """Parakeet's blank (its last row) to keras_attn's row 0 (shift 1) and back (-1)."""
    return np.roll(a, shift, axis=0)


def _transducer_entries(model, entries, dense):
    """A transducer's weights past the encoder: the encoder's projection, the
    prediction network (embedding, LSTM layers, projection) and the joint.
    Rows of ids move as the CTC head's: Parakeet's blank, its last id, is
    keras_attn's 0. torch's LSTM holds two biases that only ever add: the
    loader sums them into Keras's one (`_sum_lstm_biases`)."""
    config = model.conformer_config
    D, P, V = config.hidden_dim, model.predictor_dim, config.vocabulary_size + 1
    dense(model.get_layer("encoder_projector"), "encoder_projector", P, D)
    predictor = model.predictor
    entries.append(Entry("decoder.embedding.weight", (V, P), predictor.embedding.embeddings,
                         lambda a: _roll_rows(a, 1), lambda a: _roll_rows(a, -1)))
    for i, lstm in enumerate(predictor.lstm_layers):
        cell = lstm.cell
        name = f"decoder.lstm.{{}}_l{i}"
        entries.append(Entry(name.format("weight_ih"), (4 * P, P), cell.kernel,
                             transposed, transposed))
        entries.append(Entry(name.format("weight_hh"), (4 * P, P), cell.recurrent_kernel,
                             transposed, transposed))
        entries.append(Entry(name.format("bias_ih"), (4 * P,), cell.bias))
    dense(predictor.projection, "decoder.decoder_projector", P, P)
    O = model.joint.outputs
    kernel, bias = layer_weights(model.joint.head, 2)

    def ids_first(a):  # (O, ...) with the blank row moved to 0, durations kept
        return np.concatenate([_roll_rows(a[:V], 1), a[V:]], axis=0)

    def ids_back(a):
        return np.concatenate([_roll_rows(a[:V], -1), a[V:]], axis=0)

    entries.append(Entry("joint.head.weight", (O, P), kernel, lambda a: ids_first(a).T,
                         lambda a: ids_back(a.T)))
    entries.append(Entry("joint.head.bias", (O,), bias, ids_first, ids_back))


def _sum_lstm_biases(ckpt, layers, width):
    """torch's `bias_ih + bias_hh` of each LSTM layer, put in `bias_ih`'s
    place (both read with their shapes checked and finite)."""
    for i in range(layers):
        ih, hh = f"decoder.lstm.bias_ih_l{i}", f"decoder.lstm.bias_hh_l{i}"
        summed = ckpt.get(ih, (4 * width,)) + ckpt.get(hh, (4 * width,))
        ckpt.tensors[ih] = summed


def load_hf_parakeet(path, input_type=None):
    """A keras_attn `ConformerCTC` (the FastConformer) with the weights of a
    Hugging Face `ParakeetForCTC` directory.

    Args:
        path: directory with `config.json` and `model.safetensors` (or its
            shards: `read_safetensors`), and
            optionally the feature extractor's `preprocessor_config.json`.
        input_type: `"waveform"`: the model takes 16 kHz audio
            (`{"waveform", "waveform_length"}`) and computes the features
            of `preprocessor_config.json` itself (`front_end="parakeet"`);
            `"features"`: it takes them precomputed; None (default):
            `"waveform"` where the directory has `preprocessor_config.json`,
            else `"features"`.

    Returns:
        A `ConformerCTC`, or for a `ParakeetForRNNT` / `ParakeetForTDT`
        directory a `ConformerTransducer` whose `frames` are transformers'
        `get_audio_features(...).pooler_output` and whose `decode` gives
        `generate`'s tokens plus one (blanks left out). Given
        `{"features": input_features,
        "feature_length": attention_mask.sum(-1)}` (a features model) or the
        waveforms `ParakeetFeatureExtractor` was given (a waveform model),
        its logits over each utterance's `logit_lengths` frames equal
        transformers' with the blank moved from the last index to index 0
        (`np.roll(hf_logits, 1, axis=-1)`).

    Raises:
        ValueError: a malformed file, a config or feature extractor option
            the model does not compute, `input_type="waveform"` without
            `preprocessor_config.json`, a tensor missing or of another shape
            than `config.json` implies, or a tensor the model has no place
            for (each named; nothing is assigned then).
    """
    path = os.fspath(path)
    if input_type not in _INPUT_TYPES:
        raise ValueError(f"`input_type` must be one of {_INPUT_TYPES}. "
                         f"Received: input_type={input_type!r}")
    hf_config = read_config(path)
    names = hf_config.get("architectures") or []
    readable = _ARCHITECTURES + tuple(_TRANSDUCERS)
    if names and not any(name in readable for name in names):
        raise ValueError(
            f"{os.path.join(path, _FILE)} names architectures {names}; this loader "
            f"reads {list(readable)}. Received: architectures={names!r}")
    preprocessor = None
    if os.path.exists(os.path.join(path, _PREPROCESSOR)):
        preprocessor = read_config(path, _PREPROCESSOR)
    elif input_type == "waveform":
        raise ValueError(
            f"A waveform model computes the features of the directory's {_PREPROCESSOR}, "
            f"which {path} does not have (save the feature extractor there too, or load "
            "the features model). Received: input_type='waveform'")
    if input_type is None:
        input_type = "features" if preprocessor is None else "waveform"
    config = parakeet_config_from_hf(hf_config, preprocessor, input_type)
    # Parakeet's layerdrop skips whole blocks in training only: the Keras
    # model has no such option; the value is kept for save_hf_parakeet.
    layerdrop = config_float(hf_config["encoder_config"], "layerdrop", _FILE, 0.0)
    ckpt = Tensors(read_safetensors(path), path)
    if _transducer_kind(hf_config):
        arguments = _transducer_arguments(hf_config)
        _check_transducer_sizes(config, arguments, ckpt.tensors, path)
        model = ConformerTransducer(**dataclasses.asdict(config), **arguments)
        _sum_lstm_biases(ckpt, arguments["predictor_layers"], arguments["predictor_dim"])
    else:
        _check_sizes(config, ckpt.tensors, path)
        model = build_conformer(config)
    # BatchNorm's step counter is no weight; the sinusoids are recomputed.
    load_weights(model, _layout(model), ckpt, ignored=tuple(
        f"encoder.layers.{i}.conv.norm.num_batches_tracked" for i in range(config.num_layers)),
        cast=True)
    setattr(model, _LAYERDROP, layerdrop)
    return model


# The attribute of a loaded model holding its config.json's
# encoder_config.layerdrop, which save_hf_parakeet writes back.
_LAYERDROP = "_parakeet_layerdrop"


def _check_sizes(config, tensors, path):
    """The config's sizes against the checkpoint's tensors, before the model
    is built (`check_sizes`); the encoder's keys are under `encoder_config`."""
    V, D, F = config.vocabulary_size + 1, config.hidden_dim, config.intermediate_dim
    C, K = config.subsampling_filters, config.kernel_size
    hidden = ("encoder_config.hidden_size", D)
    block = "encoder.layers.0."
    check_sizes(tensors, path, [
        ("ctc_head.weight", (V, D, 1), {0: ("vocab_size", V), 1: hidden}),
        (block + "feed_forward1.linear1.weight", (F, D),
         {0: ("encoder_config.intermediate_size", F), 1: hidden}),
        (block + "conv.depthwise_conv.weight", (D, 1, K),
         {0: hidden, 2: ("encoder_config.conv_kernel_size", K)}),
        ("encoder.subsampling.layers.0.weight", (C, 1, 3, 3),
         {0: ("encoder_config.subsampling_conv_channels", C)}),
    ], [("encoder_config.num_hidden_layers", config.num_layers, "encoder.layers.")])


def _check_transducer_sizes(config, arguments, tensors, path):
    """`_check_sizes` for a transducer: the encoder's, the vocabulary's and
    the prediction network's sizes against the tensors, before building."""
    V, D, F = config.vocabulary_size + 1, config.hidden_dim, config.intermediate_dim
    P, K = arguments["predictor_dim"], config.kernel_size
    hidden = ("encoder_config.hidden_size", D)
    block = "encoder.layers.0."
    outputs = V + len(arguments["durations"] or ())
    check_sizes(tensors, path, [
        ("decoder.embedding.weight", (V, P), {0: ("vocab_size", V),
                                              1: ("decoder_hidden_size", P)}),
        ("joint.head.weight", (outputs, P), {0: ("vocab_size + len(durations)", outputs)}),
        (block + "feed_forward1.linear1.weight", (F, D),
         {0: ("encoder_config.intermediate_size", F), 1: hidden}),
        (block + "conv.depthwise_conv.weight", (D, 1, K),
         {0: hidden, 2: ("encoder_config.conv_kernel_size", K)}),
    ], [("encoder_config.num_hidden_layers", config.num_layers, "encoder.layers."),
        ("num_decoder_layers", arguments["predictor_layers"], "decoder.lstm.weight_ih_l")])


# ConformerConfig fields a ParakeetForCTC computes with one value only.
_SAVABLE = {
    "subsampling": "fast",
    "conv_norm": "batch_norm",
    "causal_conv": False,
    "chunk_size": None,
    "front_end": "parakeet",
    "layer_norm_epsilon": _TORCH_NORM_EPSILON,
    "batch_norm_epsilon": _TORCH_NORM_EPSILON,
}


def save_hf_parakeet(model, directory, overwrite=False):
    """Writes a keras_attn FastConformer `ConformerCTC` as a Hugging Face
    `ParakeetForCTC` directory: `config.json`, `model.safetensors`
    (float32) and the feature extractor's `preprocessor_config.json`; a
    `ConformerTransducer` as a `ParakeetForRNNT` (or, with `durations`,
    `ParakeetForTDT`) directory, with a `generation_config.json` whose
    `generate` gives `decode`'s transcripts (its tokens = ours - 1).

    `transformers.ParakeetForCTC.from_pretrained(directory)` loads it with
    no missing or unexpected tensor, and its logits on
    `ParakeetFeatureExtractor.from_pretrained(directory)(waveforms)` (or on
    the features a features model takes) equal the model's with the blank
    moved back from index 0 to the last index (keras_attn's label `i` is
    Parakeet's token `i - 1`). `load_hf_parakeet` reads it back.

    Args:
        model: a `ConformerCTC` or `ConformerTransducer` (its joint's
            activation relu, tanh, sigmoid or silu) with `subsampling="fast"`,
            `front_end="parakeet"`, `conv_norm="batch_norm"`, offline
            (no `chunk_size`, no `causal_conv`), PyTorch's norm epsilons
            (1e-5) and an odd `kernel_size` (as `parakeet_ctc_*` presets and
            `load_hf_parakeet` make it); float, without LoRA adapters.
        directory: where to write; created, or replaced when `overwrite`
            (atomically).
        overwrite: replace an existing non-empty `directory` that holds an
            earlier Hugging Face export (any other directory is refused).

    Returns:
        The absolute path of `directory`.

    Raises:
        ValueError: another model, an option `ParakeetForCTC` does not
            compute (named with its value), a quantized or LoRA-adapted
            layer, or an existing non-empty directory without `overwrite`
            (nothing is written then).
    """
    config = getattr(model, "conformer_config", None)
    if config is None:
        raise ValueError("`model` must be a keras_attn ConformerCTC (build_conformer) or "
                         "ConformerTransducer. Received: "
                         f"model={type(model).__name__}")
    for name, value in _SAVABLE.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"transformers' ParakeetForCTC computes {name}={value!r} only. "
                f"Received: {name}={getattr(config, name)!r}")
    if config.kernel_size % 2 == 0:
        raise ValueError(
            "transformers' ParakeetForCTC pads its depthwise convolution by (k - 1) / 2 on "
            f"each side: an odd kernel_size only. Received: kernel_size={config.kernel_size}")
    entries = _layout(model)
    encoder = {
        "model_type": "parakeet_encoder",
        "hidden_size": config.hidden_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_heads,
        "intermediate_size": config.intermediate_dim or 4 * config.hidden_dim,
        "conv_kernel_size": config.kernel_size,
        "subsampling_conv_channels": config.subsampling_filters or config.hidden_dim,
        "num_mel_bins": config.num_mel_bins,
        "scale_input": config.scale_input,
        "dropout": config.dropout,
        "activation_dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "dropout_positions": 0.0,
        # keras_attn's blocks are never skipped; a loaded checkpoint's value
        # (a training setting of transformers) is written back as it was.
        "layerdrop": float(getattr(model, _LAYERDROP, 0.0)),
        "max_position_embeddings": 5000,
        "initializer_range": 0.02,
        **_FIXED,
    }
    vocab = config.vocabulary_size + 1
    hf_config = {
        "architectures": list(_ARCHITECTURES),
        "model_type": "parakeet_ctc",
        "vocab_size": vocab,
        "pad_token_id": vocab - 1,  # the blank
        "ctc_loss_reduction": "mean",
        "ctc_zero_infinity": True,
        "encoder_config": encoder,
        "dtype": "float32",
    }
    files = {}
    extra = {}
    if isinstance(model, ConformerTransducer):
        hf_config, files, extra = _transducer_files(model, encoder)
    preprocessor = {
        "feature_extractor_type": "ParakeetFeatureExtractor",
        "feature_size": config.num_mel_bins,
        "sampling_rate": config.sampling_rate,
        "win_length": config.frame_length,
        "hop_length": config.frame_step,
        "n_fft": config.fft_length,
        "preemphasis": config.preemphasis,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
    }
    # BatchNorm's step counter, a 0-d int64 in torch.
    steps = {f"encoder.layers.{i}.conv.norm.num_batches_tracked": np.zeros((), "int64")
             for i in range(config.num_layers)}
    files = {**files, _FILE: json_text(hf_config), _PREPROCESSOR: json_text(preprocessor)}
    return write_weights(directory, entries, files, overwrite=overwrite,
                         extra={**steps, **extra})


def _transducer_files(model, encoder):
    """config.json's dict, generation_config.json and the tensors beyond the
    weights of a `ConformerTransducer` written as a `ParakeetForRNNT` /
    `ParakeetForTDT`."""
    if model.joint_activation not in _JOINT_ACTIVATIONS:
        raise ValueError(
            f"transformers' Parakeet joint computes hidden_act in {list(_JOINT_ACTIVATIONS)}. "
            f"Received: joint_activation={model.joint_activation!r}")
    vocab = model.vocabulary_size + 1
    tdt = model.durations is not None
    architecture = "ParakeetForTDT" if tdt else "ParakeetForRNNT"
    hf_config = {
        "architectures": [architecture],
        "model_type": _TRANSDUCERS[architecture],
        "vocab_size": vocab,
        "blank_token_id": vocab - 1,
        # Pads label arrays only (never read by the model): Parakeet's 2, or
        # 0 for a vocabulary too small to hold it beside the blank.
        "pad_token_id": 2 if vocab > 3 else 0,
        "decoder_hidden_size": model.predictor_dim,
        "num_decoder_layers": model.predictor_layers,
        "hidden_act": model.joint_activation,
        "max_symbols_per_step": model.max_symbols_per_step,
        "encoder_config": encoder,
        "dtype": "float32",
    }
    generation = {"decoder_start_token_id": vocab - 1, "pad_token_id": hf_config["pad_token_id"]}
    if tdt:
        hf_config["durations"] = list(model.durations)
        # generate reads its label from the argmax over all the joint's
        # logits: the duration logits' ids are suppressed.
        generation["suppress_tokens"] = list(range(vocab, vocab + len(model.durations)))
    # torch's LSTM has two biases where Keras's has one: the sum goes into
    # bias_ih, bias_hh is 0.
    P = model.predictor_dim
    extra = {f"decoder.lstm.bias_hh_l{i}": np.zeros((4 * P,), "float32")
             for i in range(model.predictor_layers)}
    return hf_config, {"generation_config.json": json_text(generation)}, extra


CONVERTER = register(Converter(
    "parakeet", _ARCHITECTURES + tuple(_TRANSDUCERS), ("parakeet_ctc",) + tuple(
        _TRANSDUCERS.values()), load=load_hf_parakeet,
    save=save_hf_parakeet,
    writes=lambda model: isinstance(model, (ConformerCTC, ConformerTransducer)),
    models=("ConformerCTC (FastConformer)", "ConformerTransducer (FastConformer)")))

__all__ = ["load_hf_parakeet", "parakeet_config_from_hf", "save_hf_parakeet"]
