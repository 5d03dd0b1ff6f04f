"""Files written by an earlier keras_attn still load, to the same numbers.

`fixtures/` holds, for each family, a `.keras` file and a `ResumableTrainer`
checkpoint written by the code of commit 9fd5397 (`make_fixtures.py`), with
the inputs and the outputs they gave then. Refactoring a model (moving a
layer into an attribute, sharing a head, renaming a config helper) must keep
both loading to those outputs: weight paths, variable order and the saved
config are part of the public contract.
"""

import os
import shutil

import keras
import numpy as np
import pytest

import tiny_models
from keras_attn.training.resumable import restore_latest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _stored(name):
    with np.load(os.path.join(FIXTURES, name, "io.npz")) as arrays:
        arrays = dict(arrays)
    x = tiny_models.unflat(arrays, "x")
    if isinstance(x, list):
        x = tuple(x)
    return x, tiny_models.unflat(arrays, "out")


def _assert_same(actual, expected):
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected)
        for key in expected:
            np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5, atol=1e-5,
                                       err_msg=key)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(tiny_models.MODELS))
def test_keras_file_of_an_earlier_version_loads_to_the_same_outputs(name):
    x, expected = _stored(name)
    model = keras.saving.load_model(os.path.join(FIXTURES, name, "model.keras"))
    _assert_same(tiny_models.outputs(model, x), expected)


@pytest.mark.parametrize("name", sorted(tiny_models.MODELS))
def test_checkpoint_of_an_earlier_version_restores_into_todays_model(name, tmp_path):
    x, expected = _stored(name)
    directory = shutil.copytree(os.path.join(FIXTURES, name, "checkpoints"),
                                tmp_path / "checkpoints")
    build, _ = tiny_models.MODELS[name]
    model = build()
    before = tiny_models.outputs(model, x)
    assert restore_latest(model, directory) == 2
    _assert_same(tiny_models.outputs(model, x), expected)
    # The fixture would pass trivially if a fresh model gave these outputs.
    key = next((k for k in sorted(expected) if k != "logit_lengths"), None) \
        if isinstance(expected, dict) else None
    fresh, first = (before[key], expected[key]) if key else (before, expected)
    assert not np.allclose(fresh, first, atol=1e-4)
