"""The command line's early recipe check (keras_attn._base.recipe_check):
what the published JSON Schema refuses is refused before Keras is imported,
in the complete check's words for unknown and missing keys; every zoo recipe
passes it."""

import os
import subprocess
import sys

import pytest

from keras_attn._base.errors import RecipeError
from keras_attn._base.recipe_check import check_recipe_early
from keras_attn._base.zoo_files import recipe_paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VIT = os.path.join(ROOT, "models", "vit", "vit_tiny_digits.json")

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize("name", sorted(recipe_paths()))
def test_every_zoo_recipe_passes(name):
    assert check_recipe_early(name) is None


def test_what_the_schema_refuses_is_refused_early():
    # The same list as the JSON Schema's own test (tests/zoo/test_recipe.py),
    # applied as --set overrides.
    from test_recipe import EDITOR_CATCHES

    for overrides in EDITOR_CATCHES:
        with pytest.raises(RecipeError):
            check_recipe_early(VIT, [(key, value) for key, value in overrides])


def test_unknown_and_missing_keys_read_as_the_complete_check_words_them():
    with pytest.raises(RecipeError, match=r"Unknown recipe key `model\.overrides\.hiden_dim`; "
                                          r"valid keys in `model\.overrides` are \[.*'hidden_dim'.*\]\. "
                                          r"Received: model\.overrides\.hiden_dim=64"):
        check_recipe_early("vit_tiny_digits", ["model.overrides.hiden_dim=64"])
    with pytest.raises(RecipeError, match=r"2 problems in the recipe:\n- .*`colour`.*\n- "
                                          r"Recipe key `training\.epochs`.*Received: "
                                          r"training\.epochs=0"):
        check_recipe_early(VIT, ["colour=\"red\"", "training.epochs=0"])
    # The complete check says the same of an unknown and a missing key.
    from keras_attn.zoo.recipe import load_recipe

    for overrides in (["training.optimizer.colour=1"], ["data.augmentation.zom=0.1"]):
        with pytest.raises(RecipeError) as complete:
            load_recipe(VIT, overrides)
        with pytest.raises(RecipeError) as early:
            check_recipe_early(VIT, overrides)
        assert str(early.value) == str(complete.value)


def test_the_command_line_refuses_a_typo_without_importing_keras():
    code = ("import sys, keras_attn.cli\n"
            "status = keras_attn.cli.main(['train', 'vit_tiny_digits', '--set', "
            "'training.epoch=3'])\n"
            "heavy = ('keras', 'tensorflow', 'jax', 'torch', 'keras_attn.zoo', 'keras_attn.layers',"
            " 'keras_attn.models', 'pydantic')\n"
            "print(status, sorted(name for name in heavy if name in sys.modules))")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=environment, timeout=300)
    assert result.stdout.strip() == "2 []", result.stderr[-2000:]
    assert "Unknown recipe key `training.epoch`" in result.stderr


def test_a_missing_key_reads_as_the_complete_check_words_it(tmp_path):
    import json

    from keras_attn.zoo.recipe import load_recipe

    with open(VIT, encoding="utf-8") as handle:
        recipe = json.load(handle)
    del recipe["training"]
    path = tmp_path / "vit_tiny_digits.json"
    path.write_text(json.dumps(recipe))
    with pytest.raises(RecipeError) as complete:
        load_recipe(str(path))
    with pytest.raises(RecipeError, match=r"Missing recipe key `training` \(required\)") as early:
        check_recipe_early(str(path))
    assert str(early.value) == str(complete.value)


@pytest.mark.parametrize("text", ['[1, 2]', '{"task": ["masked_lm"]}', '{"task": 5}',
                                  '{"family": "vit"}'])
def test_what_the_schema_cannot_place_is_left_to_the_complete_check(tmp_path, text):
    # Not a recipe object, or no task the schema knows: the early check says
    # nothing (it must not crash); the complete check names the problem.
    from keras_attn.zoo.recipe import load_recipe

    path = tmp_path / "odd.json"
    path.write_text(text)
    assert check_recipe_early(str(path)) is None
    with pytest.raises(RecipeError):
        load_recipe(str(path))


def test_a_task_of_two_families_is_checked_against_its_familys_branch():
    # masked_lm builds a BERT or a ModernBERT: the recipe's family picks
    # the model keys it is checked against.
    with pytest.raises(RecipeError, match=r"Unknown recipe key `model\.overrides\.num_segments`"):
        check_recipe_early("modernbert_tiny_pydoc", ["model.overrides.num_segments=2"])
    with pytest.raises(RecipeError, match=r"Unknown recipe key `model\.overrides\.local_window`"):
        check_recipe_early("bert_tiny_pydoc", ["model.overrides.local_window=32"])
    with pytest.raises(RecipeError, match=r"Recipe key `family` must be one of \['bert', "
                                          r"'modernbert'\] for task 'masked_lm'\. "
                                          r"Received: family='vit'"):
        check_recipe_early("modernbert_tiny_pydoc", ["family=\"vit\""])
