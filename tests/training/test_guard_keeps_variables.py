"""A `fit` that fails inside its first step leaves the model as it was.

Keras's JAX trainer detaches the variables' values before the first step of
`fit` and reattaches them from the last finished step; a step that raises
while it is traced would leave them detached (every later call fails). The
guard puts the values from before the call back (`_keras_compat.variable_values`
/ `reattach_values`). On TensorFlow and PyTorch nothing is detached: the same
promise holds there too.
"""

import keras
import numpy as np
import pytest

from _families import FAMILIES


def _model():
    model = FAMILIES["vit"].build(image_size=8, num_layers=1)  # the table's, 3 classes
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


def _data(batch=4):
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (batch, 8, 8, 3)).astype("uint8"),
            rng.integers(0, 3, (batch,)).astype("int32"))


def test_a_fit_that_fails_inside_its_step_leaves_the_model_usable():
    model = _model()
    x, y = _data()
    before = model.predict(x, verbose=0)
    weights = [keras.ops.convert_to_numpy(v) for v in model.weights]
    calls = []

    def failing_loss(y_true, y_pred):
        # Called once when Keras builds the loss, then inside the train step.
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("a loss that fails inside the step")
        return keras.ops.mean(y_pred)

    model.compile(optimizer=model.optimizer, loss=failing_loss)
    with pytest.raises(ValueError, match="fails inside the step"):
        model.fit(x, y, verbose=0)
    for weight, value in zip(model.weights, weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)
    np.testing.assert_allclose(model.predict(x, verbose=0), before, atol=1e-6)
    # And it trains again once compiled with a loss that works.
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    history = model.fit(x, y, verbose=0)
    assert np.isfinite(history.history["loss"][0])
