"""A translation model from a Hugging Face `MarianMTModel` directory (the
opus-mt checkpoints): the paper's base Transformer with a few differences,
which `TransformerConfig` expresses:

| Marian | keras_attn `TransformerConfig` |
|---|---|
| sinusoids laid out as all sines, then all cosines | `sinusoid_layout="concatenated"` |
| `activation_function` (`"swish"` in opus-mt) | `activation="silu"` (and gelu, gelu_new, relu) |
| `final_logits_bias` on the tied logits | `output_bias=True` |
| the decoder starts from the pad id | the first target position is never masked |
| LayerNorm epsilon 1e-5 | `layer_norm_epsilon=1e-5` |

Beam search as Hugging Face's `generate` does it: `transformer_beam_search(
..., alpha=length_penalty, length_penalty="hf")` (see `beam_search`).

The directory holds `config.json` and `model.safetensors` (what
`save_pretrained` writes), and for the tokenizer `source.spm`, `target.spm`
(SentencePiece models) and `vocab.json` (piece -> id, shared by both sides).
Weights are read with NumPy and `safetensors`; every tensor must have the
shape the config implies and every tensor must be used, before any weight is
assigned (a `ValueError` naming the file and the tensor otherwise).
"""

import json
import os

from keras_attn.convert._checkpoint import Entry
from keras_attn.convert._checkpoint import Tensors
from keras_attn.convert._checkpoint import check_sizes
from keras_attn.convert._checkpoint import config_float
from keras_attn.convert._checkpoint import config_int
from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._checkpoint import read_safetensors
from keras_attn.convert._checkpoint import transposed
from keras_attn.convert._registry import Converter
from keras_attn.convert._registry import load_weights
from keras_attn.convert._registry import register

_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "gelu_new": "gelu_approximate",
                "gelu_pytorch_tanh": "gelu_approximate", "relu": "relu"}
_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian keeps


def transformer_config_from_marian(hf_config):
    """`(TransformerConfig, start_id, end_id)` from the fields of a Marian
    `config.json`; a setting the Transformer cannot express is a
    `ValueError` naming it."""
    from keras_attn.models.transformer import TransformerConfig

    file = "config.json"

    def same(key_a, key_b):
        a, b = config_int(hf_config, key_a, file), config_int(hf_config, key_b, file)
        if a != b:
            raise ValueError(f"{file}: keras_attn's Transformer has one {key_a.split('_', 1)[1]} "
                             f"for both stacks. Received: {key_a}={a}, {key_b}={b}")
        return a

    activation = hf_config.get("activation_function", "gelu")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{file}: 'activation_function' must be one of {sorted(_ACTIVATIONS)}. "
                         f"Received: activation_function={activation!r}")
    for key, wanted in (("scale_embedding", True), ("share_encoder_decoder_embeddings", True),
                        ("tie_word_embeddings", True)):
        value = hf_config.get(key, wanted if key != "scale_embedding" else False)
        if value is not wanted:
            raise ValueError(
                f"{file}: keras_attn's Transformer needs {key}={wanted} (one vocabulary, "
                f"embeddings scaled by sqrt(d_model) and tied to the logits). "
                f"Received: {key}={value!r}"
            )
    vocabulary = config_int(hf_config, "vocab_size", file)
    decoder_vocabulary = hf_config.get("decoder_vocab_size") or vocabulary
    if decoder_vocabulary != vocabulary:
        raise ValueError(f"{file}: the decoder vocabulary must be the shared one. Received: "
                         f"decoder_vocab_size={decoder_vocabulary}, vocab_size={vocabulary}")
    pad_id = config_int(hf_config, "pad_token_id", file)
    config = TransformerConfig(
        vocabulary_size=vocabulary,
        hidden_dim=config_int(hf_config, "d_model", file),
        intermediate_dim=same("encoder_ffn_dim", "decoder_ffn_dim"),
        num_heads=same("encoder_attention_heads", "decoder_attention_heads"),
        num_encoder_layers=config_int(hf_config, "encoder_layers", file),
        num_decoder_layers=config_int(hf_config, "decoder_layers", file),
        dropout=config_float(hf_config, "dropout", file, 0.1),
        attention_dropout=config_float(hf_config, "attention_dropout", file, 0.0),
        activation_dropout=config_float(hf_config, "activation_dropout", file, 0.0),
        activation=_ACTIVATIONS[activation],
        norm_position="post",
        position_embedding="sinusoidal",
        sinusoid_layout="concatenated",
        max_sequence_length=config_int(hf_config, "max_position_embeddings", file, 512),
        layer_norm_epsilon=_LAYER_NORM_EPSILON,
        pad_id=pad_id,
        output_bias=True,
    )
    start_id = config_int(hf_config, "decoder_start_token_id", file, pad_id)
    end_id = config_int(hf_config, "eos_token_id", file)
    return config, start_id, end_id


def _layout(model, config):
    """The `Entry` of every weight of `model` (a `Transformer`) under
    Marian's names: the encoder's and decoder's blocks, and the shared
    embedding table with its logits bias."""
    D, F, N = config.hidden_dim, config.intermediate_dim, config.num_heads
    H = D // N
    variables = {w.path: w for w in model.weights}
    entries = []

    def put(path, name, shape, to_keras=None):
        if path not in variables:  # a bug of this converter, not of the file
            raise ValueError(f"The model has no weight {path!r}. Received: {name!r}")
        entries.append(Entry(name, shape, variables[path], to_keras))

    def attention(ours, hf):
        for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            put(f"{ours}/{name}/kernel", f"{hf}.{proj}.weight", (D, D),
                lambda a: a.T.reshape(D, N, H))
            put(f"{ours}/{name}/bias", f"{hf}.{proj}.bias", (D,), lambda a: a.reshape(N, H))
        put(f"{ours}/attention_output/kernel", f"{hf}.out_proj.weight", (D, D),
            lambda a: a.T.reshape(N, H, D))
        put(f"{ours}/attention_output/bias", f"{hf}.out_proj.bias", (D,))

    def norm(ours, hf):
        put(f"{ours}/gamma", f"{hf}.weight", (D,))
        put(f"{ours}/beta", f"{hf}.bias", (D,))

    def feed_forward(ours, hf):
        put(f"{ours}/feed_forward/intermediate_dense/kernel", f"{hf}.fc1.weight", (F, D),
            transposed)
        put(f"{ours}/feed_forward/intermediate_dense/bias", f"{hf}.fc1.bias", (F,))
        put(f"{ours}/feed_forward/output_dense/kernel", f"{hf}.fc2.weight", (D, F), transposed)
        put(f"{ours}/feed_forward/output_dense/bias", f"{hf}.fc2.bias", (D,))
        norm(f"{ours}/feed_forward_layer_norm", f"{hf}.final_layer_norm")

    V = config.vocabulary_size
    put("token_embedding/embeddings", "model.shared.weight", (V, D))
    put("token_embedding/logits_bias", "final_logits_bias", (1, V), lambda a: a[0])
    for i in range(config.num_encoder_layers):
        ours, hf = f"encoder_block_{i}", f"model.encoder.layers.{i}"
        attention(f"{ours}/self_attention", f"{hf}.self_attn")
        norm(f"{ours}/self_attention_layer_norm", f"{hf}.self_attn_layer_norm")
        feed_forward(ours, hf)
    for i in range(config.num_decoder_layers):
        ours, hf = f"decoder_block_{i}", f"model.decoder.layers.{i}"
        attention(f"{ours}/self_attention", f"{hf}.self_attn")
        norm(f"{ours}/self_attention_layer_norm", f"{hf}.self_attn_layer_norm")
        attention(f"{ours}/cross_attention", f"{hf}.encoder_attn")
        norm(f"{ours}/cross_attention_layer_norm", f"{hf}.encoder_attn_layer_norm")
        feed_forward(ours, hf)
    return entries


# Tensors that hold no weight of their own: the embedding tables and the
# output projection tied to `model.shared`, and the sinusoids (computed here;
# checked when a checkpoint carries them).
_TIED = ("model.encoder.embed_tokens.", "model.decoder.embed_tokens.", "lm_head.")
_SINUSOIDS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def _check_sizes(config, tensors, path):
    """The config's sizes against the checkpoint's tensors, before the model
    is built (`check_sizes`)."""
    V, D, F = config.vocabulary_size, config.hidden_dim, config.intermediate_dim
    d_model = ("d_model", D)
    sizes = [("model.shared.weight", (V, D), {0: ("vocab_size", V), 1: d_model})]
    for stack in ("encoder", "decoder"):
        sizes.append((f"model.{stack}.layers.0.fc1.weight", (F, D),
                      {0: (f"{stack}_ffn_dim", F), 1: d_model}))
    for name in _SINUSOIDS:
        sizes.append((name, (config.max_sequence_length, D),
                      {0: ("max_position_embeddings", config.max_sequence_length), 1: d_model}))
    check_sizes(tensors, path, sizes, [
        ("encoder_layers", config.num_encoder_layers, "model.encoder.layers."),
        ("decoder_layers", config.num_decoder_layers, "model.decoder.layers.")],
        optional=_SINUSOIDS)  # computed: a checkpoint may leave them out


def _check_sinusoids(tensors, config):
    """A checkpoint that stores its position table must hold the sinusoids
    the model computes (anything else would be ignored silently)."""
    import numpy as np
    from keras import ops

    from keras_attn.layers.sinusoidal_positional_encoding import sinusoidal_positional_encoding

    for name in _SINUSOIDS:
        if name not in tensors.tensors:
            continue
        tensors.check_finite(name)
        stored = tensors.tensors[name]
        expected = ops.convert_to_numpy(sinusoidal_positional_encoding(
            stored.shape[0], config.hidden_dim, layout="concatenated"))
        if stored.shape != expected.shape or not np.allclose(stored, expected, atol=1e-4):
            raise ValueError(
                f"{tensors.file_of(name)}: {name!r} is not the sinusoid table Marian computes "
                "(sines, then cosines): a model with learned or other positions cannot be loaded "
                f"as a Marian model. Received: {name}.shape={tuple(stored.shape)}"
            )
        tensors.used.add(name)


def load_hf_marian(path, tokenizer=True):
    """A `Transformer` (and its tokenizer) from a Hugging Face Marian
    directory.

    Args:
        path: a `MarianMTModel` directory: `config.json`,
            `model.safetensors` (or its shards: `read_safetensors`), and
            for the tokenizer `source.spm`,
            `target.spm` and `vocab.json`.
        tokenizer: also load the `MarianTokenizer`; False returns the model
            alone.

    Returns:
        `(model, tokenizer)`, or the model alone. The model's logits equal
        `MarianMTModel`'s; translate with `tokenizer.translate(model, texts)`
        or with `transformer_beam_search(model, ids, tokenizer.start_id,
        tokenizer.end_id, alpha=..., length_penalty="hf")`.

    Raises:
        ValueError: a malformed file, a setting keras_attn's Transformer
            cannot express, a tensor missing, of another shape, or left
            over (nothing is assigned then).
    """
    from keras_attn.models.transformer import Transformer
    import dataclasses

    hf_config = read_config(path)
    if hf_config.get("model_type", "marian") != "marian":
        raise ValueError(f"{os.path.join(path, 'config.json')} is not a Marian model. "
                         f"Received: model_type={hf_config.get('model_type')!r}")
    config, start_id, end_id = transformer_config_from_marian(hf_config)
    tensors = Tensors(read_safetensors(path), path)
    _check_sizes(config, tensors.tensors, path)
    model = Transformer(**dataclasses.asdict(config))
    _check_sinusoids(tensors, config)
    load_weights(model, _layout(model, config), tensors, ignored=_TIED)
    if not tokenizer:
        return model
    return model, MarianTokenizer(path, start_id=start_id, end_id=end_id, pad_id=config.pad_id,
                                  vocabulary_size=config.vocabulary_size)


def _check_vocabulary(vocabulary, file, size):
    """The vocabulary's size, once `vocabulary` ({piece: id}) is checked:
    ids distinct and not negative, and with `size`, exactly the ids
    0 .. size - 1 (`ValueError` naming `file` otherwise)."""
    owners = {}
    for piece, i in vocabulary.items():
        owners.setdefault(i, []).append(piece)
    shared = {i: pieces for i, pieces in owners.items() if len(pieces) > 1}
    if shared:
        i = min(shared)
        raise ValueError(f"{file} gives one id to several pieces ({len(shared)} id(s) shared, "
                         f"e.g. {i} to {shared[i][:4]}). Received: {len(vocabulary)} pieces")
    given = size is not None
    if not given:
        size = max(owners, default=-1) + 1
    outside = sorted(i for i in owners if not 0 <= i < size)
    if outside:
        raise ValueError(f"{file} has ids outside the model's vocabulary [0, {size}): "
                         f"{outside[:8]}{' ...' if len(outside) > 8 else ''}. Received: "
                         f"{len(outside)} id(s) outside, vocab_size={size}")
    if given and len(vocabulary) != size:
        raise ValueError(f"{file} has {len(vocabulary)} pieces; the model's vocabulary "
                         f"(config.json vocab_size) has {size}. Received: "
                         f"len(vocab.json)={len(vocabulary)}, vocab_size={size}")
    return size


def _invalid_id_message(i, position, size):
    reason = (" (-2 is what the searches give a sentence they could not translate: a source "
              "id outside the model's vocabulary, or NaN weights)" if i == -2 else "")
    return (f"Token {i} at position {position} is not an id of vocab.json, which has the ids "
            f"[0, {size}){reason}. Received: ids[{position}]={i}")


def _load_sentencepiece(sentencepiece, file, path):
    """The SentencePiece model of `file`; `ValueError` naming the file when
    it is not one (sentencepiece raises a `RuntimeError` naming neither the
    tokenizer nor the directory: "could not parse ModelProto", or "unk is
    not defined" for an empty file)."""
    try:
        return sentencepiece.SentencePieceProcessor(model_file=file)
    except (RuntimeError, OSError) as error:
        size = os.path.getsize(file) if os.path.isfile(file) else None
        raise ValueError(
            f"{file} is not a SentencePiece model (sentencepiece: {error}); Marian's "
            f"tokenizer needs the source.spm and target.spm that `save_pretrained` writes. "
            f"Received: path={path!r}, {os.path.basename(file)} of {size} bytes") from None


class MarianTokenizer:
    """Marian's tokenization with the `sentencepiece` package: the source
    SentencePiece model cuts a text into pieces, `vocab.json` maps them to
    ids, and `</s>` ends the sentence; decoding maps ids back to pieces and
    joins them with the target model. A leading language token
    (`>>fra<<`, multilingual opus-mt models) is kept as one token. Gives the
    ids of `transformers.MarianTokenizer` (tested) when `sacremoses` is not
    installed; with it, transformers first normalises punctuation the Moses
    way, which this tokenizer does not (texts with unusual quotes or dashes
    can then get other ids).

    Written by hand because keras-hub's `SentencePieceTokenizer` gives the
    SentencePiece model's own ids, and Marian's ids are those of
    `vocab.json`.

    Args:
        path: directory with `source.spm`, `target.spm` and `vocab.json`.
        start_id, end_id, pad_id: the decoder's start token, `</s>` and the
            padding id (from `config.json`, as `load_hf_marian` reads them).
        vocabulary_size: the model's `vocab_size` (`config.json`):
            `vocab.json` must then map exactly that many pieces to the ids
            0 .. vocabulary_size - 1, each id once. None checks only that
            the ids are distinct and not negative.

    Raises:
        ValueError: a file missing or malformed (a `source.spm` or
            `target.spm` that is not a SentencePiece model); a `vocab.json` of another
            size than the model's vocabulary, with an id outside it, or an
            id given to two pieces; a special id that no piece has.
    """

    def __init__(self, path, start_id, end_id, pad_id, vocabulary_size=None):
        import sentencepiece

        files = {name: os.path.join(path, name) for name in ("source.spm", "target.spm",
                                                               "vocab.json")}
        for name, file in files.items():
            if not os.path.exists(file):
                raise ValueError(f"{file} does not exist (Marian's tokenizer needs source.spm, "
                                 f"target.spm and vocab.json). Received: path={path!r}")
        try:
            with open(files["vocab.json"], encoding="utf-8") as stream:
                self.vocabulary = json.load(stream)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{files['vocab.json']} is not valid JSON ({error}). "
                             f"Received: path={path!r}") from None
        if not isinstance(self.vocabulary, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in self.vocabulary.values()):
            raise ValueError(f"{files['vocab.json']} must map pieces to integer ids. "
                             f"Received: {type(self.vocabulary).__name__}")
        self.vocabulary_size = _check_vocabulary(self.vocabulary, files["vocab.json"],
                                                 vocabulary_size)
        self.pieces = {i: piece for piece, i in self.vocabulary.items()}
        self.source_path, self.target_path = files["source.spm"], files["target.spm"]
        self.source = _load_sentencepiece(sentencepiece, files["source.spm"], path)
        self.target = _load_sentencepiece(sentencepiece, files["target.spm"], path)
        self.start_id, self.end_id, self.pad_id = int(start_id), int(end_id), int(pad_id)
        if "<unk>" not in self.vocabulary:
            raise ValueError(f"{files['vocab.json']} has no '<unk>'. Received: "
                             f"{len(self.vocabulary)} pieces")
        self.unknown_id = self.vocabulary["<unk>"]
        for name, value in (("start_id", self.start_id), ("end_id", self.end_id),
                            ("pad_id", self.pad_id)):
            if value not in self.pieces:
                raise ValueError(f"{files['vocab.json']} has no piece of id {value} "
                                 f"(`{name}`). Received: {name}={value}")

    def encode(self, text):
        """The source ids of one text, `</s>` included (a list of ints)."""
        code = []
        end = text.find("<<") if text.startswith(">>") else -1
        if end != -1:
            code, text = [text[:end + 2]], text[end + 2:]
        pieces = code + self.source.encode(text, out_type=str)
        return [self.vocabulary.get(piece, self.unknown_id) for piece in pieces] + [self.end_id]

    def __call__(self, texts):
        """`(B, S)` int32 source ids of `texts`, padded with the pad id."""
        import numpy as np

        rows = [self.encode(text) for text in texts]
        ids = np.full((len(rows), max(len(row) for row in rows)), self.pad_id, "int32")
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        return ids

    def decode(self, ids):
        """The text of one row of target ids, up to `</s>`; the special
        tokens (pad, start, `<unk>`) are dropped, as
        `transformers.MarianTokenizer.decode(ids, skip_special_tokens=True)`
        drops them. An id that is no piece of `vocab.json` (the -2 that the
        searches give a sentence they could not translate, or any id outside
        the vocabulary) is a `ValueError`, never text."""
        pieces = []
        for position, i in enumerate(ids):
            i = int(i)
            if i not in self.pieces:
                raise ValueError(_invalid_id_message(i, position, self.vocabulary_size))
            if i == self.end_id:
                break
            if i in (self.pad_id, self.start_id, self.unknown_id):
                continue
            pieces.append(self.pieces[i])
        return self.target.decode_pieces(pieces).replace("\u2581", " ").strip()

    def translate(self, model, texts, beam_width=4, alpha=1.0, max_length=None):
        """Translations of `texts` with `model` (Hugging Face's beam search:
        `generate(num_beams=beam_width, length_penalty=alpha)`)."""
        from keras import ops

        from keras_attn.models.transformer import transformer_beam_search

        tokens, _ = transformer_beam_search(
            model, self(texts), self.start_id, self.end_id, beam_width=beam_width,
            alpha=alpha, max_length=max_length, length_penalty="hf")
        tokens = ops.convert_to_numpy(tokens)
        failed = [index for index, row in enumerate(tokens)
                  if any(int(i) not in self.pieces for i in row)]
        if failed:
            unknown = sorted({int(i) for i in tokens[failed].ravel()} - set(self.pieces))
            raise ValueError(
                f"The beam search could not translate texts {failed}: it gave them ids that "
                f"are no piece of vocab.json ({unknown}; -2 marks a sentence whose encoder "
                f"output is not finite: a source id outside the model's vocabulary, or NaN "
                f"weights). Received: texts={[texts[i] for i in failed]!r}"
            )
        return [self.decode(row) for row in tokens]


def _load_model(directory):
    """`load_hf`'s: the model without its tokenizer (`MarianTokenizer(directory)`)."""
    return load_hf_marian(directory, tokenizer=False)


# Read only: keras_attn writes no Marian directory (save_hf refuses a Transformer).
CONVERTER = register(Converter("marian", ("MarianMTModel",), ("marian",), load=_load_model))
