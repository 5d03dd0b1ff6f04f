"""`python _load_run.py RUN_DIR OUT.npz [RUN_DIR OUT.npz ...]`: loads each
run's model.keras on this process's Keras backend and writes what the task's
SavedModel should serve for its example inputs (the cross-backend test
compares them)."""

import json
import os
import sys

import numpy as np

from keras_attn.zoo.recipe import validate_recipe
from keras_attn.zoo.tasks import make_task


def main(*pairs):
    for run, out in zip(pairs[::2], pairs[1::2]):
        with open(os.path.join(run, "recipe.json")) as handle:
            task = make_task(validate_recipe(json.load(handle)))
        model = task.load_model(os.path.join(run, "model.keras"))
        np.savez(out, **task.reference_outputs(model, task.example_inputs()))


if __name__ == "__main__":
    main(*sys.argv[1:])
