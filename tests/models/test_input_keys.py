"""A dict of inputs is read by name, in every model family, on every backend.

Keras's `Functional` reads a dict by its sorted keys: an extra key (a Hugging
Face `attention_mask`, the `labels`) moved every input after it into another's
place, a wrong answer with only a warning. A key the model does not read is
refused by name (`GuardedModel.check_input_keys`, docs/bad_input.md), as is a
missing one: eagerly, and inside a compiled `predict` or `fit` (fed by a
generator, which nothing checks ahead: the keys are structure, so the check
raises while the step is traced). The table's tiny models, one block each.
"""

import numpy as np
import pytest

from _families import FAMILIES
from _families import NAMES
from _families import outputs
from keras_attn.models import BertPretrainer
from keras_attn.models import BertTokenClassifier



def _family(name):
    """The family's tiny task model and `(x, y)`, `x` a dict of its inputs."""
    family = FAMILIES[name]
    overrides = {} if name == "transformer" else {"num_layers": 1}
    model = family.build(**overrides)
    x, y = family.batch(size=2, padded=False, **overrides)
    if name == "vit":
        x = {"images": x}
    elif name == "transformer":
        x = {"source_ids": x[0], "target_ids": x[1]}
    return model, x, y


def _bert_models():
    """Every BERT model (the backbone and each task) and a dict of its inputs."""
    bert = FAMILIES["bert"]
    backbone = bert.backbone(num_layers=1)
    x, _ = bert.batch(size=2, padded=False)
    pretrainer_x = dict(x, mask_positions=np.array([[1, 2], [3, 0]], "int32"))
    return {
        "backbone": (backbone, x),
        "sequence_classifier": (bert.build(num_layers=1), x),
        "token_classifier": (BertTokenClassifier(backbone, num_classes=3), x),
        "pretrainer": (BertPretrainer(backbone), pretrainer_x),
    }


def _refused(keys):
    """The message of a dict holding the unknown `keys`."""
    return rf"does not read {keys!r}".replace("[", r"\[").replace("]", r"\]")


def _compiled(model, x, y=None):
    """`predict`, then a `fit` step, on one batch from a generator: no check
    in Python sees the data ahead of the compiled step."""
    with pytest.raises(ValueError) as predicted:
        model.predict(((x,) for _ in range(1)), steps=1, verbose=0)
    model.compile(optimizer="adam")
    with pytest.raises(ValueError) as fitted:
        model.fit(((x, y) for _ in range(1)), steps_per_epoch=1, shuffle=False, verbose=0)
    return str(predicted.value), str(fitted.value)


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_key_is_refused_by_name_eagerly_and_compiled(name):
    model, x, y = _family(name)
    extra = dict(x, attention_mask=np.zeros((2, 3), "int32"))
    with pytest.raises(ValueError, match=_refused(["attention_mask"]) + ".*Received: inputs "
                       r"with keys \['attention_mask'"):
        model(extra)
    with pytest.raises(ValueError, match=_refused(["attention_mask"])):
        model.evaluate(extra, y, verbose=0)  # arrays: checked before the step
    for message in _compiled(model, extra, y):
        assert "does not read ['attention_mask']" in message, message


@pytest.mark.parametrize("which", ["backbone", "sequence_classifier", "token_classifier",
                                   "pretrainer"])
def test_every_bert_model_refuses_an_unknown_key(which):
    model, x = _bert_models()[which]
    with pytest.raises(ValueError, match=_refused(["attention_mask"])) as refused:
        model(dict(x, attention_mask=np.ones_like(x["token_ids"])))
    assert repr(model.name) in str(refused.value)


@pytest.mark.parametrize("name, key", [("bert", "segment_ids"), ("vit", "images"),
                                       ("transformer", "target_ids"),
                                       ("conformer", "waveform_length")])
def test_a_missing_key_is_refused_by_name(name, key):
    model, x, y = _family(name)
    partial = {k: v for k, v in x.items() if k != key}
    if not partial:  # ViT's one input, under another name
        partial = {"pixels": x[key]}
    with pytest.raises(ValueError, match=rf"\['{key}'\] missing"):
        model(partial)
    for message in _compiled(model, partial, y):
        assert f"['{key}'] missing" in message, message


def test_the_refusal_names_the_input_given():
    """`positions` given to a classifier (which reads no packed rows) was
    reported as segment ids out of range, `labels` given to ConformerCTC as
    a waveform length of the wrong shape."""
    classifier, x, _ = _family("bert")
    positions = np.tile(np.arange(x["token_ids"].shape[1], dtype="int32"), (2, 1))
    with pytest.raises(ValueError, match=_refused(["positions"])):
        classifier(dict(x, positions=positions))
    conformer, x, y = _family("conformer")
    with pytest.raises(ValueError, match=_refused(["labels"])):
        conformer(dict(x, labels=y))


def test_the_packed_inputs_are_still_read():
    """The optional inputs of packed rows (docs/packing.md) are keys the
    backbone takes: two examples packed in one row give a finite answer."""
    backbone, x = _bert_models()["backbone"]
    length = x["token_ids"].shape[1]
    half = length // 2
    segments = np.array([[1] * half + [2] * (length - half)] * 2, "int32")
    positions = np.array([list(range(half)) + list(range(length - half))] * 2, "int32")
    for output in outputs(backbone, dict(x, packed_segment_ids=segments, positions=positions)):
        assert np.all(np.isfinite(output))
