"""ModernBERT from and to a Hugging Face `ModernBertModel`,
`ModernBertForMaskedLM` or `ModernBertForSequenceClassification` directory
(`config.json` and `model.safetensors`).

The weights are read and written with NumPy and `safetensors` only (neither
torch nor transformers is needed). Every tensor is checked against the shape
the config implies before any weight is assigned, and every tensor is used
or refused by name: a checkpoint that does not match its config, a config
option the package's ModernBERT does not compute (biases, another rotary
scaling, a layer pattern that is not "global every n-th layer") or a
malformed file is a `ValueError` naming the file and the key, and nothing is
half loaded. The loader and the writer read one table of names
(`_layout`), so the two directions agree.
"""

import os

import numpy as np

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
from keras_attn.convert._checkpoint import transposed
from keras_attn.convert._registry import own_head
from keras_attn.convert._registry import Converter
from keras_attn.convert._registry import load_weights
from keras_attn.convert._registry import register
from keras_attn.convert._registry import write_weights
from keras_attn.models.modernbert import ModernBertConfig
from keras_attn.models.modernbert import ModernBertBackbone
from keras_attn.models.modernbert import ModernBertMaskedLM
from keras_attn.models.modernbert import ModernBertSequenceClassifier
from keras_attn.models.modernbert import build_modernbert

_FILE = "config.json"

# Hugging Face's activation names and keras_attn's for the same function.
_FROM_HF_ACTIVATION = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_approximate": "gelu_pytorch_tanh", "relu": "relu",
                     "silu": "silu"}

# The Hugging Face architectures and the keras_attn model of each.
_ARCHITECTURES = {
    "ModernBertModel": "ModernBertBackbone",
    "ModernBertForMaskedLM": "ModernBertMaskedLM",
    "ModernBertForSequenceClassification": "ModernBertSequenceClassifier",
}
_POOLINGS = ("cls", "mean")

# Options the package's ModernBERT computes with one value only.
_FIXED = {
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "classifier_bias": False,
    "decoder_bias": True,
    "tie_word_embeddings": True,
    "sparse_prediction": False,
}


def _activation(hf_config, key):
    act = hf_config.get(key, "gelu")
    if act not in _FROM_HF_ACTIVATION:
        raise ValueError(
            f"{_FILE}: {key!r} must be one of {sorted(_FROM_HF_ACTIVATION)}. "
            f"Received: {key}={act!r}")
    return _FROM_HF_ACTIVATION[act]


def _global_every(hf_config, num_layers):
    """`global_every` from `layer_types` (transformers 5) or
    `global_attn_every_n_layers` (the released configs)."""
    layer_types = hf_config.get("layer_types")
    if layer_types is None:
        return config_int(hf_config, "global_attn_every_n_layers", _FILE, 3)
    if (not isinstance(layer_types, list) or len(layer_types) != num_layers
            or layer_types[:1] != ["full_attention"]):
        raise ValueError(
            f"{_FILE}: 'layer_types' must list {num_layers} layers, the first "
            f"'full_attention'. Received: layer_types={layer_types!r}")
    every = (layer_types[1:] + ["full_attention"]).index("full_attention") + 1
    expected = ["full_attention" if i % every == 0 else "sliding_attention"
                for i in range(num_layers)]
    if layer_types != expected:
        raise ValueError(
            f"{_FILE}: 'layer_types' must be global attention every n-th layer "
            f"(ModernBERT's pattern). Received: layer_types={layer_types!r}")
    return every


def _rope_theta(hf_config, kind, legacy, default):
    parameters = hf_config.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError(f"{_FILE}: 'rope_parameters' must be an object. "
                         f"Received: rope_parameters={parameters!r}")
    entry = parameters.get(kind)
    if entry is None:
        return config_float(hf_config, legacy, _FILE, default)
    rope_type = entry.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"{_FILE}: only the default rotary embedding is computed. Received: "
            f"rope_parameters[{kind!r}]['rope_type']={rope_type!r}")
    return config_float(entry, "rope_theta", _FILE, default)


def modernbert_config_from_hf(hf_config):
    """A `ModernBertConfig` from the fields of a Hugging Face ModernBERT
    `config.json`: `hf_config` is its dict, or the directory holding it."""
    if isinstance(hf_config, (str, os.PathLike)):
        hf_config = read_config(hf_config)
    for key, value in _FIXED.items():
        if key in hf_config and hf_config[key] != value:
            raise ValueError(
                f"{_FILE}: keras_attn's ModernBERT computes {key}={value} only. "
                f"Received: {key}={hf_config[key]!r}")
    activation = _activation(hf_config, "hidden_activation")
    num_layers = config_int(hf_config, "num_hidden_layers", _FILE)
    pad = hf_config.get("pad_token_id")
    return ModernBertConfig(
        vocabulary_size=config_int(hf_config, "vocab_size", _FILE),
        num_layers=num_layers,
        num_heads=config_int(hf_config, "num_attention_heads", _FILE),
        hidden_dim=config_int(hf_config, "hidden_size", _FILE),
        intermediate_dim=config_int(hf_config, "intermediate_size", _FILE),
        global_every=_global_every(hf_config, num_layers),
        local_window=config_int(hf_config, "local_attention", _FILE, 128),
        global_rope_theta=_rope_theta(hf_config, "full_attention", "global_rope_theta",
                                      160000.0),
        local_rope_theta=_rope_theta(hf_config, "sliding_attention", "local_rope_theta",
                                     10000.0),
        layer_norm_epsilon=config_float(hf_config, "norm_eps", _FILE, 1e-5),
        max_sequence_length=config_int(hf_config, "max_position_embeddings", _FILE, 8192),
        pad_id=0 if pad is None else config_int(hf_config, "pad_token_id", _FILE),
        activation=activation,
        dropout=config_float(hf_config, "embedding_dropout", _FILE, 0.0),
        attention_dropout=config_float(hf_config, "attention_dropout", _FILE, 0.0),
    )


def _backbone_layout(backbone, prefix):
    """The `Entry` of every backbone weight under Hugging Face's names."""
    config = backbone.modernbert_config
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    H = D // N
    entries = []

    def norm(layer, name):
        (gamma,) = layer_weights(layer, 1)
        entries.append(Entry(name + ".weight", (D,), gamma))

    def split_rows(name, rows, n_in, parts):
        """Slices of a fused torch `(rows, n_in)` matrix, one Entry each:
        `parts` is [(variable, first row, last row, to_keras, to_hf)];
        `to_hf` gives the slice's rows, which the writer stacks in order."""
        for variable, start, stop, to_keras, to_hf in parts:
            entries.append(Entry(name, (rows, n_in), variable,
                                 lambda a, s=start, e=stop, f=to_keras: f(a[s:e]), to_hf))

    p = prefix + "embeddings."
    (table,) = layer_weights(backbone.get_layer("token_embedding"), 1)
    entries.append(Entry(p + "tok_embeddings.weight", (config.vocabulary_size, D), table))
    norm(backbone.get_layer("embeddings_layer_norm"), p + "norm")
    for i in range(config.num_layers):
        hf = f"{prefix}layers.{i}."
        block = backbone.get_layer(f"transformer_block_{i}")
        attention = block.self_attention
        heads = [layer_weights(attention.query_dense, 1)[0],
                 layer_weights(attention.key_dense, 1)[0],
                 layer_weights(attention.value_dense, 1)[0]]
        # Wqkv (3D, D): rows [q; k; v], each (D, D) = (N H, D) -> (D, N, H).
        split_rows(hf + "attn.Wqkv.weight", 3 * D, D, [
            (kernel, j * D, (j + 1) * D, lambda a: a.T.reshape(D, N, H),
             lambda a: a.reshape(D, D).T)
            for j, kernel in enumerate(heads)])
        (output,) = layer_weights(attention.output_dense, 1)
        entries.append(Entry(hf + "attn.Wo.weight", (D, D), output,
                             lambda a: a.T.reshape(N, H, D), lambda a: a.reshape(D, D).T))
        if block.self_attention_layer_norm is not None:  # block 0 has none
            norm(block.self_attention_layer_norm, hf + "attn_norm")
        norm(block.feed_forward_layer_norm, hf + "mlp_norm")
        (wi,) = layer_weights(block.feed_forward.intermediate_dense, 1)
        entries.append(Entry(hf + "mlp.Wi.weight", (2 * F, D), wi, transposed, transposed))
        (wo,) = layer_weights(block.feed_forward.output_dense, 1)
        entries.append(Entry(hf + "mlp.Wo.weight", (D, F), wo, transposed, transposed))
    norm(backbone.get_layer("final_layer_norm"), prefix + "final_norm")
    return entries


def _kind(model):
    """The keras_attn class name `_ARCHITECTURES` maps `model` to (a
    subclass is its base's), None for a model of another kind."""
    for kind in (ModernBertBackbone, ModernBertMaskedLM, ModernBertSequenceClassifier):
        if isinstance(model, kind):
            return kind.__name__
    return None


def _layout(model):
    """`(architecture, entries)` of a keras_attn ModernBERT model: the
    backbone's entries and its head's, under Hugging Face's names."""
    kind = _kind(model)
    architectures = {ours: theirs for theirs, ours in _ARCHITECTURES.items()}
    if kind is None:
        raise ValueError(
            "`model` must be a ModernBertBackbone, ModernBertMaskedLM or "
            f"ModernBertSequenceClassifier. Received: model={type(model).__name__}")
    if kind == "ModernBertBackbone":
        return architectures[kind], _backbone_layout(model, "")
    backbone = model.backbone
    config = backbone.modernbert_config
    D = config.hidden_dim
    entries = _backbone_layout(backbone, "model.")

    def head(dense, layer_norm):
        (kernel,) = layer_weights(dense, 1)
        entries.append(Entry("head.dense.weight", (D, D), kernel, transposed, transposed))
        (gamma,) = layer_weights(layer_norm, 1)
        entries.append(Entry("head.norm.weight", (D,), gamma))

    if kind == "ModernBertMaskedLM":
        mlm_head = model.get_layer("mlm_head")
        head(mlm_head.transform_dense, mlm_head.transform_layer_norm)
        entries.append(Entry("decoder.bias", (config.vocabulary_size,),
                             mlm_head.output_bias))
    else:
        head(model.get_layer("head_dense"), model.get_layer("head_layer_norm"))
        kernel, bias = layer_weights(model.get_layer("classifier"), 2)
        entries.append(Entry("classifier.weight", (model.num_classes, D), kernel,
                             transposed, transposed))
        entries.append(Entry("classifier.bias", (model.num_classes,), bias))
    return architectures[kind], entries


def _architecture(hf_config, tensors, path):
    names = hf_config.get("architectures") or []
    if isinstance(names, str):
        names = [names]
    known = [name for name in names if name in _ARCHITECTURES]
    if names and not known:
        raise ValueError(
            f"{os.path.join(path, _FILE)} names architectures {names}; this loader "
            f"reads {sorted(_ARCHITECTURES)}. Received: architectures={names!r}")
    if known:
        return known[0]
    # No `architectures`: the tensors' names tell.
    if "decoder.bias" in tensors:
        return "ModernBertForMaskedLM"
    if "classifier.weight" in tensors:
        return "ModernBertForSequenceClassification"
    return "ModernBertModel"


def _check_head_activation(hf_config, activation):
    """The heads (`ModernBertPredictionHead`, of the masked LM and the
    classifier) apply `classifier_activation`; keras_attn's apply the blocks'
    activation. A `ModernBertModel` has no head: its (default)
    `classifier_activation` is not read."""
    if _activation(hf_config, "classifier_activation") != activation:
        raise ValueError(
            f"{_FILE}: the head's activation must be the blocks' one. Received: "
            f"classifier_activation={hf_config.get('classifier_activation', 'gelu')!r}, "
            f"hidden_activation={hf_config.get('hidden_activation', 'gelu')!r}")


def _check_sizes(config, tensors, path):
    """The config's sizes against the checkpoint's tensors, before the model
    is built (`check_sizes`)."""
    prefix = "model." if any(k.startswith("model.") for k in tensors) else ""
    V, D, F = config.vocabulary_size, config.hidden_dim, config.intermediate_dim
    check_sizes(tensors, path, [
        (prefix + "embeddings.tok_embeddings.weight", (V, D),
         {0: ("vocab_size", V), 1: ("hidden_size", D)}),
        (prefix + "layers.0.mlp.Wo.weight", (D, F),
         {0: ("hidden_size", D), 1: ("intermediate_size", F)}),
    ], [("num_hidden_layers", config.num_layers, prefix + "layers.")])


def _classifier(hf_config, backbone, path):
    file = _FILE
    num_classes, class_names = hf_class_names(hf_config, os.path.join(path, _FILE))
    pooling = hf_config.get("classifier_pooling", "cls")
    if pooling not in _POOLINGS:
        raise ValueError(
            f"{file}: 'classifier_pooling' must be one of {list(_POOLINGS)}. "
            f"Received: classifier_pooling={pooling!r}")
    dropout = config_float(hf_config, "classifier_dropout", file, 0.0)
    return ModernBertSequenceClassifier(backbone, num_classes=num_classes, pooling=pooling,
                                        dropout=dropout, class_names=class_names)


def load_hf_modernbert(path):
    """A keras_attn ModernBERT with the weights of a Hugging Face directory.

    Args:
        path: directory with `config.json` and `model.safetensors` (or its
            shards: `read_safetensors`) of a
            `ModernBertModel`, a `ModernBertForMaskedLM` or a
            `ModernBertForSequenceClassification` (without `architectures`
            in `config.json`, the tensors' names tell).

    Returns:
        A `ModernBertBackbone` (its `sequence_output` equals transformers'
        `last_hidden_state`) for `ModernBertModel`; a `ModernBertMaskedLM`
        for `ModernBertForMaskedLM` and a `ModernBertSequenceClassifier`
        (`num_labels` classes, `classifier_pooling`, `classifier_dropout`;
        `class_names` from `id2label`, None for the defaults `LABEL_i`) for
        `ModernBertForSequenceClassification`, whose logits equal
        transformers'.

    Raises:
        ValueError: a malformed file, a config option the model does not
            compute, a tensor missing or of another shape than `config.json`
            implies, or a tensor the model has no place for (each named;
            nothing is assigned then).
    """
    hf_config = read_config(path)
    config = modernbert_config_from_hf(hf_config)
    tensors = read_safetensors(path)
    architecture = _architecture(hf_config, tensors, path)
    ckpt = Tensors(tensors, path)
    kind = _ARCHITECTURES[architecture]
    if kind != "ModernBertBackbone":
        _check_head_activation(hf_config, config.activation)
    _check_sizes(config, tensors, path)
    backbone = build_modernbert(config)
    if kind == "ModernBertMaskedLM":
        model = ModernBertMaskedLM(backbone)
        if "decoder.weight" in tensors:  # a tied copy: must be the embedding table
            D = config.hidden_dim
            decoder = ckpt.get("decoder.weight", (config.vocabulary_size, D))
            table = ckpt.get("model.embeddings.tok_embeddings.weight",
                             (config.vocabulary_size, D))
            if not np.array_equal(decoder, table):
                raise ValueError(
                    f"{ckpt.file}: tensor 'decoder.weight' differs from the token "
                    "embeddings; keras_attn's ModernBERT ties them. Received: "
                    "an untied decoder")
    elif kind == "ModernBertSequenceClassifier":
        model = _classifier(hf_config, backbone, path)
    else:
        model = backbone
    load_weights(model, _layout(model)[1], ckpt)
    return model


# The special tokens of the released tokenizer; written when the vocabulary
# holds them (the keras_attn model does not know its tokenizer's ids).
_RELEASE_TOKEN_IDS = {"bos_token_id": 50281, "eos_token_id": 50282, "cls_token_id": 50281,
                      "sep_token_id": 50282}


def _to_hf_config(config):
    """The fields of a Hugging Face ModernBERT `config.json` for a
    `ModernBertConfig` (no `architectures`, no head fields), which
    `modernbert_config_from_hf` reads back to `config`."""
    if config.activation not in _TO_HF_ACTIVATION:
        raise ValueError(
            f"transformers' ModernBERT has no activation {config.activation!r}; it takes "
            f"{sorted(_TO_HF_ACTIVATION)} from keras_attn. "
            f"Received: activation={config.activation!r}")
    activation = _TO_HF_ACTIVATION[config.activation]
    hf_config = {
        "model_type": "modernbert",
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "hidden_activation": activation,
        "classifier_activation": activation,
        "layer_types": ["full_attention" if config.is_global(i) else "sliding_attention"
                        for i in range(config.num_layers)],
        "local_attention": config.local_window,
        "rope_parameters": {
            "full_attention": {"rope_type": "default",
                               "rope_theta": config.global_rope_theta},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": config.local_rope_theta},
        },
        "max_position_embeddings": config.max_sequence_length,
        "norm_eps": config.layer_norm_epsilon,
        "pad_token_id": config.pad_id,
        # keras_attn's `dropout` is after the embeddings and on each
        # sublayer's output; transformers' nearest are these two.
        "embedding_dropout": config.dropout,
        "mlp_dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "initializer_range": 0.02,
        "dtype": "float32",
        **_FIXED,
    }
    for key, value in _RELEASE_TOKEN_IDS.items():
        hf_config[key] = value if value < config.vocabulary_size else None
    return hf_config


def save_hf_modernbert(model, directory, overwrite=False, class_names=None):
    """Writes a keras_attn ModernBERT model as a Hugging Face directory.

    `config.json` and `model.safetensors` (float32):
    `transformers.AutoModel...from_pretrained(directory)` loads it with no
    missing or unexpected key, and its outputs equal the Keras model's.

    | keras_attn model | written as |
    |---|---|
    | `ModernBertBackbone` | `ModernBertModel` |
    | `ModernBertMaskedLM` | `ModernBertForMaskedLM` (decoder tied to the embeddings) |
    | `ModernBertSequenceClassifier` | `ModernBertForSequenceClassification` (`num_labels`, `classifier_pooling`, `classifier_dropout`; `id2label` and `label2id` from `class_names`) |

    The tokenizer's special-token ids other than padding (`cls_token_id`,
    ...) are not part of the model: they are written as the release's
    (50281, 50282) when the vocabulary holds them, else null.

    Args:
        model: one of the models above, float (not quantized) and without
            LoRA adapters (`keras_attn.models.merge_lora` folds them in).
        directory: where to write; created, or replaced when `overwrite`.
            Written atomically (a new directory takes its place at the end).
        overwrite: replace an existing non-empty `directory` that holds an
            earlier Hugging Face export (any other directory is refused).
        class_names: the classifier's class names, in output order, written
            as `id2label` (and its inverse `label2id`); default: the
            model's `class_names`, else `LABEL_0`, `LABEL_1`, ...

    Returns:
        The absolute path of `directory`.

    Raises:
        ValueError: another model type, an activation transformers'
            ModernBERT does not have, a quantized or LoRA-adapted layer,
            `class_names` that are not the classifier's (or for a model
            without classes), or an existing non-empty directory without
            `overwrite` (each named; nothing is written then).
    """
    architecture, entries = _layout(model)
    backbone = model if isinstance(model, ModernBertBackbone) else model.backbone
    hf_config = {"architectures": [architecture],
                 **_to_hf_config(backbone.modernbert_config)}
    head = isinstance(model, ModernBertSequenceClassifier)
    hf_config.update(hf_label_fields(model.num_classes if head else None,
                                     model.class_names if head else None, class_names))
    if head:
        hf_config["classifier_pooling"] = model.pooling
        hf_config["classifier_dropout"] = model.dropout
    # A fused tensor (attn.Wqkv) is several entries: `write_weights` stacks them.
    return write_weights(directory, entries, {"config.json": json_text(hf_config)},
                         overwrite=overwrite)


def load_hf_modernbert_classifier(path, num_classes, class_names=None):
    """`load_hf(path, num_classes=...)` for ModernBERT: a
    `ModernBertSequenceClassifier` over the encoder of any ModernBERT
    directory, the checkpoint's own head where it classifies into
    `num_classes`, else a new one (`classifier_pooling`, default "cls", and
    `classifier_dropout`, default 0, of config.json, as transformers'
    `ModernBertForSequenceClassification` reads them)."""
    model = load_hf_modernbert(path)
    if own_head(model, ModernBertSequenceClassifier, path, num_classes, class_names) is not None:
        return model
    backbone = model if isinstance(model, ModernBertBackbone) else model.backbone
    hf_config = dict(read_config(path), num_labels=num_classes, id2label=None)
    head = _classifier(hf_config, backbone, path)
    head.class_names = class_names
    return head


CONVERTER = register(Converter(
    "modernbert", tuple(_ARCHITECTURES), ("modernbert",), load=load_hf_modernbert,
    save=save_hf_modernbert, writes=lambda model: _kind(model) is not None,
    models=tuple(_ARCHITECTURES.values()), classifier=load_hf_modernbert_classifier))
