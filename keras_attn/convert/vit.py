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

    def set_layer(name, *weights):
        layer = model.get_layer(name)
        expected = [tuple(w.shape) for w in layer.weights]
        got = [tuple(w.shape) for w in weights]
        if expected != got:
            raise ValueError(
                f"Shapes of {name!r} do not match: the model has {expected}. "
                f"Received: shapes={got}"
            )
        layer.set_weights(list(weights))

    heads, width = config.num_heads, config.hidden_dim
    head_dim = width // heads

    # Conv kernel: torch (D, C, P, P) -> Keras (P, P, C, D).
    set_layer(
        "patch_embedding",
        get("embeddings.patch_embeddings.projection.weight").transpose(2, 3, 1, 0),
        get("embeddings.patch_embeddings.projection.bias"),
    )
    set_layer("class_token", get("embeddings.cls_token").reshape(width))
    set_layer("position_embedding", get("embeddings.position_embeddings")[0])
    for i in range(config.num_layers):
        hf = f"encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")

        def linear(name):  # torch (out, in) -> Keras (in, out)
            return get(hf + name + ".weight").T, get(hf + name + ".bias")

        attention = block.self_attention
        for name in ("query", "key", "value"):
            kernel, bias = linear(f"attention.attention.{name}")
            _sublayer(attention, name).set_weights(
                [kernel.reshape(width, heads, head_dim), bias.reshape(heads, head_dim)]
            )
        kernel, bias = linear("attention.output.dense")
        _sublayer(attention, "attention_output").set_weights(
            [kernel.reshape(heads, head_dim, width), bias]
        )
        block.self_attention_layer_norm.set_weights(
            [get(hf + "layernorm_before.weight"), get(hf + "layernorm_before.bias")]
        )
        block.feed_forward.intermediate_dense.set_weights(list(linear("intermediate.dense")))
        block.feed_forward.output_dense.set_weights(list(linear("output.dense")))
        block.feed_forward_layer_norm.set_weights(
            [get(hf + "layernorm_after.weight"), get(hf + "layernorm_after.bias")]
        )
    set_layer("final_layer_norm", get("layernorm.weight"), get("layernorm.bias"))
    if has_head:
        set_layer(
            "classifier",
            tensors["classifier.weight"].T,
            tensors["classifier.bias"],
        )
    return model


def _sublayer(layer, name):
    """The sublayer of `layer` named `name` (the shared attention layer names
    its projections `query`, `key`, `value`, `attention_output`)."""
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")
