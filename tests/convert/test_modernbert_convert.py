"""ModernBERT against transformers' own model: random weights of a small,
odd size (4 blocks, so global and local blocks both occur; a local window of
8 tokens on 20-token rows), norms moved away from 1, one row padded."""

import json
import os

import numpy as np
import pytest

from keras_attn.convert import load_hf
from keras_attn.convert.modernbert import load_hf_modernbert
from keras_attn.models.modernbert import ModernBertBackbone
from keras_attn.models.modernbert import ModernBertMaskedLM
from test_case import to_numpy

LENGTH, REAL = 20, 13  # the second row holds 13 tokens, then padding


def _hf_model(kind, path):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=24, local_attention=8, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="eager")
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():  # norms away from 1, a bias away from 0, and queries and
        # keys large enough that attention is far from uniform (so that the
        # window and the rotary bases show in the outputs)
        for name, weight in model.named_parameters():
            if "norm" in name or name == "decoder.bias":
                weight.copy_(torch.randn_like(weight) * 0.3 + (0 if "bias" in name else 1))
            elif "Wqkv" in name:
                weight.copy_(torch.randn_like(weight) * 0.5)
    model.save_pretrained(path)
    return model


def _batch():
    ids = np.random.default_rng(0).integers(3, 64, size=(2, LENGTH)).astype("int32")
    mask = np.ones((2, LENGTH), "int32")
    mask[1, REAL:] = 0
    ids[1, REAL:] = 0
    return ids, mask


def _hf_outputs(model, ids, mask):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long))
    return (out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits).numpy()


@pytest.mark.parametrize("kind", ["ModernBertModel", "ModernBertForMaskedLM"])
def test_outputs_equal_transformers(kind, tmp_path):
    hf_model = _hf_model(kind, str(tmp_path))
    ids, mask = _batch()
    expected = _hf_outputs(hf_model, ids, mask)
    model = load_hf_modernbert(str(tmp_path))
    # The one-call loader picks the same model from config.json.
    assert type(load_hf(str(tmp_path))) is type(model)
    got = model({"token_ids": ids, "padding_mask": mask})
    if kind == "ModernBertModel":
        assert isinstance(model, ModernBertBackbone)
        got = got["sequence_output"]
    else:
        assert isinstance(model, ModernBertMaskedLM)
    got = to_numpy(got)
    config = model.get_layer("transformer_block_1").get_config() if kind == "ModernBertModel" \
        else model.backbone.get_layer("transformer_block_1").get_config()
    assert config["window"] == 8 and config["rotary_theta"] == 10000.0  # a local block
    np.testing.assert_allclose(got[0], expected[0], atol=1e-4)
    np.testing.assert_allclose(got[1, :REAL], expected[1, :REAL], atol=1e-4)


def test_unmapped_tensors_and_options_are_refused_by_name(tmp_path):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    _hf_model("ModernBertModel", str(tmp_path))
    weights = os.path.join(str(tmp_path), "model.safetensors")
    tensors = load_file(weights)
    save_file({**tensors, "layers.9.attn.Wo.weight": np.zeros((32, 32), "float32")}, weights)
    with pytest.raises(ValueError, match=r"layers\.9\.attn\.Wo\.weight"):
        load_hf_modernbert(str(tmp_path))
    save_file(tensors, weights)
    config_path = os.path.join(str(tmp_path), "config.json")
    with open(config_path) as stream:
        config = json.load(stream)
    with open(config_path, "w") as stream:
        json.dump({**config, "mlp_bias": True}, stream)
    with pytest.raises(ValueError, match="mlp_bias"):
        load_hf_modernbert(str(tmp_path))


def test_a_packed_row_equals_transformers_on_each_sequence_alone(tmp_path):
    hf_model = _hf_model("ModernBertModel", str(tmp_path))
    model = load_hf_modernbert(str(tmp_path))
    ids, _ = _batch()
    a, b = ids[:1, :12], ids[1:, :REAL]  # 12 + 13 tokens, each past the window
    alone = [_hf_outputs(hf_model, x, np.ones_like(x)) for x in (a, b)]
    row = np.concatenate([a, b], axis=1)
    packed = to_numpy(model({
        "token_ids": row, "padding_mask": np.ones_like(row),
        "packed_segment_ids": np.array([[1] * 12 + [2] * REAL]),
        "positions": np.array([list(range(12)) + list(range(REAL))]),
    })["sequence_output"])
    np.testing.assert_allclose(packed[:, :12], alone[0], atol=1e-4)
    np.testing.assert_allclose(packed[:, 12:], alone[1], atol=1e-4)


def test_the_published_config_gives_the_preset():
    """answerdotai/ModernBERT-base's config.json (the fields the model
    reads; an older transformers wrote the layer pattern and the thetas as
    `global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`)."""
    import transformers

    from keras_attn.convert.modernbert import modernbert_config_from_hf
    from keras_attn.models import MODERNBERT_PRESETS

    published = {
        "architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
        "vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22,
        "num_attention_heads": 12, "intermediate_size": 1152, "hidden_activation": "gelu",
        "classifier_activation": "gelu", "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "local_attention": 128,
        "max_position_embeddings": 8192, "norm_eps": 1e-05, "norm_bias": False,
        "attention_bias": False, "mlp_bias": False, "classifier_bias": False,
        "decoder_bias": True, "pad_token_id": 50283, "tie_word_embeddings": True,
        "embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0,
    }
    assert modernbert_config_from_hf(published) == MODERNBERT_PRESETS["modernbert_base"]
    hf = transformers.ModernBertConfig(**published)  # transformers reads it the same way
    assert modernbert_config_from_hf(hf.to_dict()) == MODERNBERT_PRESETS["modernbert_base"]
