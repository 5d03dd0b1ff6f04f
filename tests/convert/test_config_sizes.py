"""Issue 68: a config.json is read whole or refused by name. Its sizes are
checked against the checkpoint's tensors before the model is built (a
vocab_size of 10**9 is a ValueError, not an out-of-memory error), options
that change the arithmetic are refused by name, and what a loader keeps of a
checkpoint it writes back (DINOv2's mask token, a SwiGLU mlp_ratio,
Parakeet's layerdrop). Tiny random transformers models, save_pretrained."""

import json

import numpy as np
import pytest

import keras_attn.convert.bert as bert_convert
import keras_attn.convert.dinov2 as dinov2_convert
import keras_attn.convert.marian as marian_convert
import keras_attn.convert.modernbert as modernbert_convert
import keras_attn.convert.parakeet as parakeet_convert
import keras_attn.convert.vit as vit_convert
import keras_attn.models.transformer as transformer_model

# What a loader refuses in a file is Python and NumPy: tested once.
pytestmark = pytest.mark.backend_independent

BIG = 10**9


def _saved(path, kind, **options):
    """A random transformers `kind` model of the tiny config, saved."""
    import torch
    import transformers

    torch.manual_seed(0)
    configs = {
        "BertModel": lambda: transformers.BertConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=24, max_position_embeddings=20, **options),
        "ModernBertModel": lambda: transformers.ModernBertConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=24, local_attention=8, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, cls_token_id=1, sep_token_id=2, **options),
        "ViTModel": lambda: transformers.ViTConfig(
            image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=24, **options),
        "Dinov2WithRegistersModel": lambda: transformers.Dinov2WithRegistersConfig(
            image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2,
            num_attention_heads=2, num_register_tokens=2, **options),
        "ParakeetForCTC": lambda: transformers.ParakeetCTCConfig(
            vocab_size=10, pad_token_id=9, encoder_config=dict(
                hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=24, subsampling_conv_channels=8, num_mel_bins=16,
                conv_kernel_size=9, **options)),
        "MarianMTModel": lambda: transformers.MarianConfig(
            vocab_size=30, decoder_vocab_size=30, d_model=16, encoder_layers=1,
            decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=20,
            pad_token_id=29, eos_token_id=0, decoder_start_token_id=29,
            scale_embedding=True),
    }
    model = getattr(transformers, kind)(configs[kind]()).eval()
    model.save_pretrained(str(path))
    return model


def _edit(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if "." in key:  # encoder_config.hidden_size
            outer, inner = key.split(".")
            config[outer][inner] = value
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def _never_built(monkeypatch, module, name):
    """The loader's model builder replaced by one that fails: a size check
    that comes after building (or none) fails the test instead of
    allocating."""
    def build(*args, **kwargs):
        raise AssertionError("the model was built before its sizes were checked")

    monkeypatch.setattr(module, name, build)


# (transformers class, loader module, its builder's name, the loader) and the
# config edits each refused with the key, the value and the tensor's shape.
LOADERS = {
    "BertModel": (bert_convert, "build_bert", bert_convert.load_hf_bert_backbone),
    "ModernBertModel": (modernbert_convert, "build_modernbert",
                        modernbert_convert.load_hf_modernbert),
    "ViTModel": (vit_convert, "ViT", vit_convert.load_hf_vit),
    "Dinov2WithRegistersModel": (dinov2_convert, "ViT", dinov2_convert.load_hf_dinov2),
    "ParakeetForCTC": (parakeet_convert, "build_conformer", parakeet_convert.load_hf_parakeet),
    "MarianMTModel": (transformer_model, "Transformer",
                      lambda path: marian_convert.load_hf_marian(path, tokenizer=False)),
}
CASES = [
    ("BertModel", "vocab_size", BIG, r"word_embeddings.weight' has shape \(40, 16\)"),
    ("BertModel", "hidden_size", 32, r"'embeddings.word_embeddings.weight' has shape \(40, 16\)"),
    ("BertModel", "intermediate_size", BIG, r"'encoder.layer.0.intermediate.dense.weight' has "
                                            r"shape \(24, 16\)"),
    ("BertModel", "max_position_embeddings", BIG, r"'embeddings.position_embeddings.weight' "
                                                  r"has shape \(20, 16\)"),
    ("BertModel", "num_hidden_layers", 10**6, r"holds 2 layers"),
    ("ModernBertModel", "vocab_size", BIG, r"'embeddings.tok_embeddings.weight' has shape "
                                           r"\(40, 16\)"),
    ("ModernBertModel", "intermediate_size", BIG, r"'layers.0.mlp.Wo.weight' has shape "
                                                  r"\(16, 24\)"),
    ("ViTModel", "image_size", 4 * 10**5, r"'embeddings.position_embeddings' has shape "
                                          r"\(1, 5, 16\)"),
    ("ViTModel", "hidden_size", 64, r"'embeddings.patch_embeddings.projection.weight' has "
                                    r"shape \(16, 3, 4, 4\)"),
    ("Dinov2WithRegistersModel", "mlp_ratio", 10**6, r"'encoder.layer.0.mlp.fc2.weight' has "
                                                      r"shape \(16, 64\)"),
    ("Dinov2WithRegistersModel", "num_hidden_layers", 10**6, r"holds 2 layers"),
    ("ParakeetForCTC", "encoder_config.subsampling_conv_channels", BIG,
     r"'encoder.subsampling.layers.0.weight' has shape \(8, 1, 3, 3\)"),
    ("ParakeetForCTC", "encoder_config.intermediate_size", BIG,
     r"'encoder.layers.0.feed_forward1.linear1.weight' has shape \(24, 16\)"),
    ("MarianMTModel", "d_model", 32, r"'model.shared.weight' has shape \(30, 16\)"),
    ("MarianMTModel", "decoder_layers", 10**6, r"holds 1 layer \(model.decoder.layers.0 "
                                               r"to model.decoder.layers.0; it has no layer 1"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    return {kind: (_saved(root / kind, kind), root / kind) for kind in LOADERS}


@pytest.mark.parametrize("kind, key, value, shape", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_size_the_tensors_disagree_with_is_refused_before_building(
        kind, key, value, shape, saved, tmp_path, monkeypatch):
    import shutil

    path = tmp_path / kind
    shutil.copytree(saved[kind][1], path)
    _edit(path, **{key: value})
    module, builder, load = LOADERS[kind]
    _never_built(monkeypatch, module, builder)
    with pytest.raises(ValueError, match=rf"config.json: {key}={value} disagrees with the "
                                         rf"checkpoint.*{shape}"):
        load(str(path))


def test_a_missing_tensor_is_refused_before_building(saved, tmp_path, monkeypatch):
    import shutil

    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = tmp_path / "bert"
    shutil.copytree(saved["BertModel"][1], path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["embeddings.word_embeddings.weight"]  # nothing left to say the size
    save_file(tensors, str(path / "model.safetensors"))
    _edit(path, vocab_size=BIG)
    _never_built(monkeypatch, bert_convert, "build_bert")
    with pytest.raises(ValueError, match=r"has no tensor 'embeddings.word_embeddings.weight'"):
        bert_convert.load_hf_bert_backbone(str(path))
    _edit(path, vocab_size=40, num_hidden_layers=10**6)  # and no layer at all
    tensors = load_file(str(saved["BertModel"][1] / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("encoder.")},
              str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000 disagrees with the "
                                         r"checkpoint, which holds 0 layers \(it has no "
                                         r"layer 0\)"):
        bert_convert.load_hf_bert_backbone(str(path))


@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
@pytest.mark.parametrize("model_type", ["bert", "roberta", "xlm-roberta"])
def test_a_decoder_or_cross_attention_config_is_refused_by_name(key, model_type, saved,
                                                                tmp_path):
    import shutil

    path = tmp_path / "bert"
    shutil.copytree(saved["BertModel"][1], path)
    _edit(path, **{key: True})
    if model_type != "bert":
        _edit(path, model_type=model_type, architectures=["RobertaModel"], pad_token_id=1)
    with pytest.raises(ValueError, match=rf"config.json: {key} makes .* two-way encoder .*"
                                         rf"Received: {key}=True$"):
        bert_convert.load_hf_bert_task(str(path))


def test_a_decoder_loads_nowhere_silently():
    # The config function alone (what load_hf_bert_backbone reads) refuses it too.
    with pytest.raises(ValueError, match=r"Received: is_decoder=True"):
        bert_convert.bert_config_from_hf({
            "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 24, "is_decoder": True})


def test_a_modernbert_backbone_reads_no_classifier_activation(tmp_path):
    import torch

    hf = _saved(tmp_path / "m", "ModernBertModel", hidden_activation="silu")
    assert json.loads((tmp_path / "m" / "config.json").read_text())[
        "classifier_activation"] == "gelu"  # the unused default
    model = modernbert_convert.load_hf_modernbert(str(tmp_path / "m"))
    ids = np.array([[1, 5, 9, 7, 2]], "int32")
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
    out = model({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    np.testing.assert_allclose(np.asarray(out["sequence_output"]), expected, atol=1e-4)
    # A head applies it: there it must be the blocks' activation.
    _edit(tmp_path / "m", architectures=["ModernBertForMaskedLM"])
    with pytest.raises(ValueError, match=r"Received: classifier_activation='gelu', "
                                         r"hidden_activation='silu'"):
        modernbert_convert.load_hf_modernbert(str(tmp_path / "m"))


def test_dinov2_mask_token_round_trips(tmp_path):
    import torch
    from safetensors.numpy import load_file

    hf = _saved(tmp_path / "in", "Dinov2WithRegistersModel")
    with torch.no_grad():
        hf.embeddings.mask_token.normal_(0.0, 1.0)
    hf.save_pretrained(str(tmp_path / "in"))
    model = dinov2_convert.load_hf_dinov2(str(tmp_path / "in"))
    dinov2_convert.save_hf_dinov2(model, str(tmp_path / "out"))
    written = load_file(str(tmp_path / "out" / "model.safetensors"))["embeddings.mask_token"]
    np.testing.assert_array_equal(written, hf.embeddings.mask_token.detach().numpy())
    assert np.abs(written).max() > 0


@pytest.mark.parametrize("ratio", [2, 3])
def test_a_swiglu_dinov2_of_any_mlp_ratio_is_saved(ratio, tmp_path):
    import torch
    import transformers

    hf = _saved(tmp_path / "in", "Dinov2WithRegistersModel", use_swiglu_ffn=True,
                mlp_ratio=ratio)
    model = dinov2_convert.load_hf_dinov2(str(tmp_path / "in"))
    dinov2_convert.save_hf_dinov2(model, str(tmp_path / "out"))
    back = transformers.Dinov2WithRegistersModel.from_pretrained(str(tmp_path / "out")).eval()
    assert back.config.use_swiglu_ffn
    pixels = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        np.testing.assert_array_equal(back(pixel_values=pixels).last_hidden_state.numpy(),
                                      hf(pixel_values=pixels).last_hidden_state.numpy())


def test_parakeet_layerdrop_is_written_back(tmp_path):
    _saved(tmp_path / "in", "ParakeetForCTC", layerdrop=0.25)
    model = parakeet_convert.load_hf_parakeet(str(tmp_path / "in"))
    parakeet_convert.save_hf_parakeet(model, str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["encoder_config"]["layerdrop"] == 0.25
