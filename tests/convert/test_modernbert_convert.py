"""ModernBERT against transformers' own model: random weights of a small,
odd size (4 blocks, so global and local blocks both occur; a local window of
8 tokens on 20-token rows), norms moved away from 1, one row padded; and
written back (save_hf) for transformers' from_pretrained."""

import json
import os

import numpy as np
import pytest

from keras_attn.convert import load_hf
from keras_attn.convert.modernbert import load_hf_modernbert
from keras_attn.models.modernbert import ModernBertBackbone
from keras_attn.models.modernbert import ModernBertMaskedLM
from keras_attn.models.modernbert import ModernBertSequenceClassifier
from test_case import to_numpy

LENGTH, REAL = 20, 13  # the second row holds 13 tokens, then padding


def _hf_model(kind, path, **options):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=24, local_attention=8, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="eager",
        **options)
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():  # norms away from 1, biases away from 0, and queries and
        # keys large enough that attention is far from uniform (so that the
        # window and the rotary bases show in the outputs); the classifier's
        # weights large enough that its logits differ by more than 1e-4
        for name, weight in model.named_parameters():
            if "norm" in name or name in ("decoder.bias", "classifier.bias"):
                weight.copy_(torch.randn_like(weight) * 0.3 + (0 if "bias" in name else 1))
            elif "Wqkv" in name or name in ("head.dense.weight", "classifier.weight"):
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


_CLASSIFIER = "ModernBertForSequenceClassification"


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


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_sequence_classifier_equals_transformers(pooling, tmp_path):
    """Logits of padded rows equal transformers' (the mean over the real
    tokens only); the classifier's settings come from config.json."""
    hf_model = _hf_model(_CLASSIFIER, str(tmp_path), num_labels=3,
                         classifier_pooling=pooling, classifier_dropout=0.25)
    ids, mask = _batch()
    mask[0, 15:] = 0  # both rows padded, by different amounts
    ids[0, 15:] = 0
    expected = _hf_outputs(hf_model, ids, mask)
    model = load_hf(str(tmp_path))
    assert isinstance(model, ModernBertSequenceClassifier)
    assert (model.num_classes, model.pooling, model.dropout) == (3, pooling, 0.25)
    got = to_numpy(model({"token_ids": ids, "padding_mask": mask}))
    assert np.ptp(expected) > 0.1  # logits that differ: the head shows
    np.testing.assert_allclose(got, expected, atol=1e-4)


def _moved_weights(model):
    """Every weight drawn again around its scale, so that no norm is 1 and
    no bias 0 (the writer must carry each)."""
    rng = np.random.default_rng(1)
    for weight in model.weights:
        value = to_numpy(weight)
        if "layer_norm" in weight.path:
            value = 1 + 0.3 * rng.standard_normal(value.shape)
        else:
            value = (0.3 if value.ndim == 1 else 0.2) * rng.standard_normal(value.shape)
        weight.assign(value.astype("float32"))


@pytest.mark.parametrize("kind", ["ModernBertBackbone", "ModernBertMaskedLM",
                                  "ModernBertSequenceClassifier"])
def test_save_hf_round_trips_through_transformers(kind, tmp_path):
    """keras_attn -> save_hf -> transformers' from_pretrained: no missing or
    unexpected key, the same outputs; load_hf reads it back."""
    import transformers

    from keras_attn.convert import save_hf
    from keras_attn.models.modernbert import build_modernbert

    backbone = build_modernbert("modernbert_base", vocabulary_size=64, num_layers=4,
                                num_heads=2, hidden_dim=32, intermediate_dim=24,
                                local_window=8, max_sequence_length=64, pad_id=0,
                                global_rope_theta=5000.0, local_rope_theta=300.0)
    model = {"ModernBertBackbone": lambda: backbone,
             "ModernBertMaskedLM": lambda: ModernBertMaskedLM(backbone),
             "ModernBertSequenceClassifier": lambda: ModernBertSequenceClassifier(
                 backbone, num_classes=4, pooling="mean", dropout=0.1)}[kind]()
    _moved_weights(model)
    ids, mask = _batch()
    ours = model({"token_ids": ids, "padding_mask": mask})
    ours = to_numpy(ours["sequence_output"] if kind == "ModernBertBackbone" else ours)
    path = save_hf(model, str(tmp_path / "hf"))
    auto = {"ModernBertBackbone": transformers.AutoModel,
            "ModernBertMaskedLM": transformers.AutoModelForMaskedLM,
            "ModernBertSequenceClassifier": transformers.AutoModelForSequenceClassification}
    hf_model, info = auto[kind].from_pretrained(path, output_loading_info=True,
                                                attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    theirs = _hf_outputs(hf_model.eval(), ids, mask)
    np.testing.assert_allclose(theirs[0], ours[0], atol=1e-4)
    np.testing.assert_allclose(theirs[1, :REAL], ours[1, :REAL], atol=1e-4)
    again = load_hf(path)
    assert type(again) is type(model) and len(again.weights) == len(model.weights)
    for a, b in zip(again.weights, model.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    config = (again if kind == "ModernBertBackbone" else again.backbone).modernbert_config
    assert config == backbone.modernbert_config
    if kind == "ModernBertSequenceClassifier":
        assert (again.num_classes, again.pooling, again.dropout) == (4, "mean", 0.1)


def test_save_hf_refuses_what_transformers_cannot_hold(tmp_path):
    from keras_attn.convert import save_hf
    from keras_attn.convert.modernbert import save_hf_modernbert
    from keras_attn.models.modernbert import build_modernbert

    tiny = dict(vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=8,
                intermediate_dim=12, pad_id=0)
    with pytest.raises(ValueError, match="Received: activation='tanh'"):
        save_hf(build_modernbert("modernbert_base", activation="tanh", **tiny),
                str(tmp_path / "a"))
    with pytest.raises(ValueError, match="Received: model=Sequential"):
        import keras

        save_hf_modernbert(keras.Sequential(), str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


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
    with open(config_path, "w") as stream:
        json.dump({**config, "architectures": [_CLASSIFIER], "classifier_pooling": "max"},
                  stream)
    with pytest.raises(ValueError, match="Received: classifier_pooling='max'"):
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
