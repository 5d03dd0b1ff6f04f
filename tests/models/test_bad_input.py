"""Bad data never reaches the weights, on every backend.

Each family, tiny: concrete bad inputs and labels are a `ValueError` that
names the input, the value and the range; the same data inside a compiled
step (fed by a generator, which nothing checks ahead) makes the loss NaN,
the step changes no weight and no optimizer state, and `fit` ends with
`NonFiniteLossError`. Runs in CI's TensorFlow and JAX passes.
"""

import keras
import numpy as np
import pytest

from keras_attn._guard import NonFiniteLossError
from keras_attn._guard import SkipNonFiniteSteps
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import build_bert
from keras_attn.models.conformer import build_conformer
from keras_attn.models.transformer import build_transformer
from keras_attn.models.vit import build_vit

V = 40


def bert_classifier():
    backbone = build_bert("bert_tiny", vocabulary_size=V, num_layers=1, hidden_dim=16,
                          num_heads=2, intermediate_dim=32, max_sequence_length=12)
    model = BertSequenceClassifier(backbone, num_classes=3)
    model.compile(optimizer="adam")
    return model


def bert_data(batch=4, length=8):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, V, (batch, length)).astype("int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
         "padding_mask": np.ones_like(ids)}
    return x, rng.integers(0, 3, (batch,)).astype("int32")


def transformer(**overrides):
    model = build_transformer("transformer_base", vocabulary_size=V, hidden_dim=16,
                              intermediate_dim=32, num_heads=2, num_encoder_layers=1,
                              num_decoder_layers=1, **overrides)
    model.compile(optimizer="adam")
    return model


def transformer_data(batch=4, source_length=7, target_length=6):
    rng = np.random.default_rng(0)
    source = rng.integers(1, V, (batch, source_length)).astype("int32")
    target = rng.integers(1, V, (batch, target_length + 1)).astype("int32")
    return [source, target[:, :-1]], target[:, 1:]


def conformer():
    model = build_conformer("conformer_tiny", vocabulary_size=5, num_layers=1,
                            hidden_dim=16, num_heads=2, intermediate_dim=32)
    model.compile(optimizer="adam")
    return model


def conformer_data(batch=2, samples=8000):
    rng = np.random.default_rng(0)
    x = {"waveform": (rng.normal(size=(batch, samples)) * 0.1).astype("float32"),
         "waveform_length": np.full((batch,), samples, "int32")}
    return x, rng.integers(1, 6, (batch, 3)).astype("int32")


def vit():
    model = build_vit("vit_tiny_16", num_classes=3, image_size=8, patch_size=4,
                      num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


def vit_data(batch=4):
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (batch, 8, 8, 3)).astype("uint8"),
            rng.integers(0, 3, (batch,)).astype("int32"))


def _state(model, non_trainable=True):
    """Weights and optimizer state (iterations and moments), not the dropout
    seed, which any forward pass advances."""
    weights = model.weights if non_trainable else model.trainable_weights
    variables = list(weights) + [
        v for v in model.optimizer.variables if v is not model.optimizer.skipped_steps
    ]
    return {v.path: keras.ops.convert_to_numpy(v).copy() for v in variables}


def _fit_compiled(model, x, y):
    """`fit` on one batch from a generator: nothing is checked in Python,
    the compiled step alone sees the data."""
    x = tuple(x) if isinstance(x, list) else x
    return model.fit(((x, y) for _ in range(1)), steps_per_epoch=1, verbose=0)


# PyTorch runs the train step eagerly: the input check of the model's call
# raises there, before the step, as it does outside `fit` on every backend.
EAGER_STEP = keras.backend.backend() == "torch"


def _assert_step_skipped(model, x, y, non_trainable=True, input_error=None):
    """The step on `(x, y)` changes no weight: it is skipped (a NaN loss), or,
    for bad inputs (`input_error`: the check's message) where the step runs
    eagerly, refused with that `ValueError` before it starts."""
    _fit_compiled(model, *good_data(model))  # builds the optimizer; a real step
    before = _state(model, non_trainable)
    skipped = int(keras.ops.convert_to_numpy(model.optimizer.skipped_steps))
    refused = EAGER_STEP and input_error is not None
    if refused:
        with pytest.raises(ValueError, match=input_error) as raised:
            _fit_compiled(model, x, y)
        assert not isinstance(raised.value, NonFiniteLossError)
    else:
        with pytest.raises(NonFiniteLossError,
                           match="the loss is nan.*weights are those before it"):
            _fit_compiled(model, x, y)
    after = _state(model, non_trainable)
    assert before.keys() == after.keys() and len(before) > 10
    for path in before:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)
    counted = int(keras.ops.convert_to_numpy(model.optimizer.skipped_steps))
    assert counted == skipped + (0 if refused else 1)


def good_data(model):
    if isinstance(model, BertSequenceClassifier):
        return bert_data()
    if model.name == "vit":
        return vit_data()
    if hasattr(model, "transformer_config"):
        return transformer_data()
    return conformer_data()


def _label(y, value):
    """`y` with its first label replaced by `value`."""
    y = y.copy()
    y.flat[0] = value
    return y


def _with(x, name, index, value):
    x = dict(x)
    x[name] = x[name].copy()
    x[name][index] = value
    return x


# === Concrete data: a ValueError naming the input and the range ===


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("token_ids", V, r"`token_ids` must lie in \[0, 40\).*out of range: 40"),
        ("token_ids", -1, r"`token_ids` must lie in \[0, 40\).*out of range: -1"),
        ("segment_ids", -1, r"`segment_ids` must lie in \[0, 2\).*-1"),
        ("segment_ids", 5, r"`segment_ids` must lie in \[0, 2\).*5"),
        ("padding_mask", 0.4, r"`padding_mask` must be boolean or hold only 0 and 1.*0.4"),
    ],
)
def test_bert_refuses_bad_concrete_inputs_in_every_entry_point(name, value, message):
    model = bert_classifier()
    x, y = bert_data()
    if name == "padding_mask":
        x = dict(x, padding_mask=x["padding_mask"].astype("float32"))
    bad = _with(x, name, (0, 3), value)
    for call in (lambda: model(bad), lambda: model.predict(bad, verbose=0),
                 lambda: model.evaluate(bad, y, verbose=0),
                 lambda: model.fit(bad, y, verbose=0)):
        with pytest.raises(ValueError, match=message):
            call()


def test_bert_refuses_long_inputs_and_bad_labels():
    model = bert_classifier()
    x, y = bert_data(length=13)
    with pytest.raises(ValueError, match="longer than the model's max_sequence_length=12"):
        model.fit(x, y, verbose=0)
    x, y = bert_data()
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 3\).*out of range: 3"):
        model.fit(x, _label(y, 3), verbose=0)


def test_transformer_refuses_bad_ids_and_labels():
    model = transformer()
    (source, target), labels = transformer_data()
    labels = labels.copy()  # not a view of target
    source[1, 2] = V
    with pytest.raises(ValueError, match=r"`source_ids` must lie in \[0, 40\).*40"):
        model.predict([source, target], verbose=0)
    source[1, 2] = 3
    target[0, 0] = -1
    with pytest.raises(ValueError, match=r"`target_ids` must lie in \[0, 40\).*-1"):
        model([source, target])
    target[0, 0] = 3
    labels[0, 0] = V + 2
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 40\).*42"):
        model.fit([source, target], labels, verbose=0)


def test_conformer_refuses_bad_lengths_and_labels():
    model = conformer()
    x, y = conformer_data()
    for length in (-1, 8001):
        with pytest.raises(ValueError, match=rf"`waveform_length` must lie in \[0, 8001\).*{length}"):
            model(_with(x, "waveform_length", 0, length))
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 6\).*6"):
        model.fit(x, _label(y, 6), verbose=0)


def test_conformer_warns_about_labels_too_long_to_emit():
    model = conformer()
    x, _ = conformer_data(samples=2000)  # 13 frames -> 2 after subsampling
    labels = np.array([[1, 2, 0], [1, 1, 0]], "int32")  # needs 2 and 3 frames
    with pytest.warns(UserWarning, match=r"1 of 2 utterance\(s\) have more labels"):
        model.evaluate(x, labels, verbose=0)


def test_vit_refuses_bad_labels():
    model = vit()
    x, y = vit_data()
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 3\).*-1"):
        model.fit(x, _label(y, -1), verbose=0)


# === Inside a compiled step: the step is skipped and fit stops ===


@pytest.mark.parametrize("name, value", [("token_ids", V), ("segment_ids", -1),
                                         ("segment_ids", 5)])
def test_bert_bad_ids_in_a_compiled_step_change_nothing(name, value):
    model = bert_classifier()
    assert isinstance(model.optimizer, SkipNonFiniteSteps)
    x, y = bert_data()
    _assert_step_skipped(model, _with(x, name, (0, 3), value), y,
                         input_error=rf"`{name}` must lie in .*Received: .*{value}")


def test_bert_bad_labels_in_a_compiled_step_change_nothing():
    model = bert_classifier()
    x, y = bert_data()
    _assert_step_skipped(model, x, _label(y, 3))


@pytest.mark.parametrize("where", ["source", "target", "labels"])
def test_transformer_bad_ids_in_a_compiled_step_change_nothing(where):
    model = transformer()
    (source, target), labels = transformer_data()
    labels = labels.copy()  # not a view of target
    {"source": source, "target": target, "labels": labels}[where][1, 2] = V
    _assert_step_skipped(model, [source, target], labels,
                         input_error=None if where == "labels" else f"`{where}_ids` must lie in")


def test_conformer_bad_lengths_and_labels_in_a_compiled_step_change_nothing():
    model = conformer()
    x, y = conformer_data()
    _assert_step_skipped(model, _with(x, "waveform_length", 0, 9000), y,
                         input_error="`waveform_length` must lie in .*9000")
    # Good inputs with a bad label: the BatchNorm moving averages, which the
    # forward pass updates, take this batch's (valid) statistics; every
    # trainable weight and the optimizer state stay as they were.
    _assert_step_skipped(model, x, _label(y, 6), non_trainable=False)


def test_vit_bad_labels_in_a_compiled_step_change_nothing():
    model = vit()
    x, y = vit_data()
    _assert_step_skipped(model, x, _label(y, 3))


def test_the_guard_survives_saving(tmp_path):
    model = bert_classifier()
    x, y = bert_data()
    model.fit(x, y, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded.optimizer, SkipNonFiniteSteps)
    assert int(keras.ops.convert_to_numpy(reloaded.optimizer.iterations)) == 1
    _assert_step_skipped(reloaded, _with(x, "token_ids", (0, 3), V), y,
                         input_error="`token_ids` must lie in")


def test_mixed_float16_keeps_keras_loss_scaling():
    keras.config.set_dtype_policy("mixed_float16")
    model = bert_classifier()
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer


def test_transformer_compile_defaults_to_the_papers_loss():
    model = transformer()
    (source, target), labels = transformer_data()
    history = model.fit([source, target], labels, epochs=10, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[0] > 1.0
    assert losses[-1] < losses[0] - 0.2
    assert "token_accuracy" in history.history


FAMILIES = {
    "bert": (bert_classifier, lambda b, n: {
        "token_ids": np.ones((b, n), "int32"), "segment_ids": np.zeros((b, n), "int32"),
        "padding_mask": np.ones((b, n), "int32")}),
    "transformer": (transformer, lambda b, n: [np.ones((b, n), "int32")] * 2),
    "vit": (vit, lambda b, n: np.zeros((b, 8, 8, 3), "uint8")),
    "conformer": (conformer, lambda b, n: {
        "waveform": np.zeros((b, n * 400), "float32"),
        "waveform_length": np.full((b,), n * 400, "int32")}),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_empty_batch_or_length_is_one_clear_error(family):
    build, make = FAMILIES[family]
    model = build()
    shapes = [(0, 5)] + ([] if family == "vit" else [(2, 0)])
    for batch, length in shapes:
        message = "holds no example" if batch == 0 else "has length 0"
        for call in (lambda: model(make(batch, length)),
                     lambda: model.predict(make(batch, length), verbose=0)):
            with pytest.raises(ValueError, match=message):
                call()


def test_too_long_sequences_in_a_compiled_step_change_nothing():
    """Past max_sequence_length inside `fit`: a ValueError while tracing where
    the length is static (JAX), else a NaN loss and a skipped step (a
    TensorFlow graph traced for any length); the weights never change."""
    model = bert_classifier()
    _fit_compiled(model, *bert_data())
    before = _state(model)
    with pytest.raises(ValueError, match="max_sequence_length=12|the loss is nan"):
        _fit_compiled(model, *bert_data(length=13))
    after = _state(model)
    for path in before:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)


# === Mask values other than 0/1, and NaN behind a mask ===


@pytest.mark.parametrize("value", [2, -3])
def test_bert_mask_values_other_than_0_1_in_a_compiled_step_change_nothing(value):
    """Found by a hostile user: a padding_mask of 2 or -3 trained as if it
    were 1 where Python does not run."""
    model = bert_classifier()
    x, y = bert_data()
    _assert_step_skipped(model, _with(x, "padding_mask", (0, 3), value), y,
                         input_error=r"`padding_mask` must be boolean or hold only 0 and 1")


def test_bert_mask_value_other_than_0_1_makes_the_compiled_answer_nan():
    """Inside a compiled `predict` nothing can raise: the example with the
    bad mask answers NaN, the others as before (a SavedModel, ONNX and
    LiteRT run the same graph)."""
    model = bert_classifier()
    x, _ = bert_data()
    clean = model.predict_on_batch(x)
    if EAGER_STEP:  # PyTorch predicts eagerly: the check raises
        with pytest.raises(ValueError, match="`padding_mask` must be boolean"):
            model.predict_on_batch(_with(x, "padding_mask", (1, 2), 2))
        return
    bad = model.predict_on_batch(_with(x, "padding_mask", (1, 2), 2))
    assert np.all(np.isnan(bad[1]))
    np.testing.assert_allclose(bad[[0, 2, 3]], clean[[0, 2, 3]], atol=1e-6)


def test_conformer_refuses_labels_with_a_zero_inside():
    """Found by a hostile user: [1, 0, 2] passed the label check and trained
    on a transcript that is neither [1, 2] nor [1]."""
    model = conformer()
    x, y = conformer_data()
    y = y.copy()
    y[1, :3] = [1, 0, 2]
    with pytest.raises(ValueError, match=r"`labels` must be each transcript's ids followed by "
                                         r"0s.*row\(s\) \[1\], e\.g\. \[1, 0, 2"):
        model.fit(x, y, verbose=0)


def test_conformer_labels_with_a_zero_inside_in_a_compiled_step_change_nothing():
    model = conformer()
    x, y = conformer_data()
    y = y.copy()
    y[0, :3] = [2, 0, 3]
    # BatchNorm's moving statistics move in any training forward pass.
    _assert_step_skipped(model, x, y, non_trainable=False)


def test_conformer_labels_too_long_for_their_logits_never_reach_the_weights():
    """CTC gives a finite clipped loss for an impossible alignment (706.9 on
    TensorFlow, 99999.3 on JAX): the step is skipped instead."""
    model = conformer()
    x, y = conformer_data()
    frames = int(keras.ops.convert_to_numpy(model(x)["logit_lengths"])[0])
    too_long = np.tile(np.array([[1, 2]], "int32"), (2, frames))  # 2 * frames labels
    _assert_step_skipped(model, x, too_long, non_trainable=False)


def test_conformer_refuses_a_frequency_mask_wider_than_its_features():
    with pytest.raises(ValueError, match=r"`freq_mask_width` must be at most "
                                         r"num_mel_bins=20\. Received: freq_mask_width=100"):
        build_conformer("conformer_tiny", vocabulary_size=6, num_layers=1, hidden_dim=16,
                        num_mel_bins=20, freq_mask_width=100)
    from keras_attn.layers import SpecAugment

    with pytest.raises(ValueError, match=r"at most 20 .*Received: freq_mask_width=21"):
        SpecAugment(freq_mask_width=21)(np.zeros((1, 9, 20), "float32"), training=True)
