"""The converters' registry: `load_hf` and `save_hf` reach every family, a
subclass of a registered model and a family registered later through it alone,
and refuse what no converter reads or writes by name."""

import dataclasses
import json

import keras
import numpy as np
import pytest

from _families import TABLE
from keras_attn.convert import _registry
from keras_attn.convert import load_hf
from keras_attn.convert import save_hf
from test_case import to_numpy

pytestmark = pytest.mark.backend_independent  # dispatch and files: no backend's arithmetic

# What load_hf read before the registry (hf.py's hand-kept tables), by family.
_BERT = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification")
_ROBERTA = ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
            "RobertaForTokenClassification")
ARCHITECTURES = {
    **{name: "bert" for name in _BERT + _ROBERTA + tuple("XLM" + n for n in _ROBERTA)},
    "ViTModel": "vit", "ViTForImageClassification": "vit", "MarianMTModel": "marian",
    "ModernBertModel": "modernbert", "ModernBertForMaskedLM": "modernbert",
    "ModernBertForSequenceClassification": "modernbert",
    "Dinov2WithRegistersModel": "dinov2", "Dinov2WithRegistersForImageClassification": "dinov2",
    "ParakeetForCTC": "parakeet", "ParakeetForRNNT": "parakeet", "ParakeetForTDT": "parakeet",
}
MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "vit": "vit",
               "marian": "marian", "modernbert": "modernbert",
               "dinov2_with_registers": "dinov2", "parakeet_ctc": "parakeet",
               "parakeet_rnnt": "parakeet", "parakeet_tdt": "parakeet"}


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test (which may add to it)."""
    _registry.converters()
    monkeypatch.setattr(_registry, "_CONVERTERS", dict(_registry._CONVERTERS))
    return _registry._CONVERTERS


def _config(tmp_path, **fields):
    (tmp_path / "config.json").write_text(json.dumps(fields))
    return tmp_path


def test_every_registered_architecture_dispatches_to_its_family(tmp_path, registry):
    assert set(_registry.architectures()) == set(ARCHITECTURES)
    for name, converter in list(registry.items()):  # each loader replaced by its name
        registry[name] = dataclasses.replace(converter, load=lambda directory, n=name: n)
    for architecture, family in ARCHITECTURES.items():
        assert load_hf(_config(tmp_path, architectures=[architecture])) == family, architecture
    for model_type, family in MODEL_TYPES.items():
        assert load_hf(_config(tmp_path, model_type=model_type)) == family, model_type


def test_each_tiny_model_is_written_by_one_family():
    writers = {}
    for name in ("bert", "vit", "dinov2", "modernbert", "conformer", "transformer"):
        model = TABLE[name].build()
        writers[name] = [c.name for c in _registry.converters()
                         if c.save is not None and c.writes(model)]
    assert writers == {"bert": ["bert"], "vit": ["vit"], "dinov2": ["dinov2"],
                       "modernbert": ["modernbert"], "conformer": ["parakeet"],
                       "transformer": []}


def test_a_subclass_of_a_registered_model_saves_through_save_hf(tmp_path):
    from keras_attn.models import BertSequenceClassifier

    class MyClassifier(BertSequenceClassifier):
        pass

    family = TABLE["bert"]
    keras.utils.set_random_seed(1)
    model = MyClassifier(family.backbone(), num_classes=3, class_names=["a", "b", "c"])
    path = save_hf(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"}
    back = load_hf(path)
    assert type(back) is BertSequenceClassifier and back.class_names == ["a", "b", "c"]
    x, _ = family.batch(size=2)
    np.testing.assert_array_equal(to_numpy(back(x)), to_numpy(model(x)))


def test_a_family_registered_later_is_reached_by_load_hf_and_save_hf(tmp_path, registry):
    class FakeModel:
        pass

    calls = []
    _registry.register(_registry.Converter(  # the one line a new family adds
        "fake", ("FakeForTesting",), ("fake",), load=lambda d: ("loaded", d),
        save=lambda m, d, overwrite=False, **o: calls.append((m, d, overwrite, o)) or d,
        writes=lambda m: isinstance(m, FakeModel), models=("FakeModel",)))
    directory = str(_config(tmp_path, architectures=["FakeForTesting"]))
    assert load_hf(directory) == ("loaded", directory)
    assert load_hf(_config(tmp_path, model_type="fake"))[0] == "loaded"
    model = FakeModel()
    assert save_hf(model, "out", overwrite=True, flag=1) == "out"
    assert calls == [(model, "out", True, {"flag": 1})]
    with pytest.raises(ValueError, match=r"Converter 'other' claims what 'fake' reads. "
                                         r"Received: \['FakeForTesting'\]"):
        _registry.register(_registry.Converter("other", ("FakeForTesting",), (), load=print))


def test_what_no_converter_reads_or_writes_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"architecture 'GPT2LMHeadModel' of .*config.json: "
                                         r"load_hf reads the architectures \['BertForMaskedLM'"):
        load_hf(_config(tmp_path, architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    with pytest.raises(ValueError, match=r"model_type 'llama' \(and no 'architectures'\)"):
        load_hf(_config(tmp_path, model_type="llama"))
    transformer = TABLE["transformer"].build()
    with pytest.raises(ValueError, match=r"save_hf writes the models BertBackbone, .*ViT.*"
                                         r"Received: model=Transformer"):
        save_hf(transformer, tmp_path / "out")
    assert not (tmp_path / "out").exists()
