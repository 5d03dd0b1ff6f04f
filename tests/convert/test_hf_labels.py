"""Class names through a Hugging Face directory: a classifier's `id2label`
read by `load_hf` is the model's `class_names`, kept by a `.keras` round trip
and written back by `save_hf` (`id2label` and its inverse `label2id`, which
transformers reads), or replaced by `save_hf(class_names=...)`; a label map
that does not fit the head is refused naming config.json, the key and the
value."""

import json
import re

import pytest

from keras_attn.convert import load_hf
from keras_attn.convert import save_hf

# Writing and reading config.json is Python alone, the same on every backend.
pytestmark = pytest.mark.backend_independent

NAMES = ["food", "sport", "tech"]
ID2LABEL = {str(i): name for i, name in enumerate(NAMES)}
LABEL2ID = {name: i for i, name in enumerate(NAMES)}
TEXT = dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=12)
IMAGE = dict(image_size=8, patch_size=4, hidden_size=8, num_hidden_layers=1,
             num_attention_heads=2)
# transformers' class -> (its config class, the tiny sizes of an untested model)
CLASSIFIERS = {
    "BertForSequenceClassification": ("BertConfig", dict(TEXT, max_position_embeddings=16)),
    "BertForTokenClassification": ("BertConfig", dict(TEXT, max_position_embeddings=16)),
    "RobertaForSequenceClassification": ("RobertaConfig", dict(
        TEXT, max_position_embeddings=18, type_vocab_size=1, pad_token_id=1)),
    "ModernBertForSequenceClassification": ("ModernBertConfig", dict(
        TEXT, local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2)),
    "ViTForImageClassification": ("ViTConfig", dict(IMAGE, intermediate_size=12)),
    "Dinov2WithRegistersForImageClassification": ("Dinov2WithRegistersConfig", dict(
        IMAGE, mlp_ratio=2, num_register_tokens=2)),
}


def _hf_classifier(kind, path, **labels):
    import transformers

    config_class, sizes = CLASSIFIERS[kind]
    config = getattr(transformers, config_class)(**sizes, **labels)
    getattr(transformers, kind)(config).save_pretrained(path)
    return str(path)


def _config(path):
    with open(f"{path}/config.json", encoding="utf-8") as stream:
        return json.load(stream)


@pytest.mark.parametrize("kind", sorted(CLASSIFIERS))
def test_class_names_survive_load_hf_and_save_hf(kind, tmp_path):
    import transformers

    source = _hf_classifier(kind, tmp_path / "hf", id2label=dict(enumerate(NAMES)),
                            label2id=LABEL2ID)
    model = load_hf(source)
    assert model.class_names == NAMES
    # The model's own record: kept by its config (what a .keras file holds).
    assert type(model).from_config(model.get_config()).class_names == NAMES
    saved = save_hf(model, tmp_path / "saved")
    config = _config(saved)
    assert (config["id2label"], config["label2id"]) == (ID2LABEL, LABEL2ID)
    theirs = getattr(transformers, kind).from_pretrained(saved).config
    assert theirs.id2label == dict(enumerate(NAMES)) and theirs.label2id == LABEL2ID
    # Names given to save_hf win over the model's; its record is unchanged.
    other = save_hf(model, tmp_path / "other", class_names=["a", "b", "c"])
    config = _config(other)
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"}
    assert config["label2id"] == {"a": 0, "b": 1, "c": 2}
    assert model.class_names == NAMES
    for bad in (["a", "b"], ["a", "a", "b"], "abc", ["a", "", "b"], ["a", 1, "b"]):
        with pytest.raises(ValueError, match=r"`class_names`.*Received: class_names="
                                             + re.escape(repr(bad))):
            save_hf(model, tmp_path / "bad", class_names=bad)
    assert not (tmp_path / "bad").exists()


def test_a_checkpoint_without_names_writes_label_i(tmp_path):
    # transformers' default names (LABEL_i) are no names: the model has none,
    # and save_hf writes the default again.
    model = load_hf(_hf_classifier("BertForSequenceClassification", tmp_path / "hf",
                                   num_labels=3))
    assert model.class_names is None
    config = _config(save_hf(model, tmp_path / "saved"))
    assert config["id2label"] == {str(i): f"LABEL_{i}" for i in range(3)}
    assert config["label2id"] == {f"LABEL_{i}": i for i in range(3)}


@pytest.mark.parametrize("kind", ["BertForSequenceClassification",
                                  "ViTForImageClassification"])
def test_a_label_map_that_does_not_fit_the_head_is_refused_by_name(kind, tmp_path):
    source = _hf_classifier(kind, tmp_path / "hf", id2label=dict(enumerate(NAMES)))
    good = _config(source)
    cases = [
        ({"0": "food", "1": "sport", "3": "tech"}, r"'id2label'.*Received: id2label\['3'\]='tech'"),
        ({"0": "food", "1": "sport", "x": "tech"}, r"'id2label'.*Received: id2label\['x'\]='tech'"),
        ({"0": "food", "1": "sport", "2": "food"},
         r"'id2label'.*'food' twice.*Received: id2label\['2'\]='food'"),
        ({"0": "food", "1": "sport", "2": 7}, r"'id2label'.*Received: id2label\['2'\]=7"),
        ({"0": "food", "1": "sport"}, r"'id2label' has 2 names.*3 classes"),
        (["food", "sport", "tech"], r"'id2label' must be an object"),
    ]
    for id2label, message in cases:
        # The head's size: num_labels for BERT (without it the map's length,
        # and the tensor's shape is refused); the tensor's for ViT.
        config = dict(good, id2label=id2label, num_labels=3)
        with open(f"{source}/config.json", "w", encoding="utf-8") as stream:
            json.dump(config, stream)
        with pytest.raises(ValueError, match=r"config\.json: .*" + message):
            load_hf(source)


def test_class_names_that_do_not_fit_the_model_are_refused_by_name(tmp_path):
    from keras_attn.models.bert import BertTokenClassifier
    from keras_attn.models.bert import build_bert
    from keras_attn.models.vit import ViT
    from keras_attn.models.vit import resize_vit

    sizes = dict(image_size=8, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2,
                 intermediate_dim=8)
    with pytest.raises(ValueError, match=r"no classes to name. Received: class_names=\['a'\]"):
        ViT(**sizes, class_names=["a"])
    with pytest.raises(ValueError, match=r"`class_names`: it must be a list of the model's 2 "
                                         r"classes.*Received: class_names=\['a', 'a'\]"):
        ViT(**sizes, num_classes=2, class_names=["a", "a"])
    # resize_vit keeps them (load_hf_dinov2(image_size=) resizes).
    model = ViT(**sizes, num_classes=2, class_names=("cat", "dog"))
    assert resize_vit(model, 12).class_names == ["cat", "dog"]
    backbone = build_bert("bert_tiny", vocabulary_size=20, num_layers=1, hidden_dim=8,
                          num_heads=2, intermediate_dim=8, max_sequence_length=8)
    with pytest.raises(ValueError, match=r"Received: class_names=\['B-PER'\]"):
        BertTokenClassifier(backbone, num_classes=2, class_names=["B-PER"])
    with pytest.raises(ValueError, match=r"no classifier head. Received: class_names=\['a'\]"):
        save_hf(backbone, tmp_path / "backbone", class_names=["a"])
    assert not (tmp_path / "backbone").exists()
