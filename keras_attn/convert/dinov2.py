"""DINOv2 with registers from a Hugging Face `Dinov2WithRegistersModel` or
`Dinov2WithRegistersForImageClassification` directory, and back.

The keras_attn model is a `ViT` with the DINOv2 options (`num_register_tokens`,
`layer_scale_init`, `feed_forward="swiglu"` where the checkpoint has SwiGLU,
`pixel_normalization="imagenet"`; `pooling="cls_gap"` for the classifier,
whose linear head reads the [CLS] vector concatenated with the mean patch
token). It takes raw `(B, H, W, C)` pixels in [0, 255] and normalises them
itself, so `hf(pixel_values=((x / 255 - mean) / std).transpose(0, 3, 1, 2))`
equals it (the last hidden state before pooling is the output of the layer
`final_layer_norm`).

transformers interpolates the position grid to every input size on the fly
(bicubic, antialiased); `load_hf_dinov2(path, interpolate_pos_encoding=True)`
gives the Keras model that does the same (`position_interpolation=
"bicubic_antialias"`). By default the Keras model has one input size, and
`resize_vit(model, size, interpolation="bicubic_antialias")` (or
`load_hf_dinov2(path, image_size=size)`) makes the model of another size
with the same interpolated table.

Read with NumPy and `safetensors` only. Every tensor is checked against the
shape `config.json` implies before anything is assigned, and every tensor is
used: the only one skipped is `embeddings.mask_token`, which transformers
uses for masked-image pretraining only (`bool_masked_pos`), never in a forward
pass of an image. Stochastic depth (`drop_path_rate`) is a training setting
the Keras model does not have; a checkpoint that asks for it loads without it
(equal outputs in inference).
"""

import dataclasses
import json
import os

from keras_attn._checks import check_bool
from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import json_text
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_entries
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._checkpoint import write_directory
from keras_attn.convert.vit import attention_entries
from keras_attn.convert.vit import embedding_entries
from keras_attn.convert.vit import entry_helpers
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit
from keras_attn.models.vit import resize_vit
from keras_attn.models.vit.vit_config import PIXEL_STATISTICS

_FILE = "config.json"
_PREFIX = "dinov2_with_registers."  # the backbone inside ...ForImageClassification
_ARCHITECTURES = ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification")


def swiglu_hidden_dim(hidden_dim, mlp_ratio):
    """The hidden width of DINOv2's SwiGLU MLP: 2/3 of `hidden_dim *
    mlp_ratio`, rounded up to a multiple of 8 (its parameter count stays
    that of the GELU MLP)."""
    return (int(int(hidden_dim * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def _pixel_normalization(directory):
    """The `pixel_normalization` of `preprocessor_config.json`; "imagenet"
    (DINOv2's image processor) when the directory has none."""
    path = os.path.join(directory, "preprocessor_config.json")
    if not os.path.exists(path):
        return "imagenet"
    try:
        with open(path, encoding="utf-8") as stream:
            processor = json.load(stream)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} cannot be read as JSON ({error}). "
                         f"Received: path={directory!r}") from None
    mean, std = processor.get("image_mean"), processor.get("image_std")
    for name, (known_mean, known_std) in PIXEL_STATISTICS.items():
        if (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == 3
                and all(abs(a - b) < 1e-6 for a, b in zip(mean + std, known_mean + known_std))):
            return name
    raise ValueError(
        f"{path}: the Keras model normalises pixels with one of {sorted(PIXEL_STATISTICS)} "
        f"({PIXEL_STATISTICS}). Received: image_mean={mean!r}, image_std={std!r}")


def dinov2_config_from_hf(hf_config, num_classes=None):
    """A `ViTConfig` from the fields of a Hugging Face DINOv2-with-registers
    `config.json` (the backbone's `pooling="cls"`, or with `num_classes`
    the classifier's `"cls_gap"`)."""
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{_FILE}: only the exact GELU of DINOv2's MLP is supported. "
                         f"Received: hidden_act={hf_config['hidden_act']!r}")
    if not hf_config.get("qkv_bias", True):
        raise ValueError(f"{_FILE}: the attention projections must have biases. "
                         "Received: qkv_bias=False")
    swiglu = hf_config.get("use_swiglu_ffn", False)
    if not isinstance(swiglu, bool):
        raise ValueError(f"{_FILE}: 'use_swiglu_ffn' must be true or false. "
                         f"Received: use_swiglu_ffn={swiglu!r}")
    hidden = config_int(hf_config, "hidden_size", _FILE)
    ratio = config_float(hf_config, "mlp_ratio", _FILE, 4)
    return ViTConfig(
        image_size=config_int(hf_config, "image_size", _FILE, 224),
        patch_size=config_int(hf_config, "patch_size", _FILE, 16),
        num_channels=config_int(hf_config, "num_channels", _FILE, 3),
        hidden_dim=hidden,
        num_layers=config_int(hf_config, "num_hidden_layers", _FILE),
        num_heads=config_int(hf_config, "num_attention_heads", _FILE),
        intermediate_dim=swiglu_hidden_dim(hidden, ratio) if swiglu else int(hidden * ratio),
        dropout=config_float(hf_config, "hidden_dropout_prob", _FILE, 0.0),
        attention_dropout=config_float(hf_config, "attention_probs_dropout_prob", _FILE, 0.0),
        layer_norm_epsilon=config_float(hf_config, "layer_norm_eps", _FILE, 1e-6),
        pooling="cls" if num_classes is None else "cls_gap",
        num_classes=num_classes,
        num_register_tokens=config_int(hf_config, "num_register_tokens", _FILE, 4),
        layer_scale_init=config_float(hf_config, "layerscale_value", _FILE, 1.0),
        feed_forward="swiglu" if swiglu else "gelu",
    )


def _layout(model, prefix):
    """The `Entry` of every weight of a DINOv2 `ViT` under Hugging Face's
    names (`prefix` "dinov2_with_registers." in the classifier)."""
    config = model.vit_config
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    R = config.num_register_tokens
    embeddings = prefix + "embeddings."
    entries = embedding_entries(model, embeddings)
    dense, norm = entry_helpers(entries, D)
    if R:
        (registers,) = layer_weights(model.get_layer("register_tokens"), 1)
        entries.append(Entry(embeddings + "register_tokens", (1, R, D), registers,
                             lambda a: a[0], lambda a: a[None]))
    for i in range(config.num_layers):
        hf = f"{prefix}encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")
        entries += attention_entries(block.self_attention, hf, D, N)
        entries.append(Entry(hf + "layer_scale1.lambda1", (D,), block.self_attention_layer_scale))
        entries.append(Entry(hf + "layer_scale2.lambda1", (D,), block.feed_forward_layer_scale))
        norm(block.self_attention_layer_norm, hf + "norm1")
        norm(block.feed_forward_layer_norm, hf + "norm2")
        # SwiGLU: `weights_in` rows [:F] are the SiLU-activated half, [F:] the
        # linear one: the order of FeedForward(gated=True)'s kernel columns.
        swiglu = config.feed_forward == "swiglu"
        ff = block.feed_forward
        dense(ff.intermediate_dense, hf + ("mlp.weights_in" if swiglu else "mlp.fc1"),
              2 * F if swiglu else F, D)
        dense(ff.output_dense, hf + ("mlp.weights_out" if swiglu else "mlp.fc2"), D, F)
    norm(model.get_layer("final_layer_norm"), prefix + "layernorm")
    if config.num_classes is not None:
        dense(model.get_layer("classifier"), "classifier", config.num_classes, 2 * D)
    return entries


def load_hf_dinov2(path, include_classifier=True, image_size=None,
                   interpolate_pos_encoding=False):
    """Builds a DINOv2-with-registers `ViT` and loads a Hugging Face
    directory's weights.

    Args:
        path: directory with `config.json` and `model.safetensors` (or its
            shards: `read_safetensors`), and,
            optionally, `preprocessor_config.json`, whose `image_mean` /
            `image_std` pick `pixel_normalization`; ImageNet's without it.
        include_classifier: load the head of a
            `Dinov2WithRegistersForImageClassification` (logits out, from
            the [CLS] vector and the mean patch token). False, or a
            `Dinov2WithRegistersModel`, gives the backbone, `(B, D)` out: the
            [CLS] vector (transformers' `pooler_output`).
        image_size: None for the checkpoint's `image_size`; else the input
            size of the model returned, its position grid resampled as
            transformers does for that size (`resize_vit`,
            `"bicubic_antialias"`).
        interpolate_pos_encoding: True: the model takes images of any height
            and width the patch size divides, as transformers' DINOv2 does,
            its position grid resampled to each input's as transformers does
            (`position_interpolation="bicubic_antialias"`). False (the
            default): one input size, the checkpoint's or `image_size`, which
            keeps the input shape static (for exports). Not with
            `image_size`.

    Returns:
        The Keras `ViT`.

    Raises:
        ValueError: a tensor missing, of another shape, non-finite or left
            over, or a config option the model does not compute (nothing is
            assigned then).
    """
    check_bool("interpolate_pos_encoding", interpolate_pos_encoding)
    if interpolate_pos_encoding and image_size is not None:
        raise ValueError(
            "Invalid value for argument `image_size`: a model that interpolates its "
            "position grid to every input takes every size; give one of the two. "
            f"Received: image_size={image_size!r}, interpolate_pos_encoding=True")
    hf_config = read_config(path)
    raw = read_safetensors(path)
    prefix = _PREFIX if any(k.startswith(_PREFIX) for k in raw) else ""
    has_head = include_classifier and "classifier.weight" in raw
    num_classes = raw["classifier.weight"].shape[0] if has_head else None
    config = dataclasses.replace(dinov2_config_from_hf(hf_config, num_classes),
                                 pixel_normalization=_pixel_normalization(path))
    if interpolate_pos_encoding:
        config = dataclasses.replace(config, position_interpolation="bicubic_antialias")
    model = build_vit(config)
    tensors = Tensors(raw, path)
    plan = read_entries(_layout(model, prefix), tensors, model)  # before any assignment
    ignored = (prefix + "embeddings.mask_token",)
    tensors.check_all_used(ignored=ignored + (() if include_classifier else ("classifier.",)))
    for variable, array in plan:
        variable.assign(array)
    if image_size is not None and image_size != config.image_size:
        model = resize_vit(model, image_size, interpolation="bicubic_antialias")
    return model


def is_dinov2(config):
    """Whether a `ViTConfig` uses an option only DINOv2's checkpoint layout
    has (registers, LayerScale, SwiGLU, the [CLS] + mean-patch head)."""
    return (config.num_register_tokens > 0 or config.layer_scale_init is not None
            or config.feed_forward == "swiglu" or config.pooling == "cls_gap")


def save_hf_dinov2(model, directory, overwrite=False):
    """Writes a DINOv2 `ViT` as a Hugging Face directory transformers loads
    with no missing or unexpected key: a
    `Dinov2WithRegistersForImageClassification` (a model with a head, which
    must pool `"cls_gap"`) or a `Dinov2WithRegistersModel` (a backbone), with
    `preprocessor_config.json` holding the model's normalisation.

    The model must have LayerScale (transformers' DINOv2 always has); a
    GELU MLP must be `int(mlp_ratio) * hidden_dim` wide, a SwiGLU one of
    `swiglu_hidden_dim(hidden_dim, 4)` (what transformers' config can say).
    `embeddings.mask_token`, which keras_attn's model does not have, is
    written as zeros (transformers' initial value).

    Returns:
        The absolute path of `directory`.
    """
    import numpy as np
    from keras import ops

    config = getattr(model, "vit_config", None)
    if config is None:
        raise ValueError(
            f"`model` must be a keras_attn ViT (build_vit). Received: model={type(model).__name__}")
    head = config.num_classes is not None
    if config.pooling == "gap" or (head and config.pooling != "cls_gap"):
        raise ValueError(
            "transformers' DINOv2 classifier reads the [CLS] vector and the mean patch token "
            "(pooling='cls_gap'); a backbone needs the [CLS] token. "
            f"Received: pooling={config.pooling!r}, num_classes={config.num_classes}")
    D, F = config.hidden_dim, config.intermediate_dim
    swiglu = config.feed_forward == "swiglu"
    if swiglu:
        ratio = 4
        if F != swiglu_hidden_dim(D, ratio):
            raise ValueError(
                "transformers' SwiGLU width is swiglu_hidden_dim(hidden_dim, mlp_ratio); with "
                f"mlp_ratio=4 it is {swiglu_hidden_dim(D, ratio)}. Received: intermediate_dim={F}")
    else:
        if F % D:
            raise ValueError(
                "transformers' DINOv2 MLP is an integer `mlp_ratio` times the hidden size. "
                f"Received: intermediate_dim={F}, hidden_dim={D}")
        ratio = F // D
    if config.layer_scale_init is None:
        raise ValueError(
            "transformers' DINOv2 always has LayerScale; build the model with "
            "layer_scale_init=1.0 to write it. Received: layer_scale_init=None")
    prefix = _PREFIX if head else ""
    entries = _layout(model, prefix)
    hf_config = {
        "architectures": [_ARCHITECTURES[1] if head else _ARCHITECTURES[0]],
        "model_type": "dinov2_with_registers",
        "image_size": config.image_size,
        "patch_size": config.patch_size,
        "num_channels": config.num_channels,
        "hidden_size": D,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "mlp_ratio": ratio,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "layer_norm_eps": config.layer_norm_epsilon,
        "qkv_bias": True,
        "layerscale_value": config.layer_scale_init,
        "drop_path_rate": 0.0,
        "use_swiglu_ffn": swiglu,
        "num_register_tokens": config.num_register_tokens,
        "initializer_range": 0.02,
        "dtype": "float32",
    }
    if head:
        hf_config["num_labels"] = config.num_classes
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_classes)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(config.num_classes)}
    mean, std = PIXEL_STATISTICS[config.pixel_normalization]
    processor = {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": config.image_size},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": config.image_size, "width": config.image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(mean),
        "image_std": list(std),
        "do_convert_rgb": True,
    }
    tensors = {
        entry.name: entry.to_hf(np.asarray(ops.convert_to_numpy(entry.variable), "float32"))
        for entry in entries
    }
    tensors[prefix + "embeddings.mask_token"] = np.zeros((1, D), "float32")
    files = {"config.json": json_text(hf_config),
             "preprocessor_config.json": json_text(processor)}
    return write_directory(directory, files, tensors, overwrite=overwrite)
