"""Converters read everything they load, or refuse it: every tensor used or
its skipping named, exact shapes before any reshape, malformed files a
`ValueError` naming the file and the key. Small random checkpoints saved by
transformers, nothing downloaded."""

import json
import shutil
import warnings

import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from keras_attn.convert.bert import load_hf_bert_backbone
from keras_attn.convert.vit import load_hf_vit

# What a loader refuses or warns of in a file is Python and NumPy: tested
# once, in the TensorFlow pass (docs/backends.md).
pytestmark = pytest.mark.backend_independent


def _save(model, path):
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    import torch  # here, not at the top: collecting the module does not import them
    import transformers

    torch.manual_seed(0)
    bert = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=20)
    vit = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=24, num_labels=3)
    root = tmp_path_factory.mktemp("strict")
    bert_model = transformers.BertModel(bert).eval()
    vit_model = transformers.ViTForImageClassification(vit).eval()
    return {
        "bert": _save(bert_model, root / "bert"),
        "bert_pretraining": _save(transformers.BertForPreTraining(bert).eval(),
                                  root / "bert_pretraining"),
        "vit": _save(vit_model, root / "vit"),
        # The same models in shards of <= 8 KB: model-0000i-of-0000N.safetensors and
        # model.safetensors.index.json, as save_pretrained writes a big checkpoint.
        "bert_sharded": _save_sharded(bert_model, root / "bert_sharded"),
        "vit_sharded": _save_sharded(vit_model, root / "vit_sharded"),
    }


def _save_sharded(model, path):
    model.save_pretrained(str(path), max_shard_size="8KB")
    assert not (path / "model.safetensors").exists()
    assert len(list(path.glob("model-*-of-*.safetensors"))) >= 2
    return path


LOADERS = {"bert": load_hf_bert_backbone, "vit": load_hf_vit}


def _copy(source, tmp_path):
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_fewer_layers_in_the_config_than_in_the_checkpoint_is_refused(family, checkpoints,
                                                                      tmp_path):
    path = _copy(checkpoints[family], tmp_path)
    _edit_config(path, num_hidden_layers=1)
    # Refused before the model is built (check_sizes), the key and the layers named.
    with pytest.raises(ValueError, match=r"config.json: num_hidden_layers=1 disagrees with the "
                                         r"checkpoint, which holds 2 layers .*encoder.layer.0 "
                                         r"to .*encoder.layer.1"):
        LOADERS[family](str(path))


@pytest.mark.parametrize("family", ["bert", "vit"])
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_size": None}, r"config.json has no 'hidden_size'"),
        ({"hidden_size": "abc"}, r"'hidden_size' must be a number. Received: hidden_size='abc'"),
        ({"num_hidden_layers": 1.5}, r"'num_hidden_layers' must be an integer"),
    ],
)
def test_bad_config_fields_name_the_key(family, changes, message, checkpoints, tmp_path):
    path = _copy(checkpoints[family], tmp_path)
    _edit_config(path, **changes)
    with pytest.raises(ValueError, match=message):
        LOADERS[family](str(path))


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_malformed_files_name_the_file(family, checkpoints, tmp_path):
    path = _copy(checkpoints[family], tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        LOADERS[family](str(path))
    path = _copy(checkpoints[family], tmp_path / "second")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors cannot be read as safetensors"):
        LOADERS[family](str(path))
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model.safetensors does not exist"):
        LOADERS[family](str(path))


def test_vit_tensor_of_the_right_size_but_the_wrong_shape_is_refused(checkpoints, tmp_path):
    path = _copy(checkpoints["vit"], tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    key = "vit.embeddings.position_embeddings"  # (1, 5, 16)
    tensors[key] = tensors[key].reshape(5, 1, 16)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"'{key}' has shape \(5, 1, 16\) but config.json "
                                         r"implies \(1, 5, 16\)"):
        load_hf_vit(str(path))


def test_bert_heads_are_dropped_by_name_or_refused(checkpoints):
    path = str(checkpoints["bert_pretraining"])
    with pytest.warns(UserWarning, match=r"task heads not loaded into the backbone: "
                                         r"cls.predictions, cls.seq_relationship"):
        load_hf_bert_backbone(path)
    with pytest.raises(ValueError, match=r"no place for.*cls.predictions"):
        load_hf_bert_backbone(path, drop_heads=False)


def test_a_clean_backbone_loads_without_a_warning(checkpoints):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_hf_bert_backbone(str(checkpoints["bert"]))


def test_vit_classifier_dropped_by_choice_is_named(checkpoints):
    with pytest.warns(UserWarning, match=r"not loaded \(by choice\): classifier"):
        model = load_hf_vit(str(checkpoints["vit"]), include_classifier=False)
    assert model.vit_config.num_classes is None


@pytest.mark.parametrize("family", ["bert", "vit"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_tensor_that_is_not_finite_is_refused_by_name(family, bad, checkpoints, tmp_path):
    import re

    path = _copy(checkpoints[family], tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    (key,) = [k for k in tensors if k.endswith("layer.1.attention.attention.query.weight")
              or k.endswith("layer.1.attention.self.query.weight")]
    tensors[key][3, 5] = bad
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=re.escape(
            f"{path / 'model.safetensors'}: tensor {key!r} holds 1 non-finite value(s) (NaN or "
            f"infinity)")):
        LOADERS[family](str(path))
    if family == "bert":
        from keras_attn.convert.bert import load_hf_bert

        with pytest.raises(ValueError, match=re.escape(f"tensor {key!r} holds 1 non-finite")):
            load_hf_bert(str(path))


# === Sharded checkpoints (model.safetensors.index.json) ===


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_a_sharded_checkpoint_loads_as_the_single_file_does(family, checkpoints):
    import numpy as np

    from keras_attn.convert import load_hf
    from test_case import to_numpy

    one = load_hf(str(checkpoints[family]))
    sharded = load_hf(str(checkpoints[family + "_sharded"]))
    assert type(sharded) is type(one)
    for a, b in zip(one.weights, sharded.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    rng = np.random.default_rng(0)
    if family == "bert":
        ids = rng.integers(0, 50, (2, 7)).astype("int32")
        x = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
             "padding_mask": np.ones_like(ids)}
        outputs = one(x)["sequence_output"], sharded(x)["sequence_output"]
    else:
        x = rng.uniform(0, 255, (2, 8, 8, 3)).astype("float32")
        outputs = one(x), sharded(x)
    np.testing.assert_array_equal(*(to_numpy(o) for o in outputs))


def test_errors_of_a_sharded_checkpoint_name_the_shard_or_the_index(checkpoints, tmp_path):
    import re

    path = _copy(checkpoints["bert_sharded"], tmp_path)
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    key = "encoder.layer.1.attention.self.query.weight"
    shard = path / index["weight_map"][key]
    tensors = load_file(str(shard))
    tensors[key][3, 5] = float("nan")
    save_file(tensors, str(shard))
    with pytest.raises(ValueError, match=re.escape(
            f"{shard}: tensor {key!r} holds 1 non-finite value(s)")):
        load_hf_bert_backbone(str(path))
    # A tensor the config implies that neither the index nor a shard holds.
    del tensors[key]
    save_file(tensors, str(shard))
    del index["weight_map"][key]
    index_file.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=re.escape(f"{index_file} has no tensor {key!r}")):
        load_hf_bert_backbone(str(path))


def test_model_safetensors_is_read_before_an_index(checkpoints, tmp_path):
    """transformers' from_pretrained reads a local model.safetensors first."""
    from keras_attn.convert._checkpoint import read_safetensors

    path = _copy(checkpoints["bert"], tmp_path)
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    tensors = read_safetensors(str(path))
    assert tensors.file == str(path / "model.safetensors")
    assert "embeddings.word_embeddings.weight" in tensors


def _hand_made(path, shards, weight_map):
    """A sharded directory of tiny tensors: `shards` {file: [names]}."""
    import numpy as np

    path.mkdir()
    for file, names in shards.items():
        save_file({n: np.full((2,), i, "float32") for i, n in enumerate(names)},
                  str(path / file))
    index = weight_map if isinstance(weight_map, str) else json.dumps(
        {"metadata": {}, "weight_map": weight_map})
    (path / "model.safetensors.index.json").write_text(index)
    return path


A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


@pytest.mark.parametrize(
    "shards, weight_map, message",
    [
        ({A: ["a"]}, {"a": A, "b": B},
         r"index.json names the shard 'model-00002-of-00002.safetensors' \(holding 'b'\), "
         r"which does not exist"),
        ({A: ["a"], B: ["c"]}, {"a": A, "b": A, "c": B},
         r"index.json puts tensor 'b' in model-00001-of-00002.safetensors, which does not "
         r"hold it"),
        ({A: ["a", "c"], B: ["c"]}, {"a": A, "c": B},
         r"model-00001-of-00002.safetensors holds tensor 'c', which .*index.json puts in "
         r"model-00002-of-00002.safetensors"),
        ({A: ["a", "z"]}, {"a": A},
         r"model-00001-of-00002.safetensors holds tensor 'z', which .*index.json does not "
         r"name"),
        ({A: ["a"]}, "{not json", r"index.json is not valid JSON"),
        ({A: ["a"]}, json.dumps({"metadata": {}}), r"index.json: 'weight_map' must be"),
        ({A: ["a"]}, {"a": 1}, r"index.json: 'weight_map' must name a file .* 'a' -> 1"),
        ({A: ["a"]}, {"a": "../" + A}, r"'weight_map' must name a file .* 'a' -> '\.\./"),
    ],
    ids=["missing_shard", "missing_tensor", "in_another_shard", "unnamed_tensor",
         "not_json", "no_weight_map", "not_a_file_name", "outside_the_directory"],
)
def test_a_sharded_checkpoint_that_does_not_match_its_index_is_refused(shards, weight_map,
                                                                        message, tmp_path):
    from keras_attn.convert._checkpoint import read_safetensors

    path = _hand_made(tmp_path / "sharded", shards, weight_map)
    with pytest.raises(ValueError, match=message):
        read_safetensors(str(path))


def test_a_missing_shard_is_refused_before_a_model_is_built(checkpoints, tmp_path):
    from keras_attn.convert import load_hf

    path = _copy(checkpoints["bert_sharded"], tmp_path)
    last = sorted(path.glob("model-*-of-*.safetensors"))[-1]
    last.unlink()
    with pytest.raises(ValueError, match=rf"index.json names the shard '{last.name}'"):
        load_hf(str(path))
