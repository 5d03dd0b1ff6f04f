"""A ViT from a Hugging Face `ViTModel` / `ViTForImageClassification` directory.

The directory holds `config.json` and `model.safetensors` (what
`save_pretrained` writes). Only NumPy and `safetensors` are used to read it;
neither torch nor transformers is needed.

Hugging Face models take normalised `(B, C, H, W)` pixel values, prepared
by the directory's image processor (`preprocessor_config.json`; `(x / 255 -
0.5) / 0.5` with the default `ViTImageProcessor`); the Keras ViT takes raw
`(B, H, W, C)` pixels in [0, 255] and rescales and normalises them itself as
that processor says (`do_rescale`, `rescale_factor`, `do_normalize`,
`image_mean`, `image_std`: `keras_attn.convert._image_processor`), so
`hf(**processor(images, return_tensors="pt"))` equals `keras_vit(images)`
for images of the model's size. The processor's `size` must be that size
(the model does not resize); without the file the default processor's
[-1, 1] is assumed.

Every tensor must have exactly the shape `config.json` implies before it is
laid out for Keras, and every tensor must be used (the `ViTModel` pooler and,
with `include_classifier=False`, the classifier are dropped and named in a
warning); a malformed file is a `ValueError` naming the file and the key.
"""

import dataclasses
import os
import warnings

from keras_attn._checks import check_bool
from keras_attn._keras_compat import sublayers
from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import check_sizes
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
from keras_attn.convert._image_processor import check_image_size
from keras_attn.convert._image_processor import processor_statistics
from keras_attn.convert._image_processor import read_image_processor
from keras_attn.models.vit import ViT
from keras_attn.models.vit import ViTConfig


def vit_config_from_hf(hf_config):
    """A `ViTConfig` from the fields of a Hugging Face ViT `config.json`."""
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            "Only the exact GELU of the reference ViT is supported. "
            f"Received: hidden_act={hf_config['hidden_act']!r}"
        )
    if not hf_config.get("qkv_bias", True):
        raise ValueError(
            "The attention projections must have biases. Received: qkv_bias=False"
        )
    labels = hf_config.get("id2label") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"config.json: 'id2label' must be an object. Received: id2label={labels!r}")
    file = "config.json"
    return ViTConfig(
        image_size=config_int(hf_config, "image_size", file, 224),
        patch_size=config_int(hf_config, "patch_size", file, 16),
        num_channels=config_int(hf_config, "num_channels", file, 3),
        hidden_dim=config_int(hf_config, "hidden_size", file),
        num_layers=config_int(hf_config, "num_hidden_layers", file),
        num_heads=config_int(hf_config, "num_attention_heads", file),
        intermediate_dim=config_int(hf_config, "intermediate_size", file),
        dropout=config_float(hf_config, "hidden_dropout_prob", file, 0.0),
        attention_dropout=config_float(hf_config, "attention_probs_dropout_prob", file, 0.0),
        layer_norm_epsilon=config_float(hf_config, "layer_norm_eps", file, 1e-12),
        pooling="cls",
        num_classes=len(labels) or None,
    )


def check_vit_sizes(config, tensors, path, prefix, intermediate):
    """A ViT config's sizes against the checkpoint's tensors, before the
    model is built (`check_sizes`): `prefix` is the backbone's ("vit." in
    a classifier), `intermediate` `(key, value, name, axis)` the tensor of
    block 0 whose `axis` (0 or 1, the other is `hidden_dim`) is the MLP's
    width, which `key` sets."""
    D, C, P = config.hidden_dim, config.num_channels, config.patch_size
    T = config.num_patches + 1
    embeddings = prefix + "embeddings."
    key, value, name, axis = intermediate
    F = config.intermediate_dim
    check_sizes(tensors, path, [
        (embeddings + "patch_embeddings.projection.weight", (D, C, P, P),
         {0: ("hidden_size", D), 1: ("num_channels", C), 2: ("patch_size", P),
          3: ("patch_size", P)}),
        (embeddings + "position_embeddings", (1, T, D),
         {1: ("image_size", config.image_size), 2: ("hidden_size", D)}),
        (f"{prefix}encoder.layer.0.{name}", (F, D) if axis == 0 else (D, F),
         {axis: (key, value), 1 - axis: ("hidden_size", D)}),
    ], [("num_hidden_layers", config.num_layers, prefix + "encoder.layer.")])


def embedding_entries(model, embeddings):
    """The `Entry`s of a ViT's patch projection, class token and position
    table under `embeddings` ("vit.embeddings." and the like)."""
    config = model.vit_config
    D, C, P = config.hidden_dim, config.num_channels, config.patch_size
    T = config.num_patches + 1  # patches and the class token
    # Conv kernel: torch (D, C, P, P) <-> Keras (P, P, C, D).
    kernel, bias = layer_weights(model.get_layer("patch_embedding"), 2)
    entries = [Entry(embeddings + "patch_embeddings.projection.weight", (D, C, P, P), kernel,
                     lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1)),
               Entry(embeddings + "patch_embeddings.projection.bias", (D,), bias)]
    (token,) = layer_weights(model.get_layer("class_token"), 1)
    entries.append(Entry(embeddings + "cls_token", (1, 1, D), token,
                         lambda a: a.reshape(D), lambda a: a.reshape(1, 1, D)))
    (table,) = layer_weights(model.get_layer("position_embedding"), 1)
    entries.append(Entry(embeddings + "position_embeddings", (1, T, D), table,
                         lambda a: a[0], lambda a: a[None]))
    return entries


def attention_entries(attention, hf, width, num_heads):
    """The `Entry`s of a block's self-attention under `hf` + "attention.":
    query/key/value `(D, D)` as `(D, N, H)` kernels, the output dense."""
    entries = []
    _, _, heads_in, heads_out = entry_helpers(entries, width, num_heads)
    for name in ("query", "key", "value"):
        heads_in(_sublayer(attention, name), hf + f"attention.attention.{name}")
    heads_out(_sublayer(attention, "attention_output"), hf + "attention.output.dense")
    return entries


def _layout(model, prefix):
    """The `Entry` of every weight of a keras_attn `ViT` under Hugging
    Face's names (`prefix` "vit." in a ViTForImageClassification)."""
    config = model.vit_config
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    entries = embedding_entries(model, prefix + "embeddings.")
    dense, norm = entry_helpers(entries, D)
    for i in range(config.num_layers):
        hf = f"{prefix}encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")
        entries += attention_entries(block.self_attention, hf, D, N)
        norm(block.self_attention_layer_norm, hf + "layernorm_before")
        norm(block.feed_forward_layer_norm, hf + "layernorm_after")
        dense(block.feed_forward.intermediate_dense, hf + "intermediate.dense", F, D)
        dense(block.feed_forward.output_dense, hf + "output.dense", D, F)
    norm(model.get_layer("final_layer_norm"), prefix + "layernorm")
    if config.num_classes is not None:
        dense(model.get_layer("classifier"), "classifier", config.num_classes, D)
    return entries


def load_hf_vit(path, include_classifier=True, interpolate_pos_encoding=False):
    """Builds a `ViT` and loads the weights of a Hugging Face ViT directory.

    Args:
        path: directory with `config.json` and `model.safetensors` (or
            its shards: `read_safetensors`), and optionally the image
            processor's `preprocessor_config.json`, whose rescaling and
            normalisation the model's first layer does (the default
            `ViTImageProcessor`'s [-1, 1] without it).
        include_classifier: load the `classifier` head of a
            `ViTForImageClassification` (logits out; its `class_names` from
            `id2label`, None for the defaults `LABEL_i`). False, or a
            checkpoint without a head (`ViTModel`), gives the backbone
            (`(B, D)` out).
            The `ViTModel` pooler (a tanh Dense that ViT classification does
            not use) is never loaded.
        interpolate_pos_encoding: False: the model takes the checkpoint's
            `image_size` only. True: it takes images of any height and width
            the patch size divides, its position grid resampled to each, and
            equals transformers' `model(pixel_values,
            interpolate_pos_encoding=True)` (`position_interpolation=
            "bicubic"`); the weights are the same.

    Returns:
        The Keras `ViT`.

    Raises:
        ValueError: a malformed checkpoint, or a `preprocessor_config.json`
            the model cannot follow (another processor class, statistics not
            one per channel, an output size other than `image_size`), named
            by file, key and value.
    """
    check_bool("interpolate_pos_encoding", interpolate_pos_encoding)
    hf_config = read_config(path)
    config = vit_config_from_hf(hf_config)
    processing = read_image_processor(path, config.num_channels, "ViTImageProcessor", "half")
    check_image_size(processing, config.image_size, "config.json image_size")
    config = dataclasses.replace(config, **processing.fields)
    if interpolate_pos_encoding:
        config = dataclasses.replace(config, position_interpolation="bicubic")
    raw = read_safetensors(path)
    # ViTForImageClassification prefixes the backbone with "vit.".
    prefix = "vit." if any(k.startswith("vit.") for k in raw) else ""
    tensors = Tensors(raw, path)
    has_head = "classifier.weight" in raw and include_classifier
    num_classes = raw["classifier.weight"].shape[0] if has_head else None
    class_names = None
    if has_head:  # the names of the head's classes (checked against it)
        _, class_names = hf_class_names(hf_config, os.path.join(path, "config.json"), num_classes)
    check_vit_sizes(config, raw, path, prefix,
                    ("intermediate_size", config.intermediate_dim, "intermediate.dense.weight", 0))
    model = ViT(**dataclasses.asdict(dataclasses.replace(config, num_classes=num_classes)),
                class_names=class_names)
    dropped = load_weights(model, _layout(model, prefix), tensors,
                           dropped=(prefix + "pooler.", "classifier."))
    if dropped:
        warnings.warn(
            f"{tensors.file}: not loaded (by choice): "
            f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in dropped}))}",
            stacklevel=2,
        )
    return model


def save_hf_vit(model, directory, overwrite=False, class_names=None):
    """Writes a keras_attn `ViT` as a Hugging Face directory:
    `config.json`, `model.safetensors` (float32) and
    `preprocessor_config.json` (the rescaling and normalisation the Keras
    model does itself: `AutoImageProcessor` loads it).

    A model with a classifier is written as a `ViTForImageClassification`;
    a backbone (`num_classes=None`) as a `ViTModel` without the pooler that
    keras_attn's ViT does not have: load it with
    `transformers.ViTModel.from_pretrained(directory, add_pooling_layer=False)`.
    Either loads with no missing or unexpected key, and
    `hf(**processor(x, return_tensors="pt"))` equals `model(x)`
    (logits, or for the backbone the final-norm [CLS] token,
    `last_hidden_state[:, 0]`).

    Args:
        model: a `ViT` (`build_vit`) with `pooling="cls"`, float (not
            quantized) and without LoRA adapters (`merge_lora` folds them in).
        directory: where to write; created, or replaced when `overwrite`
            (atomically).
        overwrite: replace an existing non-empty `directory` that holds an
            earlier Hugging Face export (any other directory is refused).
        class_names: the classifier's class names, in output order, written
            as `id2label` (and its inverse `label2id`); default: the
            model's `class_names`, else `LABEL_0`, `LABEL_1`, ...

    Returns:
        The absolute path of `directory`.

    Raises:
        ValueError: not a ViT, a GAP-pooled ViT (Hugging Face's classifies
            from the [CLS] token), a quantized or LoRA-adapted layer,
            `class_names` that are not the classifier's (or for a backbone),
            or an existing non-empty directory without `overwrite` (nothing
            is written then).
    """
    config = getattr(model, "vit_config", None)
    if config is None:
        raise ValueError(
            f"`model` must be a keras_attn ViT (build_vit). Received: model={type(model).__name__}"
        )
    if (config.num_register_tokens or config.layer_scale_init is not None
            or config.feed_forward != "gelu"):
        raise ValueError(
            "Hugging Face's ViT has no register tokens, LayerScale or SwiGLU: write a "
            "DINOv2 ViT with keras_attn.convert.save_hf (save_hf_dinov2). Received: "
            f"num_register_tokens={config.num_register_tokens}, "
            f"layer_scale_init={config.layer_scale_init}, feed_forward={config.feed_forward!r}"
        )
    if config.pooling != "cls":
        raise ValueError(
            "Hugging Face's ViT classifies from the [CLS] token; a GAP-pooled ViT has no "
            f"equivalent there. Received: pooling={config.pooling!r}"
        )
    head = config.num_classes is not None
    entries = _layout(model, "vit." if head else "")
    hf_config = {
        "architectures": ["ViTForImageClassification" if head else "ViTModel"],
        "model_type": "vit",
        "image_size": config.image_size,
        "patch_size": config.patch_size,
        "num_channels": config.num_channels,
        "hidden_size": config.hidden_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "layer_norm_eps": config.layer_norm_epsilon,
        "qkv_bias": True,
        "initializer_range": 0.02,
        "encoder_stride": config.patch_size,
        "dtype": "float32",
    }
    hf_config.update(hf_label_fields(config.num_classes, model.class_names, class_names))
    mean, std = processor_statistics(config)
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": config.image_size, "width": config.image_size},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": mean,
        "image_std": std,
    }
    files = {"config.json": json_text(hf_config),
             "preprocessor_config.json": json_text(processor)}
    return write_weights(directory, entries, files, overwrite=overwrite)


def _sublayer(layer, name):
    """The sublayer of `layer` named `name` (the shared attention layer names
    its projections `query`, `key`, `value`, `attention_output`)."""
    for sub in sublayers(layer, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")


def is_dinov2(config):
    """Whether a `ViTConfig` uses an option only DINOv2's checkpoint layout
    has (registers, LayerScale, SwiGLU, the [CLS] + mean-patch head): such
    a ViT is written by the DINOv2 converter, any other by this one."""
    return (config.num_register_tokens > 0 or config.layer_scale_init is not None
            or config.feed_forward == "swiglu" or config.pooling == "cls_gap")


def load_hf_vit_classifier(path, num_classes, class_names=None):
    """`load_hf(path, num_classes=...)` for ViT: `ViTForImageClassification`'s
    head ([CLS] pooling) over the checkpoint's encoder, its own head where
    it has `num_classes` outputs (`_registry.vit_classifier`)."""
    return vit_classifier(load_hf_vit(path), path, num_classes, class_names, "cls")


CONVERTER = register(Converter(
    "vit", ("ViTModel", "ViTForImageClassification"), ("vit",), load=load_hf_vit,
    save=save_hf_vit, models=("ViT",), classifier=load_hf_vit_classifier,
    writes=lambda model: isinstance(model, ViT) and not is_dinov2(model.vit_config)))
