"""The guard finds `fit`'s, `evaluate`'s, `predict`'s and `compile`'s
arguments wherever the caller puts them (bound to Keras's own signatures),
and refuses a Keras that no longer has one rather than guarding it wrongly.
"""

import keras
import numpy as np
import pytest

from keras_attn import _keras_compat
from keras_attn.errors import NonFiniteLossError
from keras_attn.models._guarded import keras_arguments
from _families import FAMILIES

CLASSES = 3


def _model():
    model = FAMILIES["vit"].build(image_size=8, num_layers=1, num_classes=CLASSES)
    model.compile(optimizer="adam")
    return model


def _data(batch=4):
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (batch, 8, 8, 3)).astype("uint8"),
            rng.integers(0, CLASSES, (batch,)).astype("int32"))


def _bad_labels(y):
    y = y.copy()
    y[0] = CLASSES
    return y


class _Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = 0

    def on_train_batch_end(self, batch, logs=None):
        self.ends += 1


def test_callbacks_given_by_position_still_stop_on_a_non_finite_loss():
    """`fit(x, y, batch_size, epochs, verbose, callbacks)`: the stop callback
    joins the caller's, and a step whose labels are out of range (unseen by
    Python: a generator) ends `fit` with NonFiniteLossError."""
    model = _model()
    x, y = _data()
    steps = _Steps()
    batches = ((x, _bad_labels(y)) for _ in range(2))
    with pytest.raises(NonFiniteLossError, match="the loss is nan"):
        model.fit(batches, None, None, 1, 0, [steps], steps_per_epoch=2)
    assert steps.ends == 0  # it stopped before the caller's callback saw the step


def test_validation_data_given_by_position_is_checked_before_training():
    """Refused before the first step, not after an epoch trained on."""
    model = _model()
    x, y = _data()
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.weights]
    # x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 3\)"):
        model.fit(x, y, 4, 1, 0, None, 0.0, (x, _bad_labels(y)))
    for weight, value in zip(model.weights, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)


@pytest.mark.parametrize("entry", ["evaluate", "predict"])
def test_data_given_by_keyword_is_checked(entry):
    model = _model()
    x, y = _data()
    if entry == "evaluate":
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\).*Received: 1 value"):
            model.evaluate(y=_bad_labels(y), x=x, verbose=0)
    else:
        with pytest.raises(ValueError, match="holds no example"):
            model.predict(verbose=0, x=x[:0])


@pytest.mark.parametrize("how", ["position", "keyword"])
def test_a_loss_that_reads_probabilities_is_refused_however_given(how):
    model = _model()
    loss = "sparse_categorical_crossentropy"
    with pytest.raises(ValueError, match="expects probabilities"):
        if how == "position":
            model.compile("adam", loss)
        else:
            model.compile(loss=loss, optimizer="adam")


def test_a_keras_without_an_argument_the_guard_reads_is_refused():
    def fit(x=None, y=None, batch_size=None, epochs=1):  # a Keras without `callbacks`
        return x

    with pytest.raises(RuntimeError, match=r"\['callbacks'\] of keras.Model.fit"):
        keras_arguments(fit, (1,), {}, ("x", "callbacks"))
    bound = keras_arguments(fit, (1, 2), {"epochs": 3}, ("x", "y"))
    assert bound.arguments == {"x": 1, "y": 2, "epochs": 3}


def test_a_keras_without_the_loss_scale_step_hooks_is_refused(monkeypatch):
    hook = _keras_compat.LOSS_SCALE_STEP_HOOKS[0]
    monkeypatch.delattr(keras.optimizers.LossScaleOptimizer, hook)

    with pytest.raises(ImportError, match=hook):
        @_keras_compat.overrides_loss_scale_hooks
        class Skipping(keras.optimizers.LossScaleOptimizer):
            pass
