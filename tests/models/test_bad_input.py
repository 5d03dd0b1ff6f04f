"""Bad data never reaches the weights, on every backend.

Each family, tiny (the table's, tests/_families.py): concrete bad
inputs and labels are a `ValueError` that names the input, the value and the
range (checked in every entry point by `run_model_test`, in each family's
test file); the same data inside a compiled
step (fed by a generator, which nothing checks ahead) makes the loss NaN,
the step changes no weight and no optimizer state, and `fit` ends with
`NonFiniteLossError`. Runs in CI's TensorFlow and JAX passes.
"""

import keras
import numpy as np
import pytest

from _families import FAMILIES
from _families import SAMPLES_PER_STEP
from _families import with_value as _with
from keras_attn.errors import NonFiniteLossError
from keras_attn.training.nonfinite import SkipNonFiniteSteps
from keras_attn.layers import subsampled_length
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.modernbert import ModernBertSequenceClassifier
from keras_attn.models.conformer import build_conformer

V = 40
# The table's tiny models, with the sizes this file's messages name (BERT's
# vocabulary V is the table's); one block each.
SIZES = {
    "bert": dict(num_layers=1, max_sequence_length=12),
    "transformer": dict(vocabulary_size=V),
    "conformer": dict(vocabulary_size=5, num_layers=1),
    "vit": dict(image_size=8, num_layers=1),
    "modernbert": dict(num_layers=1, max_sequence_length=12),
}


def _model(family):
    model = FAMILIES[family].build(**SIZES[family])
    model.compile(optimizer="adam")
    return model


# The tests that share `compiled` run in one worker (`--dist loadgroup`),
# which builds and traces each family's model once.
SHARED = pytest.mark.xdist_group("bad_input_compiled")


@pytest.fixture(scope="module")
def compiled():
    """`compiled(family)`: one compiled tiny model per family, shared by the
    tests below that compare the state before and after their own bad step
    (each takes a good step first, so what an earlier test did to the model
    changes nothing they assert). One model keeps one traced train step:
    the same shapes are compiled once, not once a test."""
    models = {}

    def get(family):
        if family not in models:
            models[family] = _model(family)
        return models[family]

    return get


def _data(family, size, length=None):
    """An unpadded batch and its labels."""
    return FAMILIES[family].batch(size=size, length=length, padded=False, **SIZES[family])


def bert_classifier():
    return _model("bert")


def bert_data(batch=4, length=8):
    return _data("bert", batch, length)


def transformer():
    return _model("transformer")


def transformer_data(batch=4, source_length=7):
    """Targets are one token shorter than the sources (the table's batch)."""
    return _data("transformer", batch, source_length)


def conformer_data(batch=2, samples=8000):
    """Transcripts of 2-3 labels padded with 0s to twice the utterances'
    logit frames: the width of the too-long labels below, so that one
    traced step serves every Conformer test here."""
    x, y = _data("conformer", batch, samples // SAMPLES_PER_STEP)
    width = 2 * subsampled_length(1 + samples // 160)
    return x, np.pad(y, ((0, 0), (0, width - y.shape[1])))


def vit_data(batch=4):
    return _data("vit", batch)


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
    if isinstance(model, ModernBertSequenceClassifier):
        return _data("modernbert", 4, 8)
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


# === Concrete data: each family's bad inputs and labels are a ValueError in
# every entry point, checked by run_model_test (tests/models/test_<family>.py) ===


@SHARED
def test_conformer_warns_about_labels_too_long_to_emit(compiled):
    model = compiled("conformer")
    x, _ = conformer_data(samples=2000)  # 13 frames -> 2 after subsampling
    labels = np.array([[1, 2, 0], [1, 1, 0]], "int32")  # needs 2 and 3 frames
    with pytest.warns(UserWarning, match=r"1 of 2 utterance\(s\) have more labels"):
        model.evaluate(x, labels, verbose=0)


# === Inside a compiled step: the step is skipped and fit stops ===


@pytest.mark.parametrize("name, value", [("token_ids", V), ("segment_ids", -1),
                                         ("segment_ids", 5)])
@SHARED
def test_bert_bad_ids_in_a_compiled_step_change_nothing(name, value, compiled):
    model = compiled("bert")
    assert isinstance(model.optimizer, SkipNonFiniteSteps)
    x, y = bert_data()
    _assert_step_skipped(model, _with(x, name, (0, 3), value), y,
                         input_error=rf"`{name}` must lie in .*Received: .*{value}")


@pytest.mark.parametrize("bad", ["token_ids", "labels"])
@SHARED
def test_modernbert_bad_ids_and_labels_in_a_compiled_step_change_nothing(bad, compiled):
    model = compiled("modernbert")
    assert isinstance(model.optimizer, SkipNonFiniteSteps)
    x, y = _data("modernbert", 4, 8)
    if bad == "labels":
        _assert_step_skipped(model, x, _label(y, 3))
    else:
        _assert_step_skipped(model, _with(x, "token_ids", (0, 3), V), y,
                             input_error=rf"`token_ids` must lie in .*Received: .*{V}")


@SHARED
def test_bert_bad_labels_in_a_compiled_step_change_nothing(compiled):
    model = compiled("bert")
    x, y = bert_data()
    _assert_step_skipped(model, x, _label(y, 3))


@SHARED
@pytest.mark.slow
@pytest.mark.parametrize("where", ["source", "target", "labels"])
def test_transformer_bad_ids_in_a_compiled_step_change_nothing(where, compiled):
    model = compiled("transformer")
    (source, target), labels = transformer_data()
    labels = labels.copy()  # not a view of target
    {"source": source, "target": target, "labels": labels}[where][1, 2] = V
    _assert_step_skipped(model, [source, target], labels,
                         input_error=None if where == "labels" else f"`{where}_ids` must lie in")


@SHARED
@pytest.mark.slow
def test_conformer_bad_lengths_and_labels_in_a_compiled_step_change_nothing(compiled):
    model = compiled("conformer")
    x, y = conformer_data()
    _assert_step_skipped(model, _with(x, "waveform_length", 0, 9000), y,
                         input_error="`waveform_length` must lie in .*9000")
    loud = dict(x, waveform=x["waveform"] * 32768.0)  # 16-bit PCM given as floats
    _assert_step_skipped(model, loud, y, input_error=r"`waveform`: audio samples must lie in \[-1, 1\]")
    # Good inputs with a bad label: the BatchNorm moving averages, which the
    # forward pass updates, take this batch's (valid) statistics; every
    # trainable weight and the optimizer state stay as they were.
    _assert_step_skipped(model, x, _label(y, 6), non_trainable=False)


@SHARED
def test_vit_bad_labels_in_a_compiled_step_change_nothing(compiled):
    model = compiled("vit")
    x, y = vit_data()
    _assert_step_skipped(model, x, _label(y, 3))


@SHARED
# Not on JAX: without x64, Keras's data adapter turns the int64 labels into
# int32 before the step sees them (docs/bad_input.md says so).
@pytest.mark.backends("tensorflow", "torch")
def test_int64_labels_past_int32_in_a_compiled_step_change_nothing(compiled):
    # Cast to int32 before the range check, 2**32 + 1 was the valid label 1.
    model = compiled("vit")
    x, y = vit_data()
    _assert_step_skipped(model, x, _label(y.astype("int64"), 2 ** 32 + 1))


@pytest.mark.slow
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


@pytest.mark.slow
def test_transformer_compile_defaults_to_the_papers_loss():
    model = transformer()
    (source, target), labels = transformer_data()
    history = model.fit([source, target], labels, epochs=10, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[0] > 1.0
    assert losses[-1] < losses[0] - 0.2
    assert "token_accuracy" in history.history


@SHARED
def test_too_long_sequences_in_a_compiled_step_change_nothing(compiled):
    """Past max_sequence_length inside `fit`: a ValueError while tracing where
    the length is static (JAX), else a NaN loss and a skipped step (a
    TensorFlow graph traced for any length); the weights never change."""
    model = compiled("bert")
    _fit_compiled(model, *bert_data())
    before = _state(model)
    with pytest.raises(ValueError, match="max_sequence_length=12|the loss is nan"):
        _fit_compiled(model, *bert_data(length=13))
    after = _state(model)
    for path in before:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)


# === Mask values other than 0/1, and NaN behind a mask ===


def _padding_only(x, row):
    """`x` with row `row` made padding only (its mask all 0, its ids kept)."""
    mask = np.array(x["padding_mask"])
    mask[row] = 0
    return dict(x, padding_mask=mask)


BAD_MASKS = {  # name: (bad inputs from good ones with row 1 bad, the check's message)
    "value 2": (lambda x: _with(x, "padding_mask", (1, 2), 2),
                r"`padding_mask` must be boolean or hold only 0 and 1"),
    "value -3": (lambda x: _with(x, "padding_mask", (1, 3), -3),
                 r"`padding_mask` must be boolean or hold only 0 and 1"),
    # A row of padding only: its answer came from the padding's ids.
    "padding only": (lambda x: _padding_only(x, 1),
                     r"`padding_mask`: row\(s\) \[1\] hold no real token"),
}


@SHARED
@pytest.mark.parametrize("bad", BAD_MASKS)
def test_bert_bad_masks_in_a_compiled_step_change_nothing(bad, compiled):
    """Found by a hostile user: a padding_mask of 2 or -3 trained as if it
    were 1 where Python does not run."""
    model = compiled("bert")
    x, y = bert_data()
    make, message = BAD_MASKS[bad]
    _assert_step_skipped(model, make(x), y, input_error=message)


@SHARED
@pytest.mark.parametrize("bad", ["value 2", "padding only"])
def test_bert_bad_mask_makes_the_compiled_answer_nan(bad, compiled):
    """Inside a compiled `predict` nothing can raise: the example with the
    bad mask answers NaN, the others as before (a SavedModel, ONNX and
    LiteRT run the same graph)."""
    model = compiled("bert")
    x, _ = bert_data()
    make, message = BAD_MASKS[bad]
    clean = model.predict_on_batch(x)
    if EAGER_STEP:  # PyTorch predicts eagerly: the check raises
        with pytest.raises(ValueError, match=message):
            model.predict_on_batch(make(x))
        return
    answer = model.predict_on_batch(make(x))
    assert np.all(np.isnan(answer[1]))
    np.testing.assert_allclose(answer[[0, 2, 3]], clean[[0, 2, 3]], atol=1e-6)
    with pytest.raises(ValueError, match=message):  # where Python runs
        model(make(x))


@SHARED
@pytest.mark.slow
def test_conformer_labels_with_a_zero_inside_in_a_compiled_step_change_nothing(compiled):
    model = compiled("conformer")
    x, y = conformer_data()
    y = y.copy()
    y[0, :3] = [2, 0, 3]
    # BatchNorm's moving statistics move in any training forward pass.
    _assert_step_skipped(model, x, y, non_trainable=False)


@SHARED
@pytest.mark.slow
def test_conformer_labels_too_long_for_their_logits_never_reach_the_weights(compiled):
    """CTC gives a finite clipped loss for an impossible alignment (706.9 on
    TensorFlow, 99999.3 on JAX): the step is skipped instead."""
    model = compiled("conformer")
    x, y = conformer_data()
    frames = int(keras.ops.convert_to_numpy(model(x)["logit_lengths"])[0])
    # 2 * frames labels: conformer_data's label width, so the step traced for
    # the good batch takes these too.
    too_long = np.tile(np.array([[1, 2]], "int32"), (2, frames))
    _assert_step_skipped(model, x, too_long, non_trainable=False)


def test_conformer_refuses_a_frequency_mask_wider_than_its_features():
    with pytest.raises(ValueError, match=r"`freq_mask_width` must be at most "
                                         r"num_mel_bins=20\. Received: freq_mask_width=100"):
        build_conformer("conformer_tiny", vocabulary_size=6, num_layers=1, hidden_dim=16,
                        num_mel_bins=20, freq_mask_width=100)
    from keras_attn.layers import SpecAugment

    with pytest.raises(ValueError, match=r"at most 20 .*Received: freq_mask_width=21"):
        SpecAugment(freq_mask_width=21)(np.zeros((1, 9, 20), "float32"), training=True)
