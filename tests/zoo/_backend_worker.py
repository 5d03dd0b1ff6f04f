"""`python _backend_worker.py`: one process on one Keras backend
(KERAS_BACKEND) doing what the cross-backend test (test_backends.py) asks of
it, a JSON list per line on stdin, answered by a line `done` on stdout:

- `["train", OUT_DIR, NAME, ...]` trains the tiny version of each small
  recipe with `keras_attn.zoo.train` into `OUT_DIR/<name>` (no SavedModel);
- `["load", RUN_DIR, OUT.npz, ...]` loads each run's model.keras and writes
  what the task's SavedModel should serve for its example inputs.

One process per backend both trains and reads (the test waits for the other
backend's runs between the two): the imports and the backend's start-up are
paid once per backend, not once per step."""

import json
import os
import sys

import numpy as np

from _tiny import recipe_path
from _tiny import tiny_overrides

DONE = "done"


def train(out, *names):
    import keras

    from keras_attn import zoo

    for name in names:
        overrides = tiny_overrides(name)
        if keras.backend.backend() == "jax":
            # JAX runs eagerly op by op without XLA: compiling is quicker even for
            # 3 steps (the conformer's epoch: 96 s eager, 28 s compiled).
            overrides = [o for o in overrides if not o.startswith("training.jit_compile=")]
            overrides.append("training.jit_compile=true")
        results = zoo.train(recipe_path(name), overrides,
                            output=os.path.join(out, name), export=False, verbose=0)
        print(f"{name}: {results['metric']} = {results['value']:.4f} on {results['backend']}",
              flush=True)


def load(*pairs):
    from keras_attn.zoo.recipe import validate_recipe
    from keras_attn.zoo.tasks import make_task

    for run, out in zip(pairs[::2], pairs[1::2]):
        with open(os.path.join(run, "recipe.json")) as handle:
            task = make_task(validate_recipe(json.load(handle)))
        model = task.load_model(os.path.join(run, "model.keras"))
        np.savez(out, **task.reference_outputs(model, task.example_inputs()))


def main():
    commands = {"train": train, "load": load}
    for line in sys.stdin:
        command, *args = json.loads(line)
        commands[command](*args)
        print(DONE, flush=True)


if __name__ == "__main__":
    main()
