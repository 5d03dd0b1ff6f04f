"""keras_attn.errors: one class per kind of refusal, each a `KerasAttnError`
and (for bad input) a `ValueError`, raised where the package refuses."""

import os

import pytest

from keras_attn import errors
from keras_attn.training.nonfinite import NonFiniteLossError
from keras_attn.training.checkpoints import CorruptCheckpointError
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import parse_override
from keras_attn.zoo.recipe import validate_recipe

pytestmark = pytest.mark.backend_independent


def test_every_class_is_a_keras_attn_error_and_a_value_error():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.KerasAttnError), name
        if cls is not errors.KerasAttnError:
            assert issubclass(cls, ValueError), name
    # The modules that raise them name the same classes.
    assert NonFiniteLossError is errors.NonFiniteLossError
    assert CorruptCheckpointError is errors.CorruptCheckpointError


def test_recipe_problems_are_recipe_errors():
    with pytest.raises(errors.RecipeError, match=r"Recipe key `family` must be one of"):
        validate_recipe({"name": "x", "family": "nope", "task": "masked_lm"})
    with pytest.raises(errors.RecipeError, match="dotted.key=value"):
        parse_override("no_equals_sign")


def test_run_directory_problems_are_run_directory_errors(tmp_path):
    output = tmp_path / "a_file"
    output.write_text("x")
    with pytest.raises(errors.RunDirectoryError, match=r"must be a directory; .* is a file"):
        runs._check_output_path(str(output))
    lock = runs.RunLock(str(tmp_path / "run"))
    with lock:
        with pytest.raises(errors.RunDirectoryError, match="being trained by another"):
            with runs.RunLock(str(tmp_path / "run")):
                pass
    assert not os.path.exists(tmp_path / "run" / ".lock")
