"""A ViT from a Hugging Face `ViTModel` / `ViTForImageClassification` directory.

The directory holds `config.json` and `model.safetensors` (what
`save_pretrained` writes). Only NumPy and `safetensors` are used to read it;
neither torch nor transformers is needed.

Hugging Face models take normalised `(B, C, H, W)` pixel values
(`(x / 255 - 0.5) / 0.5` with the default `ViTImageProcessor`); the Keras ViT
takes raw `(B, H, W, C)` pixels in [0, 255] and does the same rescaling
itself, so `hf(pixel_values=(x / 127.5 - 1).transpose(0, 3, 1, 2))` equals
`keras_vit(x)`.
"""

import dataclasses
import json
import os

import numpy as np

from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit


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
    num_labels = len(hf_config.get("id2label") or {}) or None
    return ViTConfig(
        image_size=int(hf_config.get("image_size", 224)),
        patch_size=int(hf_config.get("patch_size", 16)),
        num_channels=int(hf_config.get("num_channels", 3)),
        hidden_dim=int(hf_config["hidden_size"]),
        num_layers=int(hf_config["num_hidden_layers"]),
        num_heads=int(hf_config["num_attention_heads"]),
        intermediate_dim=int(hf_config["intermediate_size"]),
        dropout=float(hf_config.get("hidden_dropout_prob", 0.0)),
        attention_dropout=float(hf_config.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_epsilon=float(hf_config.get("layer_norm_eps", 1e-12)),
        pooling="cls",
        num_classes=num_labels,
    )


def load_hf_vit(path, include_classifier=True):
    """Builds a `ViT` and loads the weights of a Hugging Face ViT directory.

    Args:
        path: directory with `config.json` and `model.safetensors`.
        include_classifier: load the `classifier` head of a
            `ViTForImageClassification` (logits out). False, or a checkpoint
            without a head (`ViTModel`), gives the backbone (`(B, D)` out).
            The `ViTModel` pooler (a tanh Dense that ViT classification does
            not use) is never loaded.

    Returns:
        The Keras `ViT`.
    """
    from safetensors.numpy import load_file

    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    # ViTForImageClassification prefixes the backbone with "vit.".
    prefix = "vit." if any(k.startswith("vit.") for k in tensors) else ""
    has_head = "classifier.weight" in tensors and include_classifier
    config = vit_config_from_hf(hf_config)
    num_classes = tensors["classifier.weight"].shape[0] if has_head else None
    model = build_vit(dataclasses.replace(config, num_classes=num_classes))

    def get(name):
        key = prefix + name
        if key not in tensors:
            raise ValueError(f"The checkpoint has no tensor {key!r}. Received: path={path!r}")
        return tensors[key]

    def assign(layer, weights, sources):
        """Sets `layer`'s weights after checking every shape; `sources` are
        the checkpoint keys, so a mismatch says which tensor is wrong."""
        for variable, value, source in zip(layer.weights, weights, sources):
            if tuple(variable.shape) != tuple(value.shape):
                raise ValueError(
                    f"Checkpoint tensor {source!r} does not fit "
                    f"{variable.path} of shape {tuple(variable.shape)} (does "
                    f"config.json match the weights?). Received: shape={tuple(value.shape)}"
                )
        layer.set_weights(list(weights))

    def set_layer(name, *weights, sources):
        assign(model.get_layer(name), weights, sources)

    heads, width = config.num_heads, config.hidden_dim
    head_dim = width // heads

    def reshaped(source, array, shape):
        if array.size != int(np.prod(shape)):
            raise ValueError(
                f"Checkpoint tensor {source!r} cannot be laid out as "
                f"{shape} (does config.json match the weights?). "
                f"Received: shape={tuple(array.shape)}"
            )
        return array.reshape(shape)

    # Conv kernel: torch (D, C, P, P) -> Keras (P, P, C, D).
    patch = "embeddings.patch_embeddings.projection."
    set_layer(
        "patch_embedding",
        get(patch + "weight").transpose(2, 3, 1, 0),
        get(patch + "bias"),
        sources=[prefix + patch + "weight", prefix + patch + "bias"],
    )
    set_layer("class_token", reshaped(prefix + "embeddings.cls_token", get("embeddings.cls_token"), (width,)),
              sources=[prefix + "embeddings.cls_token"])
    set_layer("position_embedding", get("embeddings.position_embeddings")[0],
              sources=[prefix + "embeddings.position_embeddings"])
    for i in range(config.num_layers):
        hf = f"encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")

        def linear(name, kernel_shape=None, bias_shape=None):
            # torch (out, in) -> Keras (in, out), then the head layout
            kernel, bias = get(hf + name + ".weight").T, get(hf + name + ".bias")
            if kernel_shape is not None:
                kernel = reshaped(prefix + hf + name + ".weight", kernel, kernel_shape)
            if bias_shape is not None:
                bias = reshaped(prefix + hf + name + ".bias", bias, bias_shape)
            return [kernel, bias], [prefix + hf + name + ".weight", prefix + hf + name + ".bias"]

        attention = block.self_attention
        for name in ("query", "key", "value"):
            weights, sources = linear(
                f"attention.attention.{name}", (width, heads, head_dim), (heads, head_dim)
            )
            assign(_sublayer(attention, name), weights, sources)
        weights, sources = linear("attention.output.dense", (heads, head_dim, width))
        assign(_sublayer(attention, "attention_output"), weights, sources)
        for layer, name in (
            (block.self_attention_layer_norm, "layernorm_before"),
            (block.feed_forward_layer_norm, "layernorm_after"),
        ):
            keys = [hf + name + ".weight", hf + name + ".bias"]
            assign(layer, [get(k) for k in keys], [prefix + k for k in keys])
        assign(block.feed_forward.intermediate_dense, *linear("intermediate.dense"))
        assign(block.feed_forward.output_dense, *linear("output.dense"))
    set_layer("final_layer_norm", get("layernorm.weight"), get("layernorm.bias"),
              sources=[prefix + "layernorm.weight", prefix + "layernorm.bias"])
    if has_head:
        set_layer(
            "classifier",
            tensors["classifier.weight"].T,
            tensors["classifier.bias"],
            sources=["classifier.weight", "classifier.bias"],
        )
    return model


def _sublayer(layer, name):
    """The sublayer of `layer` named `name` (the shared attention layer names
    its projections `query`, `key`, `value`, `attention_output`)."""
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")
