"""DINOv2 with registers from a Hugging Face `Dinov2WithRegistersModel` or
`Dinov2WithRegistersForImageClassification` directory, and back.

The keras_attn model is a `ViT` with the DINOv2 options (`num_register_tokens`,
`layer_scale_init`, `feed_forward="swiglu"` where the checkpoint has SwiGLU,
`pixel_normalization="imagenet"`; `pooling="cls_gap"` for the classifier,
whose linear head reads the [CLS] vector concatenated with the mean patch
token). It takes raw `(B, H, W, C)` pixels in [0, 255] and rescales and
normalises them itself as the directory's `BitImageProcessor`
(`preprocessor_config.json`) says, so `hf(**processor(x, return_tensors="pt"))`
equals it for images of the processor's crop size, the model's input size
(the last hidden state before pooling is the output of the layer
`final_layer_norm`). The model does not resize or crop: images of another
size are prepared as the processor's `size` / `resample` / `crop_size` say.

transformers interpolates the position grid to every input size on the fly
(bicubic, antialiased); `load_hf_dinov2(path, interpolate_pos_encoding=True)`
gives the Keras model that does the same (`position_interpolation=
"bicubic_antialias"`). By default the Keras model has one input size, and
`resize_vit(model, size, interpolation="bicubic_antialias")` (or
`load_hf_dinov2(path, image_size=size)`) makes the model of another size
with the same interpolated table.

Read with NumPy and `safetensors` only. Every tensor is checked against the
shape `config.json` implies before anything is assigned, and every tensor is
used: `embeddings.mask_token`, which transformers uses for masked-image
pretraining only (`bool_masked_pos`), never in a forward pass of an image,
is no weight of the Keras model: the loader keeps it on the model and
`save_hf_dinov2` writes it back. Stochastic depth (`drop_path_rate`) is a training setting
the Keras model does not have; a checkpoint that asks for it loads without it
(equal outputs in inference).
"""

import dataclasses
import os

from keras_attn._checks import check_bool
from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import hf_class_names
from keras_attn.convert._checkpoint import hf_label_fields
from keras_attn.convert._checkpoint import json_text
from keras_attn.convert._checkpoint import layer_weights
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._registry import vit_classifier
from keras_attn.convert._registry import Converter
from keras_attn.convert._registry import entry_helpers
from keras_attn.convert._registry import load_weights
from keras_attn.convert._registry import register
from keras_attn.convert._registry import write_weights
from keras_attn.convert._image_processor import processor_statistics
from keras_attn.convert._image_processor import read_image_processor
from keras_attn.convert.vit import attention_entries
from keras_attn.convert.vit import check_vit_sizes
from keras_attn.convert.vit import embedding_entries
from keras_attn.convert.vit import is_dinov2
from keras_attn.models.vit import ViT
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import resize_vit

_FILE = "config.json"
_PREFIX = "dinov2_with_registers."  # the backbone inside ...ForImageClassification
_ARCHITECTURES = ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification")


def swiglu_hidden_dim(hidden_dim, mlp_ratio):
    """The hidden width of DINOv2's SwiGLU MLP: 2/3 of `hidden_dim *
    mlp_ratio`, rounded up to a multiple of 8 (its parameter count stays
    that of the GELU MLP)."""
    return (int(int(hidden_dim * mlp_ratio) * 2 / 3) + 7) // 8 * 8


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
            shards: `read_safetensors`), and, optionally, the image
            processor's `preprocessor_config.json`, whose rescaling and
            normalisation (`do_rescale`, `rescale_factor`, `do_normalize`,
            `image_mean`, `image_std`) the model's first layer does;
            ImageNet's without it.
        include_classifier: load the head of a
            `Dinov2WithRegistersForImageClassification` (logits out, from
            the [CLS] vector and the mean patch token; its `class_names`
            from `id2label`, None for the defaults `LABEL_i`). False, or a
            `Dinov2WithRegistersModel`, gives the backbone, `(B, D)` out: the
            [CLS] vector (transformers' `pooler_output`).
        image_size: None for the size the processor gives its model
            (`crop_size`, as `BitImageProcessor` center-crops; its `size`
            without the crop), or the checkpoint's `image_size` where the
            processor fixes none or there is no processor; else the input
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
    processing = read_image_processor(path, config_int(hf_config, "num_channels", _FILE, 3),
                                      "BitImageProcessor", "imagenet")
    raw = read_safetensors(path)
    prefix = _PREFIX if any(k.startswith(_PREFIX) for k in raw) else ""
    has_head = include_classifier and "classifier.weight" in raw
    num_classes = raw["classifier.weight"].shape[0] if has_head else None
    class_names = None
    if has_head:  # the names of the head's classes (checked against it)
        _, class_names = hf_class_names(hf_config, os.path.join(path, _FILE), num_classes)
    config = dinov2_config_from_hf(hf_config, num_classes)
    config = dataclasses.replace(config, **processing.fields)
    if image_size is None and not interpolate_pos_encoding:
        image_size = processing.size  # an any-size model keeps the checkpoint's grid
    swiglu = config.feed_forward == "swiglu"
    check_vit_sizes(config, raw, path, prefix,
                    ("mlp_ratio", hf_config.get("mlp_ratio", 4),
                     "mlp.weights_out.weight" if swiglu else "mlp.fc2.weight", 1))
    if interpolate_pos_encoding:
        config = dataclasses.replace(config, position_interpolation="bicubic_antialias")
    model = ViT(**dataclasses.asdict(config), class_names=class_names)
    tensors = Tensors(raw, path)
    mask_token = prefix + "embeddings.mask_token"
    if mask_token in raw:  # no weight of the Keras model: carried to save_hf_dinov2
        mask_token = tensors.get(mask_token, (1, config.hidden_dim))
    else:
        mask_token = None
    load_weights(model, _layout(model, prefix), tensors,
                 dropped=() if include_classifier else ("classifier.",))
    if image_size is not None and image_size != config.image_size:
        model = resize_vit(model, image_size, interpolation="bicubic_antialias")
    if mask_token is not None:
        setattr(model, _MASK_TOKEN, mask_token.astype("float32"))
    return model


# The attribute of a loaded model holding the checkpoint's
# `embeddings.mask_token` (used by masked-image pretraining only; the Keras
# ViT has no such weight), which `save_hf_dinov2` writes back.
_MASK_TOKEN = "_dinov2_mask_token"


def _swiglu_ratio(hidden_dim, width):
    """The integer `mlp_ratio` (transformers 5 takes no other) whose SwiGLU
    width (`swiglu_hidden_dim`, transformers' arithmetic) is `width`; None
    when none gives it."""
    for ratio in range(1, 4 * max(1, width // hidden_dim) + 5):
        if swiglu_hidden_dim(hidden_dim, ratio) == width:
            return ratio
    return None


def save_hf_dinov2(model, directory, overwrite=False, class_names=None):
    """Writes a DINOv2 `ViT` as a Hugging Face directory transformers loads
    with no missing or unexpected key: a
    `Dinov2WithRegistersForImageClassification` (a model with a head, which
    must pool `"cls_gap"`) or a `Dinov2WithRegistersModel` (a backbone), with
    `preprocessor_config.json` holding the model's normalisation.

    The model must have LayerScale (transformers' DINOv2 always has); a
    GELU MLP must be `int(mlp_ratio) * hidden_dim` wide, a SwiGLU one of
    `swiglu_hidden_dim(hidden_dim, mlp_ratio)` for an integer `mlp_ratio`
    (what transformers' config can say).
    `embeddings.mask_token`, which keras_attn's model does not have, is
    the loaded checkpoint's (`load_hf_dinov2` keeps it on the model), else
    zeros (transformers' initial value). A classifier's `id2label` (and its
    inverse `label2id`) are `class_names` if given, else the model's
    `class_names`, else `LABEL_0`, `LABEL_1`, ...

    Returns:
        The absolute path of `directory`.
    """
    import numpy as np

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
        ratio = _swiglu_ratio(D, F)
        if ratio is None:
            raise ValueError(
                "transformers' SwiGLU width is swiglu_hidden_dim(hidden_dim, mlp_ratio), a "
                f"multiple of 8; no integer mlp_ratio gives {F}. "
                f"Received: intermediate_dim={F}, hidden_dim={D}")
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
    hf_config.update(hf_label_fields(config.num_classes, model.class_names, class_names))
    mean, std = processor_statistics(config)
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
    # The loaded checkpoint's mask token (load_hf_dinov2 carries it), else
    # transformers' initial zeros.
    mask_token = getattr(model, _MASK_TOKEN, None)
    if mask_token is None or np.shape(mask_token) != (1, D):
        mask_token = np.zeros((1, D), "float32")
    files = {"config.json": json_text(hf_config),
             "preprocessor_config.json": json_text(processor)}
    mask_token = {prefix + "embeddings.mask_token": np.asarray(mask_token, "float32")}
    return write_weights(directory, entries, files, overwrite=overwrite, extra=mask_token)


def load_hf_dinov2_classifier(path, num_classes, class_names=None):
    """`load_hf(path, num_classes=...)` for DINOv2 with registers: the ViT
    with `Dinov2WithRegistersForImageClassification`'s head (`pooling=
    "cls_gap"`) over the checkpoint's encoder, its own head where it has
    `num_classes` outputs (`_registry.vit_classifier`)."""
    return vit_classifier(load_hf_dinov2(path), path, num_classes, class_names, "cls_gap")


CONVERTER = register(Converter(
    "dinov2", _ARCHITECTURES, ("dinov2_with_registers",), load=load_hf_dinov2,
    save=save_hf_dinov2,
    writes=lambda model: isinstance(model, ViT) and is_dinov2(model.vit_config),
    models=("ViT with DINOv2's registers, LayerScale, SwiGLU or head",),
    classifier=load_hf_dinov2_classifier))
