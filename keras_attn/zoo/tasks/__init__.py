"""Task adapters: one module per task, each turning a resolved recipe into
data, a compiled model, an evaluation and an export (see `base.Task`).

TensorFlow and the model families are imported when a task loads its data
or builds its model, never by importing this package."""

import importlib

TASKS = {
    "image_classification": ("keras_attn.zoo.tasks.image_classification", "ImageClassification"),
    "masked_lm": ("keras_attn.zoo.tasks.masked_lm", "MaskedLM"),
    "translation": ("keras_attn.zoo.tasks.translation", "Translation"),
    "speech_ctc": ("keras_attn.zoo.tasks.speech_ctc", "SpeechCTC"),
}


def make_task(recipe):
    """The task adapter of a resolved recipe (nothing is loaded yet)."""
    module, name = TASKS[recipe["task"]]
    return getattr(importlib.import_module(module), name)(recipe)
