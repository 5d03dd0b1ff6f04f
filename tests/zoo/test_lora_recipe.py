"""`training.lora` in recipes: LoRA-adapt a trained run of the same model."""

import re

import keras
import numpy as np
import pytest

from _tiny import tiny_overrides
from keras_attn.models import load_lora_weights
from keras_attn.zoo import runs
from keras_attn.zoo.recipe import fingerprint
from keras_attn.zoo.recipe import load_recipe

pytestmark = [pytest.mark.tf_only, pytest.mark.xdist_group("lora_recipe")]

NAME = "vit_tiny_digits"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("lora") / "base")
    runs.train(NAME, tiny_overrides(NAME), output=output, export=False, verbose=0)
    return output


def _lora(base, *extra):
    return tiny_overrides(NAME) + [f"training.lora.base={base}", "training.lora.rank=2",
                                   'training.lora.train_also=["classifier"]',
                                   "training.optimizer.learning_rate=0.02", *extra]


def _weights(path):
    model = keras.saving.load_model(path, compile=False)
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def test_a_lora_run_trains_adapters_and_head_on_the_base_and_saves_the_merged_model(
        base, tmp_path, capfd):
    output = str(tmp_path / "lora")
    results = runs.train(NAME, _lora(base), output=output, export=False, verbose=0)
    out = capfd.readouterr().out
    trainable, total = map(lambda s: int(s.replace(",", "")), re.search(
        r"LoRA on .*: ([\d,]+) of ([\d,]+) parameters train", out).groups())
    # One block: query and value adapters (Keras's EinsumDense LoRA: A of
    # 16 x 2 heads x r=2, B of r=2 x 8 per head) and the classifier (16 x 10 + 10).
    assert trainable == 2 * (16 * 2 * 2 + 2 * 8) + 16 * 10 + 10 < total
    assert 0 <= results["value"] <= 1

    before = _weights(f"{base}/model.keras")
    after = _weights(f"{output}/model.keras")
    assert sorted(after) == sorted(before)  # merged: no LoRA weights left
    changed = sorted(p for p in before if not np.array_equal(before[p], after[p]))
    assert changed == ["classifier/bias", "classifier/kernel",
                       "transformer_block_0/self_attention/query/kernel",
                       "transformer_block_0/self_attention/value/kernel"]

    # The adapter file on a fresh copy of the base gives the merged model.
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 1)).astype("float32")
    adapted = keras.saving.load_model(f"{base}/model.keras", compile=False)
    load_lora_weights(adapted, f"{output}/adapters.npz")
    merged = keras.saving.load_model(f"{output}/model.keras", compile=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(adapted(images)),
                               keras.ops.convert_to_numpy(merged(images)), atol=1e-5)


def test_a_base_of_another_model_or_no_base_is_refused_before_training(base, tmp_path):
    with pytest.raises(ValueError, match=r"`training.lora.base` was trained with another model"):
        runs.train(NAME, _lora(base, "model.overrides.intermediate_dim=64"),
                   output=str(tmp_path / "a"), export=False, verbose=0)
    missing = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match=re.escape(
            f"must be a run directory with a model.keras (a finished run) or a .keras file. "
            f"Received: training.lora.base={missing!r}")):
        runs.train(NAME, _lora(missing), output=str(tmp_path / "b"), export=False, verbose=0)
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_recipes_without_lora_resolve_and_fingerprint_as_before():
    recipe = load_recipe(runs.locate_recipe(NAME))
    assert "lora" not in recipe["training"]
    with_lora = load_recipe(runs.locate_recipe(NAME), ["training.lora.base=x",
                                                       "training.lora.rank=4"])
    assert with_lora["training"]["lora"] == {"base": "x", "rank": 4, "alpha": None,
                                             "targets": ["query", "value"], "train_also": []}
    assert fingerprint(with_lora) != fingerprint(recipe)
