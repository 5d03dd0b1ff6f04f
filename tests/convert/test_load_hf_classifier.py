"""`load_hf(directory, num_classes=N)` (or `class_names=[...]`): the family's
classifier over the checkpoint's encoder from any of its directories (a base
model, a masked LM, a classifier), the checkpoint's own head where it has N
outputs; as transformers' `from_pretrained(num_labels=N,
ignore_mismatched_sizes=True)`."""

import numpy as np
import pytest

from test_hf_labels import IMAGE  # the same tiny sizes
from test_hf_labels import TEXT
from keras_attn.convert import load_hf

# Reading a directory is the same on every backend.
pytestmark = pytest.mark.backend_independent

# transformers' class -> (its config class, tiny sizes, the encoder's output
# of the classifier keras_attn builds, read from transformers' base model)
SOURCES = {
    "BertForMaskedLM": ("BertConfig", dict(TEXT, max_position_embeddings=16)),
    "RobertaModel": ("RobertaConfig", dict(TEXT, max_position_embeddings=18, type_vocab_size=1,
                                           pad_token_id=1)),
    "ModernBertModel": ("ModernBertConfig", dict(TEXT, local_attention=4, pad_token_id=0,
                                                 bos_token_id=1, eos_token_id=2,
                                                 cls_token_id=1, sep_token_id=2)),
    "ViTModel": ("ViTConfig", dict(IMAGE, intermediate_size=12)),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(IMAGE, mlp_ratio=2,
                                                                    num_register_tokens=2)),
}


def _save(kind, path, **extra):
    import transformers

    config_class, sizes = SOURCES.get(kind.replace("ForSequenceClassification", "Model"),
                                      SOURCES.get(kind, (None, None)))
    if config_class is None:
        config_class, sizes = SOURCES["BertForMaskedLM"]
    config = getattr(transformers, config_class)(**sizes, **extra)
    getattr(transformers, kind)(config).save_pretrained(path)
    return str(path)


def _inputs(model):
    if hasattr(model, "vit_config"):
        return np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3)).astype("uint8")
    ids = np.array([[1, 5, 6, 7, 2, 0], [1, 9, 2, 0, 0, 0]], "int32")
    inputs = {"token_ids": ids, "padding_mask": (ids != 0).astype("int32")}
    if "segment_ids" in [t.name for t in model.inputs]:
        inputs["segment_ids"] = np.zeros_like(ids)
    return inputs


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_new_head_over_the_checkpoints_encoder(kind, tmp_path):
    source = _save(kind, tmp_path / "hf")
    model = load_hf(source, num_classes=3)
    # The family's classifier, 3 outputs; its encoder the checkpoint's: the
    # same weights as the plain load's, by path (the head aside).
    plain = load_hf(source)
    assert model.count_params() > 0
    logits = np.asarray(model.predict(_inputs(model), verbose=0))
    assert logits.shape == (2, 3) and np.isfinite(logits).all()
    ours = {w.path: np.asarray(w) for w in model.weights}
    theirs = {w.path: np.asarray(w) for w in plain.weights}
    shared = [p for p in theirs if p in ours and "classifier" not in p and "pooled" not in p]
    assert len(shared) >= 8 and any("embedding" in p for p in shared), shared
    for path in shared:
        np.testing.assert_array_equal(ours[path], theirs[path], err_msg=path)
    named = load_hf(source, class_names=["food", "sport", "tech"])
    assert named.class_names == ["food", "sport", "tech"]


def test_the_checkpoints_own_head_where_it_has_n_outputs(tmp_path):
    import torch
    import transformers

    source = _save("BertForSequenceClassification", tmp_path / "hf", num_labels=3,
                   id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2})
    model = load_hf(source, num_classes=3)
    assert model.class_names == ["a", "b", "c"]
    hf = transformers.BertForSequenceClassification.from_pretrained(source).eval()
    inputs = _inputs(model)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
                      attention_mask=torch.tensor(inputs["padding_mask"])).logits.numpy()
    np.testing.assert_allclose(model.predict(inputs, verbose=0), expected, atol=1e-5)
    # New names for its outputs: renamed, the same answers.
    renamed = load_hf(source, class_names=["x", "y", "z"])
    assert renamed.class_names == ["x", "y", "z"]
    np.testing.assert_allclose(renamed.predict(inputs, verbose=0), expected, atol=1e-5)
    # Its own names in another order (a folder's): the outputs follow them.
    reordered = load_hf(source, class_names=["c", "a", "b"])
    assert reordered.class_names == ["c", "a", "b"]
    np.testing.assert_allclose(reordered.predict(inputs, verbose=0), expected[:, [2, 0, 1]],
                               atol=1e-5)
    # Renaming "b"'s output "a" would answer b's score as a's: refused.
    with pytest.raises(ValueError, match=r"`class_names`: .* names its outputs \['a', 'b', "
                                         r"'c'\].*'a' \(its output 0, here 1\).*Received: "
                                         r"class_names=\['x', 'a', 'y'\]"):
        load_hf(source, class_names=["x", "a", "y"])
    with pytest.warns(UserWarning, match=r"classifier has 3 outputs; a new head of num_classes=5"):
        assert load_hf(source, num_classes=5).num_classes == 5


def test_bad_arguments_and_a_family_without_a_classifier_are_refused(tmp_path):
    source = _save("ViTModel", tmp_path / "vit")
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"argument `num_classes`.*Received: num_classes="):
            load_hf(source, num_classes=bad)
    with pytest.raises(ValueError, match=r"`class_names`.*Received: class_names=\['a', 'a'\]"):
        load_hf(source, class_names=["a", "a"])
    with pytest.raises(ValueError, match=r"`class_names`.*Received: class_names=\['a'\]"):
        load_hf(source, num_classes=2, class_names=["a"])
    with pytest.raises(ValueError, match=r"`class_names`.*Received: class_names=\[\]"):
        load_hf(source, class_names=[])
    # A family with no classifier: refused by name before any weight is read.
    speech = tmp_path / "parakeet"
    speech.mkdir()
    (speech / "config.json").write_text('{"architectures": ["ParakeetForCTC"]}')
    with pytest.raises(ValueError, match=r"the parakeet family of .* has no classifier .*"
                                         r"Received: num_classes=3"):
        load_hf(str(speech), num_classes=3)
