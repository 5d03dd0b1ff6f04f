import numpy as np
import pytest

from keras_attn.layers.class_token import ClassToken
from test_case import run_layer_test
from test_case import to_numpy


def test_class_token_layer(tmp_path):
    run_layer_test(
        ClassToken,
        init_kwargs={"initializer": "random_normal"},
        input_data={"inputs": np.random.rand(3, 4, 6).astype("float32")},
        expected_output_shape=(3, 5, 6),
        expected_num_trainable_weights=1,
        tmp_path=tmp_path,
    )


def test_token_is_prepended_and_inputs_kept():
    layer = ClassToken(initializer="random_normal")
    inputs = np.random.rand(2, 3, 4).astype("float32")
    out = to_numpy(layer(inputs))
    token = to_numpy(layer.token)
    np.testing.assert_array_equal(out[:, 0], np.stack([token, token]))
    np.testing.assert_array_equal(out[:, 1:], inputs)


def test_rank_two_input_is_rejected():
    with pytest.raises(ValueError, match=r"Received: inputs.shape=\(2, 4\)"):
        ClassToken()(np.zeros((2, 4), "float32"))
