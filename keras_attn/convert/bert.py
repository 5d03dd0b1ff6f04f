"""BERT from a Hugging Face `BertModel` / `BertForPreTraining` /
`BertFor...` directory, with its WordPiece tokenizer.

The directory holds `config.json`, `model.safetensors` and `vocab.txt`
(`tokenizer_config.json` optional). The weights are read with NumPy and
`safetensors` only (neither torch nor transformers is needed); the tokenizer
is a `keras_hub.tokenizers.WordPieceTokenizer` (TensorFlow), imported only
when asked for.

Every tensor is checked against the shape the config implies before any
weight is assigned, and every tensor is used: a checkpoint that does not
match its config (a tensor of another shape, a layer more or less) or a
malformed file is a `ValueError` naming the file and the tensor or key, and
the model is never left half loaded. The task heads of `BertFor...`
checkpoints (`cls.*`, `classifier.*`, `qa_outputs.*`) are dropped by the
backbone loader, which names them in a warning.
"""

import json
import os
import warnings

from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
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
    file = "config.json"
    return BertConfig(
        vocabulary_size=config_int(hf_config, "vocab_size", file),
        num_layers=config_int(hf_config, "num_hidden_layers", file),
        num_heads=config_int(hf_config, "num_attention_heads", file),
        hidden_dim=config_int(hf_config, "hidden_size", file),
        intermediate_dim=config_int(hf_config, "intermediate_size", file),
        dropout=config_float(hf_config, "hidden_dropout_prob", file, 0.1),
        attention_dropout=config_float(hf_config, "attention_probs_dropout_prob", file, 0.1),
        max_sequence_length=config_int(hf_config, "max_position_embeddings", file, 512),
        num_segments=config_int(hf_config, "type_vocab_size", file, 2),
        layer_norm_epsilon=config_float(hf_config, "layer_norm_eps", file, 1e-12),
    )


# Task heads of BertFor* checkpoints, which a backbone has no place for, and
# buffers that hold no weight.
HEADS = ("cls.", "classifier.", "qa_outputs.")
BUFFERS = ("bert.embeddings.position_ids", "embeddings.position_ids",
           "bert.embeddings.token_type_ids", "embeddings.token_type_ids")


class _Checkpoint(Tensors):
    """`Tensors` with BERT's names: the "bert." prefix of BertFor* models,
    and the TF-converted LayerNorm names."""

    def __init__(self, tensors, path):
        prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
        super().__init__(tensors, path, prefix)

    def get(self, name, shape):
        key = self.prefix + name
        if key not in self.tensors:
            # Checkpoints converted from TensorFlow name LayerNorm gamma / beta.
            legacy = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
            if self.prefix + legacy in self.tensors:
                name = legacy
        return super().get(name, shape)


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


def load_hf_bert_backbone(path, drop_heads=True):
    """A `BertBackbone` with the weights of a Hugging Face BERT directory.

    Args:
        path: directory with `config.json` and `model.safetensors`.
        drop_heads: skip the task heads of a `BertFor...` checkpoint
            (`cls.*`, `classifier.*`, `qa_outputs.*`), naming them in a
            warning; False makes their presence an error.

    Returns:
        The `BertBackbone`; its `sequence_output` equals Hugging Face's
        `last_hidden_state` and `pooled_output` its `pooler_output`.

    Raises:
        ValueError: a malformed file, a tensor missing or of another shape
            than `config.json` implies, or a tensor the model has no place
            for (nothing is assigned then).
    """
    config = bert_config_from_hf(read_config(path))
    ckpt = _Checkpoint(read_safetensors(path), path)
    model = build_bert(config)
    plan = _weight_plan(model, config, ckpt)  # raises before anything is assigned
    dropped = ckpt.check_all_used(BUFFERS, HEADS if drop_heads else ())
    if dropped:
        heads = sorted({".".join(k.split(".")[:2]) for k in dropped})
        warnings.warn(
            f"{os.path.join(path, 'model.safetensors')}: {len(dropped)} tensor(s) of "
            f"task heads not loaded into the backbone: {', '.join(heads)}",
            stacklevel=2,
        )
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
        if os.path.exists(os.path.join(path, name)):
            value = _read_json_object(path, name).get("do_lower_case")
            if value is not None:
                return bool(value)
    plain = [t for t in vocabulary if not (t.startswith("[") and t.endswith("]"))]
    return not any(ch.isupper() for token in plain for ch in token)


def _read_json_object(path, name):
    file = os.path.join(path, name)
    try:
        with open(file, encoding="utf-8") as stream:
            value = json.load(stream)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{file} is not valid JSON ({error}). Received: path={path!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {type(value).__name__}")
    return value


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
