"""A ViT from a Hugging Face `ViTModel` / `ViTForImageClassification` directory.

The directory holds `config.json` and `model.safetensors` (what
`save_pretrained` writes). Only NumPy and `safetensors` are used to read it;
neither torch nor transformers is needed.

Hugging Face models take normalised `(B, C, H, W)` pixel values
(`(x / 255 - 0.5) / 0.5` with the default `ViTImageProcessor`); the Keras ViT
takes raw `(B, H, W, C)` pixels in [0, 255] and does the same rescaling
itself, so `hf(pixel_values=(x / 127.5 - 1).transpose(0, 3, 1, 2))` equals
`keras_vit(x)`.

Every tensor must have exactly the shape `config.json` implies before it is
laid out for Keras, and every tensor must be used (the `ViTModel` pooler and,
with `include_classifier=False`, the classifier are dropped and named in a
warning); a malformed file is a `ValueError` naming the file and the key.
"""

import dataclasses
import os
import warnings

from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
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
    config = vit_config_from_hf(read_config(path))
    raw = read_safetensors(path)
    # ViTForImageClassification prefixes the backbone with "vit.".
    prefix = "vit." if any(k.startswith("vit.") for k in raw) else ""
    tensors = Tensors(raw, path, prefix)
    has_head = "classifier.weight" in raw and include_classifier
    num_classes = raw["classifier.weight"].shape[0] if has_head else None
    model = build_vit(dataclasses.replace(config, num_classes=num_classes))
    D, F, C = config.hidden_dim, config.intermediate_dim, config.num_channels
    N, P = config.num_heads, config.patch_size
    H = D // N
    T = config.num_patches + 1  # patches and the class token
    plan = []  # (layer, [arrays]): everything is checked before any assignment

    def linear(name, n_out, n_in):  # torch (out, in) -> Keras (in, out)
        return tensors.get(name + ".weight", (n_out, n_in)).T, tensors.get(name + ".bias", (n_out,))

    def norm(name):
        return [tensors.get(name + ".weight", (D,)), tensors.get(name + ".bias", (D,))]

    # Conv kernel: torch (D, C, P, P) -> Keras (P, P, C, D).
    patch = "embeddings.patch_embeddings.projection."
    plan.append((model.get_layer("patch_embedding"),
                 [tensors.get(patch + "weight", (D, C, P, P)).transpose(2, 3, 1, 0),
                  tensors.get(patch + "bias", (D,))]))
    plan.append((model.get_layer("class_token"),
                 [tensors.get("embeddings.cls_token", (1, 1, D)).reshape(D)]))
    plan.append((model.get_layer("position_embedding"),
                 [tensors.get("embeddings.position_embeddings", (1, T, D))[0]]))
    for i in range(config.num_layers):
        hf = f"encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")
        attention = block.self_attention
        for name in ("query", "key", "value"):
            kernel, bias = linear(hf + f"attention.attention.{name}", D, D)
            plan.append((_sublayer(attention, name), [kernel.reshape(D, N, H), bias.reshape(N, H)]))
        kernel, bias = linear(hf + "attention.output.dense", D, D)
        plan.append((_sublayer(attention, "attention_output"), [kernel.reshape(N, H, D), bias]))
        plan.append((block.self_attention_layer_norm, norm(hf + "layernorm_before")))
        plan.append((block.feed_forward_layer_norm, norm(hf + "layernorm_after")))
        plan.append((block.feed_forward.intermediate_dense, list(linear(hf + "intermediate.dense", F, D))))
        plan.append((block.feed_forward.output_dense, list(linear(hf + "output.dense", D, F))))
    plan.append((model.get_layer("final_layer_norm"), norm("layernorm")))
    if has_head:
        kernel = tensors.get("classifier.weight", (num_classes, D), prefixed=False).T
        bias = tensors.get("classifier.bias", (num_classes,), prefixed=False)
        plan.append((model.get_layer("classifier"), [kernel, bias]))
    for layer, arrays in plan:
        for variable, array in zip(layer.weights, arrays):
            if len(layer.weights) != len(arrays) or tuple(variable.shape) != array.shape:
                raise ValueError(  # a bug of this converter, not of the file
                    f"Layer {layer.name!r} does not take the arrays laid out for it. "
                    f"Received: shapes={[a.shape for a in arrays]}"
                )
    dropped = tensors.check_all_used(dropped=(prefix + "pooler.", "classifier."))
    if dropped:
        warnings.warn(
            f"{os.path.join(path, 'model.safetensors')}: not loaded (by choice): "
            f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in dropped}))}",
            stacklevel=2,
        )
    for layer, arrays in plan:
        layer.set_weights(arrays)
    return model


def _sublayer(layer, name):
    """The sublayer of `layer` named `name` (the shared attention layer names
    its projections `query`, `key`, `value`, `attention_output`)."""
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")
