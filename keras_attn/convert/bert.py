"""BERT from a Hugging Face `BertModel` / `BertForPreTraining` /
`BertFor...` directory, with its WordPiece tokenizer.

The directory holds `config.json`, `model.safetensors` and `vocab.txt`
(`tokenizer_config.json` optional). The weights are read with NumPy and
`safetensors` only (neither torch nor transformers is needed); the tokenizer
is a `keras_hub.tokenizers.WordPieceTokenizer` (TensorFlow), imported only
when asked for.

Every tensor is checked against the shape the config implies before any
weight is assigned: a checkpoint that does not match its config is a
`ValueError` naming the tensor, and the model is never left half loaded.
"""

import json
import os


from keras_attn.models.bert import BertConfig
from keras_attn.models.bert import build_bert


def bert_config_from_hf(hf_config):
    """A `BertConfig` from the fields of a Hugging Face BERT `config.json`."""
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(
            "Only the exact (erf) GELU of the reference BERT is supported. "
            f"Received: hidden_act={act!r}"
        )
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            "Only absolute (learned) position embeddings are supported. "
            f"Received: position_embedding_type={position!r}"
        )
    return BertConfig(
        vocabulary_size=int(hf_config["vocab_size"]),
        num_layers=int(hf_config["num_hidden_layers"]),
        num_heads=int(hf_config["num_attention_heads"]),
        hidden_dim=int(hf_config["hidden_size"]),
        intermediate_dim=int(hf_config["intermediate_size"]),
        dropout=float(hf_config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(hf_config.get("attention_probs_dropout_prob", 0.1)),
        max_sequence_length=int(hf_config.get("max_position_embeddings", 512)),
        num_segments=int(hf_config.get("type_vocab_size", 2)),
        layer_norm_epsilon=float(hf_config.get("layer_norm_eps", 1e-12)),
    )


class _Checkpoint:
    """Tensor look-up with the shape check and the naming of errors."""

    def __init__(self, tensors, path):
        self.tensors = tensors
        self.path = path
        # BertFor* models prefix the encoder with "bert.".
        self.prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""

    def get(self, name, shape):
        key = self.prefix + name
        if key not in self.tensors:
            # Checkpoints converted from TensorFlow name LayerNorm gamma / beta.
            legacy = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
            if legacy not in self.tensors:
                raise ValueError(
                    f"The checkpoint has no tensor {key!r}. Received: path={self.path!r}"
                )
            key = legacy
        value = self.tensors[key]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"Tensor {key!r} has shape {tuple(value.shape)} but the config "
                f"(config.json) implies {tuple(shape)}. Received: "
                f"{key}.shape={tuple(value.shape)}"
            )
        return value.astype("float32")


def _weight_plan(model, config, ckpt):
    """[(variable, array)] for every weight of the backbone, all checked."""
    D, F = config.hidden_dim, config.intermediate_dim
    N = config.num_heads
    H = D // N
    plan = []

    def add(layer, *arrays):
        weights = layer.weights
        if len(weights) != len(arrays):
            raise ValueError(
                f"Layer {layer.name!r} has {len(weights)} weights. "
                f"Received: arrays={len(arrays)}"
            )
        for variable, array in zip(weights, arrays):
            if tuple(variable.shape) != tuple(array.shape):
                raise ValueError(
                    f"Weight {variable.path!r} has shape {tuple(variable.shape)}. "
                    f"Received: shape={tuple(array.shape)}"
                )
            plan.append((variable, array))

    def linear(name, n_out, n_in):  # torch (out, in) -> Keras (in, out)
        return ckpt.get(name + ".weight", (n_out, n_in)).T, ckpt.get(name + ".bias", (n_out,))

    def norm(name):
        return ckpt.get(name + ".weight", (D,)), ckpt.get(name + ".bias", (D,))

    add(model.get_layer("token_embedding"),
        ckpt.get("embeddings.word_embeddings.weight", (config.vocabulary_size, D)))
    add(model.get_layer("segment_embedding"),
        ckpt.get("embeddings.token_type_embeddings.weight", (config.num_segments, D)))
    add(model.get_layer("position_embedding"),
        ckpt.get("embeddings.position_embeddings.weight", (config.max_sequence_length, D)))
    add(model.get_layer("embeddings_layer_norm"), *norm("embeddings.LayerNorm"))
    for i in range(config.num_layers):
        hf = f"encoder.layer.{i}."
        block = model.get_layer(f"transformer_block_{i}")
        attention = block.self_attention
        for name in ("query", "key", "value"):
            kernel, bias = linear(hf + f"attention.self.{name}", D, D)
            add(_sublayer(attention, name), kernel.reshape(D, N, H), bias.reshape(N, H))
        kernel, bias = linear(hf + "attention.output.dense", D, D)
        add(_sublayer(attention, "attention_output"), kernel.reshape(N, H, D), bias)
        add(block.self_attention_layer_norm, *norm(hf + "attention.output.LayerNorm"))
        add(block.feed_forward.intermediate_dense, *linear(hf + "intermediate.dense", F, D))
        add(block.feed_forward.output_dense, *linear(hf + "output.dense", D, F))
        add(block.feed_forward_layer_norm, *norm(hf + "output.LayerNorm"))
    add(model.get_layer("pooled_dense"), *linear("pooler.dense", D, D))

    covered = {id(variable) for variable, _ in plan}
    missing = [w.path for w in model.weights if id(w) not in covered]
    if missing:
        raise ValueError(f"Weights without a tensor. Received: missing={missing}")
    return plan


def load_hf_bert_backbone(path):
    """A `BertBackbone` with the weights of a Hugging Face BERT directory.

    Args:
        path: directory with `config.json` and `model.safetensors`.

    Returns:
        The `BertBackbone`; its `sequence_output` equals Hugging Face's
        `last_hidden_state` and `pooled_output` its `pooler_output`.
    """
    from safetensors.numpy import load_file

    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    config = bert_config_from_hf(hf_config)
    ckpt = _Checkpoint(load_file(os.path.join(path, "model.safetensors")), path)
    model = build_bert(config)
    plan = _weight_plan(model, config, ckpt)  # raises before anything is assigned
    for variable, array in plan:
        variable.assign(array)
    return model


def load_hf_bert_tokenizer(path, sequence_length=None, lowercase=None):
    """The WordPiece tokenizer of a Hugging Face BERT directory.

    Args:
        path: directory with `vocab.txt` (and optionally
            `tokenizer_config.json`).
        sequence_length: pad / truncate the token ids to this length; None
            gives ragged ids.
        lowercase: None reads `do_lower_case` from `tokenizer_config.json`
            (then `config.json`); without either, a vocabulary with no
            upper-case letter means an uncased model.

    Returns:
        A `keras_hub.tokenizers.WordPieceTokenizer` (accents are stripped
        when lower-casing, as BERT's uncased tokenizer does).
    """
    import keras_hub

    with open(os.path.join(path, "vocab.txt"), encoding="utf-8") as f:
        vocabulary = [line.rstrip("\n") for line in f if line.rstrip("\n")]
    if lowercase is None:
        lowercase = _read_lowercase(path, vocabulary)
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary,
        sequence_length=sequence_length,
        lowercase=lowercase,
        strip_accents=lowercase,
    )


def _read_lowercase(path, vocabulary):
    for name in ("tokenizer_config.json", "config.json"):
        file = os.path.join(path, name)
        if os.path.exists(file):
            with open(file) as f:
                value = json.load(f).get("do_lower_case")
            if value is not None:
                return bool(value)
    plain = [t for t in vocabulary if not (t.startswith("[") and t.endswith("]"))]
    return not any(ch.isupper() for token in plain for ch in token)


def load_hf_bert(path, sequence_length=None):
    """`(backbone, tokenizer)` from a Hugging Face BERT directory; see
    `load_hf_bert_backbone` and `load_hf_bert_tokenizer`."""
    return load_hf_bert_backbone(path), load_hf_bert_tokenizer(path, sequence_length)


def _sublayer(layer, name):
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        if sub.name == name:
            return sub
    raise ValueError(f"{layer.name!r} has no sublayer {name!r}. Received: name={name!r}")


__all__ = [
    "bert_config_from_hf",
    "load_hf_bert",
    "load_hf_bert_backbone",
    "load_hf_bert_tokenizer",
]
