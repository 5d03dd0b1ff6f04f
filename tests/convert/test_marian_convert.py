"""Marian (opus-mt) directories into the Transformer: the same encoder
output and logits as transformers' MarianMTModel, the same greedy and beam
tokens and scores as `generate`, the same ids as its tokenizer, on two
random non-default configurations saved with `save_pretrained`."""

import json
import os

import numpy as np
import pytest

from keras_attn.convert.marian import load_hf_marian
from keras_attn.models.transformer import transformer_beam_search
from keras_attn.models.transformer import transformer_greedy_search
from test_case import to_numpy

CORPUS = [
    "the cat sat on the mat", "a dog ran in the park", "we read books at night",
    "the sun is warm today", "my friend likes green tea", "birds sing in the morning",
    "le chat est sur le tapis", "un chien court dans le parc", "nous lisons la nuit",
]
TEXTS = ["the cat sat in the park", ">>fra<< le chien", "we like tea at night", "birds sing",
         "my friend reads books in the morning", "un chat", "the sun is green", "dog"]
# Random models repeat one token; weights drawn larger than transformers' init
# and an end-token bias make hypotheses of different lengths and beams that
# differ from greedy search (checked in the tests): (weight deviation, end bias).
DRAWS = [(0.15, 3.5), (0.3, 3.5)]
CONFIGS = [
    dict(d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
         activation_function="swish"),
    dict(d_model=24, encoder_layers=1, decoder_layers=2, encoder_attention_heads=3,
         decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40,
         activation_function="gelu"),
]


def _spm(directory, name, vocab_size):
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=os.path.join(directory, name),
        vocab_size=vocab_size, character_coverage=1.0, minloglevel=2)
    os.replace(os.path.join(directory, name + ".model"), os.path.join(directory, name + ".spm"))
    return sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, name + ".spm"))


@pytest.fixture(scope="module")
def made_marians(tmp_path_factory):
    """`made_marians(index)`: configuration `index` made once a module (the
    tests only copy its directory before changing a file)."""
    made = {}

    def get(index):
        if index not in made:
            made[index] = _make_marian(tmp_path_factory, index)
        return made[index]

    return get


@pytest.fixture(scope="module", params=[0, 1])
def marian_dir(request, made_marians):
    return made_marians(request.param)


@pytest.fixture(scope="module")
def marian0(made_marians):
    """Configuration 0 alone, for the refusals and errors: which file,
    setting, tensor or id is refused does not depend on the sizes, and the
    two configurations share their tokenizer files (the same corpus and
    vocabulary sizes), so configuration 1 would repeat the same case at
    other shapes (each a cold XLA compile in the JAX pass). The tests that
    compare numbers with transformers run on both."""
    return made_marians(0)


def _make_marian(tmp_path_factory, index):
    import torch
    import transformers

    path = str(tmp_path_factory.mktemp(f"marian{index}"))
    source, target = _spm(path, "source", 40), _spm(path, "target", 44)
    pieces = ["</s>", "<unk>", ">>fra<<"]
    for processor in (source, target):
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in pieces and piece not in ("<unk>", "<s>", "</s>"):
                pieces.append(piece)
    pieces.append("<pad>")
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump({piece: i for i, piece in enumerate(pieces)}, f)
    vocabulary, pad = len(pieces), len(pieces) - 1
    torch.manual_seed(index)
    config = transformers.MarianConfig(
        vocab_size=vocabulary, decoder_vocab_size=vocabulary, max_position_embeddings=64,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=None,
        scale_embedding=True, **CONFIGS[index])
    model = transformers.MarianMTModel(config).eval()
    deviation, end_bias = DRAWS[index]
    torch.manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # the sinusoids (frozen, computed, not saved)
                continue
            if "layer_norm" in name and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.copy_(deviation * torch.randn_like(parameter))
        # As in a trained model, the pad id (never a target) gets no probability.
        bias = torch.randn(1, vocabulary)
        bias[0, pad], bias[0, 0] = -30.0, end_bias
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(path)
    return path, model


def _sources(tokenizer):
    return tokenizer(TEXTS)


def test_encoder_output_and_logits_equal_transformers(marian_dir):
    import torch

    path, hf = marian_dir
    model, tokenizer = load_hf_marian(path)
    source = _sources(tokenizer)
    mask = source != tokenizer.pad_id
    assert not mask.all()  # padded rows
    target = np.random.default_rng(0).integers(0, tokenizer.pad_id, (len(TEXTS), 6)).astype("int32")
    target[:, 0] = tokenizer.start_id  # the pad id, Marian's start
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(source, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 decoder_input_ids=torch.tensor(target, dtype=torch.long))
    encoded, _ = model.encode(source)
    np.testing.assert_allclose(to_numpy(encoded)[mask], out.encoder_last_hidden_state.numpy()[mask],
                               atol=1e-4)
    np.testing.assert_allclose(to_numpy(model([source, target])), out.logits.numpy(), atol=1e-4)


def _generate(hf, source, pad, **options):
    import torch

    with torch.no_grad():
        return hf.generate(
            input_ids=torch.tensor(source, dtype=torch.long),
            attention_mask=torch.tensor(source != pad, dtype=torch.long),
            do_sample=False, bad_words_ids=[[pad]], return_dict_in_generate=True,
            output_scores=True, **options)


def test_greedy_and_beam_search_equal_generate(marian_dir):
    path, hf = marian_dir
    model, tokenizer = load_hf_marian(path)
    source = _sources(tokenizer)
    steps = 12
    theirs = _generate(hf, source, tokenizer.pad_id, num_beams=1, max_length=steps + 1)
    ours = to_numpy(transformer_greedy_search(model, source, tokenizer.start_id,
                                              tokenizer.end_id, max_length=steps))
    generated = theirs.sequences.numpy()[:, 1:]  # without the start token
    np.testing.assert_array_equal(ours[:, :generated.shape[1]], generated)
    assert (ours[:, generated.shape[1]:] == tokenizer.pad_id).all()
    greedy = ours
    for alpha in (1.0, 0.6):
        theirs = _generate(hf, source, tokenizer.pad_id, num_beams=4, length_penalty=alpha,
                           early_stopping=False, max_length=steps + 1)
        tokens, scores = transformer_beam_search(
            model, source, tokenizer.start_id, tokenizer.end_id, beam_width=4, alpha=alpha,
            max_length=steps, length_penalty="hf")
        tokens, generated = to_numpy(tokens), theirs.sequences.numpy()[:, 1:]
        np.testing.assert_array_equal(tokens[:, :generated.shape[1]], generated)
        np.testing.assert_allclose(to_numpy(scores), theirs.sequences_scores.numpy(), atol=1e-4)
        if alpha == 1.0:  # the case is not trivial (DRAWS): some sentences end
            # before the limit and some do not, and beam search picks other
            # tokens than greedy search.
            ended = (tokens == tokenizer.end_id).any(axis=1)
            assert ended.any() and not ended.all()
            assert (tokens != greedy).any(axis=1).sum() >= 2


@pytest.mark.backend_independent
def test_tokenizer_gives_the_ids_and_texts_of_transformers(marian_dir):
    import transformers

    path, _ = marian_dir
    _, tokenizer = load_hf_marian(path)
    theirs = transformers.MarianTokenizer.from_pretrained(path)
    texts = ["the cat sat in the park", ">>fra<< le chien est sur le tapis", "unseen xyz words"]
    for text in texts:
        ids = theirs(text)["input_ids"]
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text


@pytest.mark.backend_independent
def test_a_checkpoint_that_does_not_fit_is_refused(marian0, tmp_path):
    import shutil

    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path, _ = marian0
    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path / name)
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(dict(config, decoder_layers=config["decoder_layers"] + 1), f)
    # Refused before the model is built (check_sizes), the key named.
    with pytest.raises(ValueError, match=r"config.json: decoder_layers=\d disagrees with the "
                                         r"checkpoint, which holds \d layers?"):
        load_hf_marian(str(tmp_path), tokenizer=False)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(dict(config, scale_embedding=False), f)
    with pytest.raises(ValueError, match="Received: scale_embedding=False"):
        load_hf_marian(str(tmp_path), tokenizer=False)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.encoder.layers.9.fc1.bias"] = np.zeros(3, "float32")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.encoder.layers.9.fc1.bias"):
        load_hf_marian(str(tmp_path), tokenizer=False)
    # A stored position table must be the sinusoids the model computes.
    del tensors["model.encoder.layers.9.fc1.bias"]
    tensors["model.decoder.embed_positions.weight"] = np.zeros(
        (config["max_position_embeddings"], config["d_model"]), "float32")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="'model.decoder.embed_positions.weight' is not the sinus"):
        load_hf_marian(str(tmp_path), tokenizer=False)


@pytest.fixture(scope="module")
def exported_marian(tmp_path_factory, made_marians):
    """(directory, transformers model, model, tokenizer, SavedModel path)
    of one Marian model exported with its `translate` endpoint."""
    from keras_attn.export import export_translator

    path, hf = made_marians(0)
    model, tokenizer = load_hf_marian(path)
    exported = export_translator(model, tmp_path_factory.mktemp("export") / "translator",
                                 tokenizer.start_id, tokenizer.end_id, beam_width=4, alpha=1.0,
                                 max_length=12, length_penalty="hf", tokenizer=tokenizer)
    return path, hf, model, tokenizer, exported


@pytest.mark.tf_only
def test_exported_translator_translates_strings_as_transformers(exported_marian):
    import tensorflow as tf
    import transformers

    path, hf, model, tokenizer, exported = exported_marian
    texts = TEXTS[:6]
    loaded = tf.saved_model.load(exported)  # referenced while it serves
    served = loaded.translate(tf.constant(texts))
    translations = [t.decode("utf-8") for t in served["translations"].numpy()]
    assert sum(map(bool, translations)) >= 3, translations  # random weights, but words out
    assert translations == tokenizer.translate(model, texts, max_length=12)
    theirs = transformers.MarianTokenizer.from_pretrained(path)
    generated = _generate(hf, tokenizer(texts), tokenizer.pad_id, num_beams=4, length_penalty=1.0,
                          early_stopping=False, max_length=13)
    assert translations == theirs.batch_decode(generated.sequences, skip_special_tokens=True)
    np.testing.assert_allclose(served["scores"].numpy(), generated.sequences_scores.numpy(),
                               atol=1e-4)


@pytest.mark.tf_only
def test_exported_translate_fails_on_an_id_that_is_no_piece(exported_marian):
    import re

    import tensorflow as tf

    from keras_attn.export.translator import UNTRANSLATABLE
    from keras_attn.export.translator import _marian_text_graph_class

    _, _, model, tokenizer, exported = exported_marian
    texts = ["the cat sat in the park", "birds sing"]
    loaded = tf.saved_model.load(exported)  # its own variables, changed below
    before = [t.decode("utf-8")
              for t in loaded.translate(tf.constant(texts))["translations"].numpy()]
    assert before == tokenizer.translate(model, texts, max_length=12)
    # A NaN in the embedding of a piece of the first text: the search marks
    # it -2 (as MarianTokenizer.translate's test shows); the call fails,
    # naming the row and the id, instead of translating it as "".
    sources = tokenizer(texts)
    broken = int(sources[0, 0])
    assert broken not in sources[1]
    (embeddings,) = [v for v in loaded.variables if v.name == "token_embedding/embeddings:0"]
    table = embeddings.numpy()
    table[broken] = float("nan")
    embeddings.assign(table)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(UNTRANSLATABLE)
                       + re.escape(" the beam search gave the texts of rows [0] ids that are "
                                           "no piece of vocab.json: [-2] (-2 marks")):
        loaded.translate(tf.constant(texts))
    # The other text alone is served: its search gave pieces only (the NaN
    # row reaches its decoder's logits too, hence no check of its text).
    assert loaded.translate(tf.constant(texts[1:]))["translations"].shape == (1,)
    # Any id outside vocab.json fails decode the same way (eager and traced),
    # never an empty piece; the ids of pieces decode.
    graph = _marian_text_graph_class()(tokenizer, model.transformer_config.pad_id)
    size = tokenizer.vocabulary_size
    word = tokenizer.vocabulary[sorted(p for p in tokenizer.vocabulary if len(p) > 2
                                       and not p.startswith(("<", ">")))[0]]
    ok = tf.constant([[word, tokenizer.end_id, tokenizer.pad_id]], tf.int32)
    assert graph.decode(ok).numpy()[0].decode("utf-8") == tokenizer.decode([word])
    for bad in (size, -1, -2):
        ids = tf.constant([[word, tokenizer.end_id, tokenizer.pad_id],
                           [word, bad, tokenizer.end_id]], tf.int32)
        for decode in (graph.decode, tf.function(graph.decode)):
            with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(UNTRANSLATABLE)
                               + re.escape(f" the beam search gave the texts of rows [1] ids that are no "
                                             f"piece of vocab.json: [{bad}] (")):
                decode(ids)


@pytest.mark.backend_independent
def test_settings_and_files_the_loader_cannot_use_are_refused(marian0, tmp_path):
    import shutil

    path, _ = marian0
    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path / name)
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    for change, message in (({"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
                            ({"decoder_ffn_dim": 8}, "decoder_ffn_dim=8"),
                            ({"model_type": "bart"}, "model_type='bart'")):
        with open(tmp_path / "config.json", "w") as f:
            json.dump(dict(config, **change), f)
        with pytest.raises(ValueError, match=message):
            load_hf_marian(str(tmp_path))
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    os.remove(tmp_path / "target.spm")
    with pytest.raises(ValueError, match="target.spm does not exist"):
        load_hf_marian(str(tmp_path))


def _copy_dir(path, tmp_path):
    import shutil

    for name in os.listdir(path):
        shutil.copy(os.path.join(path, name), tmp_path / name)
    return str(tmp_path)


@pytest.mark.backend_independent
def test_a_tensor_that_is_not_finite_is_refused_by_name(marian0, tmp_path):
    import re

    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = _copy_dir(marian0[0], tmp_path)
    file = os.path.join(path, "model.safetensors")
    clean = load_file(file)
    for key, bad in (("model.encoder.layers.0.fc1.weight", float("nan")),
                     ("final_logits_bias", float("-inf")),
                     ("model.shared.weight", float("nan"))):
        tensors = {k: v.copy() for k, v in clean.items()}
        tensors[key].reshape(-1)[7] = bad
        save_file(tensors, file)
        with pytest.raises(ValueError, match=re.escape(
                f"{file}: tensor {key!r} holds 1 non-finite value(s) (NaN or infinity)")):
            load_hf_marian(path, tokenizer=False)
    # A stored position table is checked too.
    from keras_attn.layers.sinusoidal_positional_encoding import sinusoidal_positional_encoding

    tensors = dict(clean)
    d_model = clean["model.shared.weight"].shape[1]
    table = to_numpy(sinusoidal_positional_encoding(64, d_model, layout="concatenated")).copy()
    table[3, 2] = float("nan")
    tensors["model.encoder.embed_positions.weight"] = table
    save_file(tensors, file)
    with pytest.raises(ValueError, match=re.escape(
            "tensor 'model.encoder.embed_positions.weight' holds 1 non-finite value(s)")):
        load_hf_marian(path, tokenizer=False)


def _vocab_edit(marian_dir, tmp_path, edit):
    path = _copy_dir(marian_dir[0], tmp_path)
    with open(os.path.join(path, "vocab.json")) as f:
        vocabulary = json.load(f)
    edit(vocabulary)
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump(vocabulary, f)
    return path


@pytest.mark.backend_independent
def test_a_vocab_json_that_does_not_fit_the_model_is_refused(marian0, tmp_path):
    import re

    _, tokenizer = load_hf_marian(marian0[0])
    size = tokenizer.vocabulary_size
    a_piece = sorted(p for p, i in tokenizer.vocabulary.items() if i == 5)[0]
    other = sorted(p for p, i in tokenizer.vocabulary.items() if i == 6)[0]
    cases = [
        # one piece fewer than vocab_size
        (lambda v: v.pop(a_piece),
         f"has {size - 1} pieces; the model's vocabulary (config.json vocab_size) has {size}"),
        # an id past vocab_size (what made the beam search give -2)
        (lambda v: v.update({a_piece: size + 3}),
         f"has ids outside the model's vocabulary [0, {size}): [{size + 3}]"),
        (lambda v: v.update({"extra": size}),
         f"has ids outside the model's vocabulary [0, {size}): [{size}]"),
        (lambda v: v.update({a_piece: -1}),
         f"has ids outside the model's vocabulary [0, {size}): [-1]"),
        # two pieces with one id (and so one id that no piece has)
        (lambda v: v.update({other: 5}), "gives one id to several pieces (1 id(s) shared, e.g. 5 to"),
    ]
    for index, (edit, message) in enumerate(cases):
        (tmp_path / str(index)).mkdir()
        path = _vocab_edit(marian0, tmp_path / str(index), edit)
        with pytest.raises(ValueError, match=re.escape(
                os.path.join(path, "vocab.json") + " " + message)):
            load_hf_marian(path)


@pytest.mark.backend_independent
def test_ids_outside_the_vocabulary_are_an_error_not_unknown_text(marian0):
    import re

    path, _ = marian0
    model, tokenizer = load_hf_marian(path)
    size = tokenizer.vocabulary_size
    word = tokenizer.vocabulary[sorted(p for p in tokenizer.vocabulary if len(p) > 2
                                       and not p.startswith(("<", ">")))[0]]
    assert tokenizer.decode([word, tokenizer.end_id])  # a piece decodes to text
    for ids, bad, position in (([word, -2, -2], -2, 1), ([-2] * 4, -2, 0),
                               ([word, size], size, 1)):
        with pytest.raises(ValueError, match=re.escape(
                f"Token {bad} at position {position} is not an id of vocab.json, which has the "
                f"ids [0, {size})")):
            tokenizer.decode(ids)
    # The search marks a sentence it cannot translate with -2 (here a NaN in
    # the embedding of one source piece): translate names the text.
    texts = ["the cat sat in the park", "birds sing"]
    sources = tokenizer(texts)
    broken = int(sources[0, 0])
    assert broken not in sources[1]
    table = to_numpy(model.get_layer("token_embedding").embeddings).copy()
    table[broken] = float("nan")
    model.get_layer("token_embedding").embeddings.assign(table)
    tokens, _ = transformer_beam_search(model, sources, tokenizer.start_id, tokenizer.end_id,
                                        max_length=6, length_penalty="hf")
    assert (to_numpy(tokens)[0] == -2).all() and (to_numpy(tokens)[1] >= 0).all()
    with pytest.raises(ValueError, match=re.escape(
            "The beam search could not translate texts [0]: it gave them ids that are no "
            "piece of vocab.json ([-2]; -2 marks") + r".*" + re.escape(
            f"Received: texts={texts[:1]!r}")):
        tokenizer.translate(model, texts, max_length=6)
    assert len(tokenizer.translate(model, texts[1:], max_length=6)) == 1


@pytest.mark.backend_independent
def test_a_file_that_is_no_sentencepiece_model_is_refused_by_name(marian0, tmp_path):
    import re

    path = _copy_dir(marian0[0], tmp_path)
    for name, content in (("source.spm", b"\x00\x01 not a SentencePiece model \xff" * 7),
                          ("target.spm", b"")):
        original = open(os.path.join(path, name), "rb").read()
        with open(os.path.join(path, name), "wb") as f:
            f.write(content)
        with pytest.raises(ValueError, match=re.escape(
                f"{os.path.join(path, name)} is not a SentencePiece model (sentencepiece: ")
                + r".*" + re.escape(f"Received: path={path!r}, {name} of {len(content)} bytes")):
            load_hf_marian(path)
        with open(os.path.join(path, name), "wb") as f:
            f.write(original)
    load_hf_marian(path)  # the files put back load
