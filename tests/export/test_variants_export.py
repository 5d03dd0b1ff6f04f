"""The variants of issue 58 deploy as their families do: a ModernBERT
classifier as a SavedModel and in LiteRT, a DINOv2-with-registers image
classifier (registers, LayerScale, SwiGLU, the [CLS] + mean-patch head) in
ONNX Runtime, each scored against Keras. One runtime per variant, the
cheaper conversion of each (tf2onnx takes ~4x the LiteRT converter's time
on the tiny ModernBERT); both formats convert the same TensorFlow graph.
LoRA and int8 are in tests/models/test_lora.py and test_quantize.py (every
backend)."""

import keras
import numpy as np
import pytest

from _families import TABLE
from _families import VARIANTS
from keras_attn.export import export_image_classifier
from keras_attn.export import export_saved_model
from keras_attn.export import export_text_classifier
from keras_attn.export.portable import Artifact
from keras_attn.export.portable import export_portable
from test_case import to_numpy

pytestmark = pytest.mark.tf_only


def _randomized(model, seed=0):
    """Trained-looking weights: the heads start at zero, LayerScale at one
    value."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(variable.dtype))
    return model


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_text_backbones_hold_no_constant_tensor_an_export_would_capture(family):
    # An empty row's NaN was a tensor made on the functional graph's
    # symbolic inputs, held by the graph as a constant: TensorFlow's trace
    # captured it and tf2onnx made it an ONNX input ("bert_backbone_1/
    # SelectV2_4/t:0") that serving.json does not name, so Artifact refused
    # the file (tests/export/test_portable.py's dict-input ONNX test).
    import tensorflow as tf

    model = TABLE[family].backbone(num_layers=1)
    specs = {name: tf.TensorSpec((None, None), tf.int32) for name in model.input}
    traced = tf.function(lambda x: model(x, training=False)).get_concrete_function(specs)
    assert [t for t in traced.captured_inputs if t.dtype != tf.resource] == []


def _softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.slow
def test_modernbert_classifier_scores_as_in_keras_as_a_saved_model_and_in_litert(tmp_path):
    import tensorflow as tf

    modernbert = TABLE["modernbert"]
    model = _randomized(modernbert.build())
    # 9 tokens (past the local window of 4) with padding, and 5.
    x = modernbert.inputs(size=3, length=9, fill="zeros")
    short = {name: value[:, :5] for name, value in x.items()}
    expected = [_softmax(to_numpy(model(batch))) for batch in (x, short)]
    assert np.ptp(expected[0], axis=0).max() > 1e-3  # the rows get different answers

    saved = tf.saved_model.load(str(export_saved_model(model, tmp_path / "saved")))
    logits = saved.serve({name: tf.constant(value) for name, value in x.items()}).numpy()
    np.testing.assert_allclose(_softmax(logits), expected[0], atol=1e-4)

    # No tokenizer: the served inputs are the token ids and padding mask;
    # export_text_classifier (a tokenizer in the graph or its tokenizer.json
    # beside) refuses it by name.
    with pytest.raises(ValueError, match="`tokenizer` must be a keras_hub.tokenizers."
                                         "WordPieceTokenizer.*Received: tokenizer=NoneType"):
        export_text_classifier(model, None, tmp_path / "text", sequence_length=8,
                               format="litert")
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in x}
    probabilities = keras.ops.softmax(model(inputs, training=False), axis=-1)
    serving = keras.Model(inputs, {"probabilities": probabilities})
    artifact = Artifact(export_portable(serving, tmp_path / "litert", "litert"))
    assert sorted(artifact.input_names) == ["padding_mask", "token_ids"]
    for batch, want in zip((x, short), expected):
        np.testing.assert_allclose(artifact(**batch)["probabilities"], want, atol=1e-4)
    # A row of padding only: NaN, as in the graph in Keras (docs/bad_input.md).
    empty = dict(x, padding_mask=np.concatenate([x["padding_mask"][:1], 0 * x["padding_mask"][1:]]))
    got = artifact(**empty)["probabilities"]
    assert np.isnan(got[1:]).all()
    np.testing.assert_allclose(got[0], expected[0][0], atol=1e-4)


@pytest.mark.slow
def test_dinov2_image_classifier_scores_as_in_keras_in_onnx_runtime(tmp_path):
    dinov2 = VARIANTS["dinov2"]
    model = _randomized(dinov2.build())
    images = dinov2.inputs(size=3)
    expected = _softmax(to_numpy(model(images.astype("float32"))))
    assert np.ptp(expected, axis=0).max() > 1e-3

    path = export_image_classifier(model, tmp_path / "onnx", format="onnx",
                                   class_names=["a", "b", "c"])
    artifact = Artifact(path)
    assert artifact.labels == ["a", "b", "c"]
    np.testing.assert_allclose(artifact(images=images)["probabilities"], expected, atol=1e-4)
