import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(__file__))  # `from test_case import ...`

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
