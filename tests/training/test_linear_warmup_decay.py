import json

import keras
import numpy as np
import pytest

from keras_attn.training.schedules import LinearWarmupDecay


def test_known_values_and_serialization():
    schedule = LinearWarmupDecay(2e-3, total_steps=110, warmup_steps=10)
    rates = [float(schedule(s)) for s in (0, 1, 10, 60, 110, 200)]
    np.testing.assert_allclose(rates, [0.0, 2e-4, 2e-3, 1e-3, 0.0, 0.0], atol=1e-9)
    # No warmup: starts at the peak.
    np.testing.assert_allclose(float(LinearWarmupDecay(1.0, 4)(0)), 1.0)
    config = json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule)))
    revived = keras.optimizers.schedules.deserialize(config)
    assert revived.get_config() == {"learning_rate": 2e-3, "total_steps": 110, "warmup_steps": 10}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0, "total_steps": 10}, "learning_rate=0.0"),
        ({"learning_rate": 1.0, "total_steps": 0}, "total_steps=0"),
        ({"learning_rate": 1.0, "total_steps": 10, "warmup_steps": 10}, "warmup_steps=10"),
        ({"learning_rate": 1.0, "total_steps": 10, "warmup_steps": 0.5}, "warmup_steps=0.5"),
    ],
)
def test_errors_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LinearWarmupDecay(**kwargs)
