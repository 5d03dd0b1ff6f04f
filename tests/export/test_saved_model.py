"""SavedModel export of a model built from the layers.

TensorFlow backend only (`tf_only`): the other backends refuse to export
(tests/export/test_backend_check.py).
"""

import keras
import numpy as np
import pytest
from keras import ops

from _families import FAMILIES
from keras_attn import layers
from keras_attn.export import export_saved_model

pytestmark = pytest.mark.tf_only


def tiny_encoder_decoder():
    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_ids")
    embedding = keras.layers.Embedding(40, 16, name="embedding")

    def embed(ids, positions):
        x = embedding(ids) * 4.0
        return x + positions(x)

    enc = embed(source, layers.SinusoidalPositionalEncoding())
    enc = layers.TransformerBlock(2, 32, name="encoder_0")(enc, padding_mask=source != 0)
    enc = layers.TransformerBlock(2, 32, norm_position="pre", name="encoder_1")(enc, padding_mask=source != 0)
    dec = embed(target, layers.PositionEmbedding(16))
    dec = layers.TransformerDecoderBlock(2, 32, name="decoder_0")(
        dec, enc, decoder_padding_mask=target != 0, encoder_padding_mask=source != 0
    )
    logits = keras.layers.Dense(40, name="logits")(dec)
    return keras.Model([source, target], logits)


def test_saved_model_serves_any_batch_and_length(tmp_path):
    import tensorflow as tf

    model = tiny_encoder_decoder()
    path = export_saved_model(model, tmp_path / "saved")
    loaded = tf.saved_model.load(str(path))
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        for length in (1, 7):
            src = rng.integers(1, 40, (batch, length)).astype("int32")
            tgt = rng.integers(1, 40, (batch, length)).astype("int32")
            src[0, length // 2 + 1 :] = 0  # some padding
            want = ops.convert_to_numpy(model([src, tgt]))
            got = loaded.serve(src, tgt).numpy()
            assert got.shape == (batch, length, 40)
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_export_replaces_an_existing_model_atomically(tmp_path):
    import tensorflow as tf

    model = tiny_encoder_decoder()
    path = tmp_path / "saved"
    export_saved_model(model, path)
    # A sibling named like the old move-aside (saved.old) is someone else's.
    (tmp_path / "saved.old").mkdir()
    (tmp_path / "saved.old" / "keep.txt").write_text("kept")
    second = tiny_encoder_decoder()  # different random weights
    export_saved_model(second, path)
    ids = np.array([[3, 4, 5]], "int32")
    loaded = tf.saved_model.load(str(path))  # keep a reference: it owns the variables
    got = loaded.serve(ids, ids).numpy()
    np.testing.assert_allclose(got, ops.convert_to_numpy(second([ids, ids])), atol=1e-5)
    assert (tmp_path / "saved.old" / "keep.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved", "saved.old"]  # no leftovers
    # What the replaced directory may hold is what the export writes: a file
    # added beside the model (TF Serving's assets.extra) makes it refused.
    (path / "assets.extra").mkdir()
    (path / "assets.extra" / "tf_serving_warmup_requests").write_text("mine")
    with pytest.raises(ValueError, match="is not a SavedModel .*the export does not write "
                                         "'assets.extra'"):
        export_saved_model(second, path)
    assert (path / "assets.extra" / "tf_serving_warmup_requests").read_text() == "mine"
    assert (path / "saved_model.pb").is_file()


def test_a_directory_that_is_not_a_saved_model_is_refused_and_kept(tmp_path):
    import json
    import re

    model = tiny_encoder_decoder()
    foreign = tmp_path / "photos"
    foreign.mkdir()
    for index in range(7):
        (foreign / f"img{index}.jpg").write_bytes(b"\xff\xd8" * (index + 1))
    portable = tmp_path / "onnx"  # an ONNX export is another kind: refused too
    portable.mkdir()
    (portable / "serving.json").write_text(json.dumps({"format": "onnx"}))
    (portable / "model.onnx").write_bytes(b"onnx")
    cases = [
        (foreign, "it has no saved_model.pb", "'img0.jpg', 'img1.jpg', 'img2.jpg', 'img3.jpg', "
                                              "'img4.jpg' and 2 more"),
        (portable, "it has no saved_model.pb", "'model.onnx', 'serving.json'"),
    ]
    for path, reason, shown in cases:
        before = {p.name: p.read_bytes() for p in path.iterdir()}
        with pytest.raises(ValueError, match=re.escape(
                f"`path` {path} is not empty and is not a SavedModel (saved_model.pb, "
                f"fingerprint.pb, variables/, assets/, run.json) ({reason}): it holds {shown}. Nothing "
                f"was changed") + r".*" + re.escape(f"Received: path={str(path)!r}")):
            export_saved_model(model, path)
        assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    link = tmp_path / "link"
    link.symlink_to(foreign)
    with pytest.raises(ValueError, match="must be a directory, not a symbolic link"):
        export_saved_model(model, link)
    assert len(list(foreign.iterdir())) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "onnx", "photos"]


def test_an_empty_batch_or_length_is_refused_naming_the_input(tmp_path):
    import pytest
    import tensorflow as tf

    loaded = tf.saved_model.load(str(export_saved_model(tiny_encoder_decoder(),
                                                        tmp_path / "saved")))
    ids = np.ones((2, 3), "int32")
    for source, message in ((ids[:0], "`source_ids` holds no example"),
                            (ids[:, :0], "`source_ids` has length 0")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            loaded.serve(source, ids[: len(source)])
    assert loaded.serve(ids, ids).shape == (2, 3, 40)


def _tiny_bert(kind):
    """A tiny `BertBackbone`, or a `BertSequenceClassifier` on one (int8
    with `quantize`): models called with a dict. One block: each block is
    the same code in the traced graph, which tracing and saving take time
    with."""
    from keras_attn.models import BertSequenceClassifier

    keras.utils.set_random_seed(3)
    # the table's, one block; the 40-word vocabulary `_bert_inputs` draws from
    backbone = FAMILIES["bert"].backbone(vocabulary_size=40, num_layers=1)
    if kind == "backbone":
        return backbone
    classifier = BertSequenceClassifier(backbone, num_classes=3)
    if kind == "classifier_int8":
        classifier.quantize("int8")
    return classifier


def _bert_inputs(batch, length, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), "int32")
    mask[0, length // 2 + 1:] = 0  # a padded row
    return {"token_ids": rng.integers(1, 40, (batch, length)).astype("int32"),
            "segment_ids": (np.arange(length) >= length // 2).astype("int32")[None].repeat(batch, 0),
            "padding_mask": mask}


@pytest.mark.parametrize("kind, atol", [("backbone", 1e-5), ("classifier", 1e-5),
                                        ("classifier_int8", 1e-5)])
def test_models_that_take_a_dict_export_and_serve_the_same_outputs(kind, atol, tmp_path):
    import tensorflow as tf

    model = _tiny_bert(kind)
    loaded = tf.saved_model.load(str(export_saved_model(model, tmp_path / "saved")))
    signature = loaded.signatures["serving_default"]
    for batch, length in ((1, 3), (3, 9)):
        inputs = _bert_inputs(batch, length)
        want = model(inputs, training=False)
        got = loaded.serve({k: tf.constant(v) for k, v in inputs.items()})
        by_name = signature(**{k: tf.constant(v) for k, v in inputs.items()})
        if isinstance(want, dict):  # the backbone: sequence_output and pooled_output
            assert sorted(got) == sorted(want) == ["pooled_output", "sequence_output"]
            pairs = [(got[k], want[k]) for k in want] + [(by_name[k], want[k]) for k in want]
        else:  # the classifier's logits
            (named,) = by_name.values()
            pairs = [(got, want), (named, want)]
        for served, keras_output in pairs:
            assert tuple(served.shape) == tuple(keras_output.shape)
            np.testing.assert_allclose(served.numpy(), ops.convert_to_numpy(keras_output),
                                       atol=atol, rtol=0)
    if kind == "classifier_int8":  # int8 kernels, not the float ones
        assert any(v.dtype == tf.int8 for v in loaded.variables)
    empty = {k: tf.constant(v[:0]) for k, v in _bert_inputs(2, 4).items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match="`padding_mask` holds no example"):
        loaded.serve(empty)


def test_the_conformer_takes_its_dict_too(tmp_path):
    import tensorflow as tf

    model = FAMILIES["conformer"].build(num_layers=1)
    inputs = {"waveform": np.random.default_rng(0).normal(0, 0.1, (2, 4000)).astype("float32"),
              "waveform_length": np.array([4000, 3000], "int32")}
    loaded = tf.saved_model.load(str(export_saved_model(model, tmp_path / "saved")))
    got = loaded.serve({k: tf.constant(v) for k, v in inputs.items()})
    want = model(inputs, training=False)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key].numpy(), ops.convert_to_numpy(want[key]), atol=1e-5)
