"""On TensorFlow, the state a train step creates (optimizer slots, compiled
metrics) is built before the step's first trace (`_keras_compat.
build_before_first_trace`, called by the guarded `fit`): the step is traced
once instead of twice, and training gives the same numbers to the bit.
(`evaluate` is left as Keras runs it: its metrics' variables are created
outside its trace already, and a build first made it slower.)"""

import keras
import numpy as np
import pytest

import keras_attn.models._guarded as guard
from _families import FAMILIES

pytestmark = pytest.mark.tf_only


def _classifier():
    keras.utils.set_random_seed(0)
    model = FAMILIES["vit"].build(image_size=8, num_layers=1)  # the table's, 3 classes
    model.compile(optimizer="adam")  # cross-entropy and accuracy by default
    return model


def _counting(model, name):
    """Counts the Python calls of `model.<name>`: once a trace in a compiled step."""
    calls, inner = [], getattr(model, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    setattr(model, name, counted)
    return calls


def _data(kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8, 8, 3)).astype("float32")
    y, w = np.arange(16) % 3, rng.uniform(0.5, 1.5, size=16).astype("float32")
    if kind == "arrays":
        return {"x": x, "y": y, "sample_weight": w, "batch_size": 8}
    import tensorflow as tf

    return {"x": tf.data.Dataset.from_tensor_slices((x, y, w)).batch(8)}


@pytest.mark.parametrize("kind", ["arrays", "dataset"])
def test_fit_traces_its_step_once_with_the_same_numbers(kind, monkeypatch):
    early = _classifier()
    traces = _counting(early, "train_step")
    history = early.fit(**_data(kind), epochs=2, verbose=0).history
    assert len(traces) == 1
    # As Keras's own trainer builds it on TensorFlow: inside the first trace.
    monkeypatch.setattr(guard, "build_before_first_trace", lambda *args, **kwargs: None)
    late = _classifier()
    traces = _counting(late, "train_step")
    assert late.fit(**_data(kind), epochs=2, verbose=0).history == history
    assert len(traces) == 2
    for ours, keras_own in zip(early.weights + early.optimizer.variables,
                               late.weights + late.optimizer.variables):
        np.testing.assert_array_equal(ours.numpy(), keras_own.numpy(), err_msg=ours.path)

