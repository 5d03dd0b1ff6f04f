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
    return {
        "bert": _save(transformers.BertModel(bert).eval(), root / "bert"),
        "bert_pretraining": _save(transformers.BertForPreTraining(bert).eval(),
                                  root / "bert_pretraining"),
        "vit": _save(transformers.ViTForImageClassification(vit).eval(), root / "vit"),
    }


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
    with pytest.raises(ValueError, match=r"tensor\(s\) the model built from config.json has "
                                         r"no place for.*encoder.layer.1."):
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
