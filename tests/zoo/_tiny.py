"""Tiny `--set` versions of the small recipes: the same tasks and code paths
in seconds (one layer, a few steps, small data)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = {
    "vit_tiny_digits": "models/vit/vit_tiny_digits.json",
    "bert_tiny_pydoc": "models/bert/bert_tiny_pydoc.json",
    "transformer_numbers": "models/transformer/transformer_numbers.json",
    "conformer_tiny_digits": "models/conformer/conformer_tiny_digits.json",
}
# XLA compilation would cost more than it saves in 3 steps.
_RUN = ["training.epochs=1", "training.steps_per_epoch=3", "training.checkpoint_every=2",
        "training.jit_compile=false"]
TINY = {
    "vit_tiny_digits": [
        "model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
        "model.overrides.intermediate_dim=32", "model.overrides.num_heads=2",
    ],
    "bert_tiny_pydoc": [
        "model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
        "model.overrides.intermediate_dim=32", "data.vocabulary_size=300",
        "data.sequence_length=32", "data.max_documents=20",
    ],
    "transformer_numbers": [
        "model.overrides.hidden_dim=16", "model.overrides.intermediate_dim=32",
        "model.overrides.num_heads=2", "model.overrides.num_encoder_layers=1",
        "model.overrides.num_decoder_layers=1", "data.num_train=200",
        "data.num_validation=16", "data.num_test=16", "evaluation.max_examples=8",
        "training.batch_size=16",
    ],
    "conformer_tiny_digits": [
        "model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
        "data.utterances=24", "data.test_size=4", "data.validation_size=4",
        "training.batch_size=4",
    ],
}


def tiny_overrides(name, run=True):
    """The `--set` overrides of the tiny version of recipe `name`."""
    return TINY[name] + (_RUN if run else [])


def recipe_path(name):
    return os.path.join(ROOT, SMALL[name])


def train_from_checkpoint(monkeypatch, recipe, run, sets, first_weights, no_export=False):
    """`keras-attn train recipe --output run --set ...` (the `sets` values),
    its test accuracy checked to be one; returns `(task, start)`: the task the
    command made and `first_weights(model)` of its model as built, before
    training (where a checkpoint's weights are checked to have arrived)."""
    import json

    import keras_attn.cli as cli
    from keras_attn.zoo import tasks

    make_task, seen = tasks.make_task, {}

    def spy(resolved):
        task = seen["task"] = make_task(resolved)
        build = task.build_model

        def build_model():
            model = build()
            seen["start"] = first_weights(model)
            return model

        task.build_model = build_model
        return task

    monkeypatch.setattr(tasks, "make_task", spy)
    arguments = [item for value in sets for item in ("--set", value)]
    assert cli.main(["train", recipe, "--output", str(run), "--verbose", "0", *arguments]
                    + (["--no-export"] if no_export else [])) == 0
    with open(os.path.join(run, "results.json"), encoding="utf-8") as handle:
        results = json.load(handle)
    assert results["metric"] == "accuracy" and 0.0 <= results["value"] <= 1.0
    return seen["task"], seen["start"]
