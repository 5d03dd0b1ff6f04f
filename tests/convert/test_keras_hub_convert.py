"""keras-hub <-> keras_attn: the same outputs (<= 1e-5) both ways, on
non-default configurations, through a keras-hub preset on disk; settings
the other package cannot express are refused by name."""

import numpy as np
import pytest

from _families import FAMILIES
from keras_attn.convert import from_keras_hub
from keras_attn.convert import to_keras_hub
from test_case import to_numpy

# Copying weights between the two packages is NumPy, the same on every
# backend (the models' outputs on JAX are tested in tests/models): tested
# once, on TensorFlow.
pytestmark = pytest.mark.backend_independent

BERT_CONFIGS = [
    dict(vocabulary_size=57, num_layers=2, num_heads=3, hidden_dim=24, intermediate_dim=40,
         max_sequence_length=20, num_segments=3, dropout=0.2),
    dict(vocabulary_size=41, num_layers=1, num_heads=4, hidden_dim=16, intermediate_dim=24,
         max_sequence_length=12, num_segments=2, dropout=0.0),
]
VIT_CONFIGS = [
    dict(image_shape=(12, 12, 1), patch_size=4, num_layers=2, num_heads=3, hidden_dim=24,
         mlp_dim=40, layer_norm_epsilon=1e-5, use_class_token=True),
    dict(image_shape=(16, 16, 3), patch_size=8, num_layers=1, num_heads=2, hidden_dim=20,
         mlp_dim=28, layer_norm_epsilon=1e-6, use_class_token=False),
]


def _randomized(model, seed):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    return model


def _bert_batch(config):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, config["vocabulary_size"], (3, 8)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    segments = rng.integers(0, config["num_segments"], (3, 8)).astype("int32")
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def _close(ours, theirs, mask=None):
    ours, theirs = to_numpy(ours), to_numpy(theirs)
    if mask is not None:
        ours, theirs = ours[mask], theirs[mask]
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("index", [0, 1])
def test_bert_backbone_both_ways_through_a_preset(index, tmp_path):
    import keras_hub

    config = BERT_CONFIGS[index]
    hub = _randomized(keras_hub.models.BertBackbone(**config), index)
    hub.save_to_preset(str(tmp_path / "preset"))
    hub = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "preset"))
    ours = from_keras_hub(hub)
    assert ours.bert_config.activation == "gelu_approximate"
    batch = _bert_batch(config)
    real = batch["padding_mask"].astype(bool)
    expected = hub(batch)
    got = ours(batch)
    _close(got["sequence_output"], expected["sequence_output"], real)
    _close(got["pooled_output"], expected["pooled_output"])
    back = to_keras_hub(ours)
    back.save_to_preset(str(tmp_path / "again"))
    back = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "again"))
    for a, b in zip(hub.weights, back.weights):
        assert a.path == b.path and np.array_equal(to_numpy(a), to_numpy(b)), a.path


@pytest.mark.parametrize("index", [0, 1])
def test_bert_classifier_both_ways(index):
    import keras_hub

    from keras_attn.models.bert import BertSequenceClassifier

    config = BERT_CONFIGS[index]
    backbone = FAMILIES["bert"].backbone(activation="gelu_approximate",
                                         attention_dropout=config["dropout"], **config)
    ours = _randomized(BertSequenceClassifier(backbone, num_classes=3 + index, dropout=0.3), index)
    hub = to_keras_hub(ours)
    assert isinstance(hub, keras_hub.models.BertTextClassifier) and hub.dropout == 0.3
    batch = _bert_batch(config)
    _close(ours(batch), hub(batch))
    again = from_keras_hub(hub)
    _close(again(batch), ours(batch))
    assert type(again).__name__ == "BertSequenceClassifier" and again.num_classes == 3 + index


@pytest.mark.parametrize("index", [0, 1])
def test_vit_both_ways_through_a_preset(index, tmp_path):
    import keras_hub

    config = VIT_CONFIGS[index]
    hub = _randomized(keras_hub.models.ViTBackbone(**config), index)
    hub.save_to_preset(str(tmp_path / "preset"))
    hub = keras_hub.models.ViTBackbone.from_preset(str(tmp_path / "preset"))
    ours = from_keras_hub(hub)
    assert ours.vit_config.pooling == ("cls" if config["use_class_token"] else "gap")
    images = np.random.default_rng(4).integers(0, 256, (2,) + config["image_shape"])
    images = images.astype("float32")
    sequence = to_numpy(hub(images / 127.5 - 1))
    pooled = sequence[:, 0] if config["use_class_token"] else sequence.mean(axis=1)
    _close(ours(images), pooled)
    back = to_keras_hub(ours)
    for a, b in zip(hub.weights, back.weights):
        assert a.path == b.path and np.array_equal(to_numpy(a), to_numpy(b)), a.path


@pytest.mark.parametrize("index", [0, 1])
def test_vit_classifier_both_ways(index):
    import keras_hub

    config = VIT_CONFIGS[index]
    hub = keras_hub.models.ViTImageClassifier(
        keras_hub.models.ViTBackbone(**config), num_classes=5, preprocessor=None,
        pooling="token" if config["use_class_token"] else "gap")
    hub = _randomized(hub, index)
    ours = from_keras_hub(hub)
    images = np.random.default_rng(5).integers(0, 256, (2,) + config["image_shape"])
    images = images.astype("float32")
    _close(ours(images), hub(images / 127.5 - 1))
    back = to_keras_hub(ours)
    _close(back(images / 127.5 - 1), ours(images))


def test_what_keras_hub_cannot_express_is_refused_by_name():
    import keras_hub

    from keras_attn.models import enable_lora
    from keras_attn.models.bert import BertTokenClassifier

    bert = FAMILIES["bert"]
    exact = bert.backbone(**dict(BERT_CONFIGS[1], dropout=0.1))
    with pytest.raises(ValueError, match="activation='gelu'.*Received: activation='gelu'"):
        to_keras_hub(exact)
    approximate = bert.backbone(activation="gelu_approximate",
                                **dict(BERT_CONFIGS[1], dropout=0.1))  # attention_dropout 0.1 too
    to_keras_hub(approximate)
    with pytest.raises(ValueError, match="attention_dropout=0.3"):
        to_keras_hub(bert.backbone(activation="gelu_approximate", attention_dropout=0.3,
                                   **dict(BERT_CONFIGS[1], dropout=0.1)))
    pre_logits = keras_hub.models.ViTImageClassifier(
        keras_hub.models.ViTBackbone(**VIT_CONFIGS[0]), num_classes=3, preprocessor=None,
        intermediate_dim=8)
    with pytest.raises(ValueError, match="intermediate_dim=8"):
        from_keras_hub(pre_logits)
    enable_lora(approximate, 2)
    with pytest.raises(ValueError, match="LoRA.*merge_lora"):
        to_keras_hub(approximate)
    with pytest.raises(ValueError, match="model=object"):
        to_keras_hub(object())
    with pytest.raises(ValueError, match="model=BertTokenClassifier"):
        from_keras_hub(BertTokenClassifier(exact, num_classes=2))
