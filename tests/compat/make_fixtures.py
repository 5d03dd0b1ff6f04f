"""Writes the saved-file fixtures of `test_saved_files.py` (run once, from
the code whose files must keep loading; the outputs are committed).

    KERAS_BACKEND=tensorflow python tests/compat/make_fixtures.py

For each family, a tiny model trained two steps through `ResumableTrainer`:
`fixtures/<name>/model.keras`, its checkpoint directory, and `io.npz` with
the inputs and the inference outputs they gave when written. The test loads
both with today's code and requires the same outputs, so a refactoring that
moves a weight, renames a layer or reorders variables fails it.
"""

import os
import shutil
import sys

import keras
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import keras_attn  # noqa: E402
import tiny_models  # noqa: E402
from keras_attn.training.resumable import ResumableTrainer  # noqa: E402


def main():
    import tensorflow as tf

    root = os.path.join(HERE, "fixtures")
    shutil.rmtree(root, ignore_errors=True)
    for name, (build, data) in tiny_models.MODELS.items():
        keras.utils.set_random_seed(0)
        model = build()
        x, y = data()
        model.compile(**tiny_models.COMPILE[name]())
        directory = os.path.join(root, name)
        os.makedirs(directory)
        trainer = ResumableTrainer(os.path.join(directory, "checkpoints"), checkpoint_every=2,
                                   max_to_keep=1)
        trainer.fit(model, lambda epoch: tf.data.Dataset.from_tensor_slices((x, y)).batch(2),
                    epochs=1, steps_per_epoch=2, verbose=0)
        model.save(os.path.join(directory, "model.keras"))
        outputs = tiny_models.outputs(model, x)
        np.savez(os.path.join(directory, "io.npz"), **tiny_models.flat("x", x),
                 **tiny_models.flat("out", outputs))
        print(name, "written:", sorted(os.listdir(directory)),
              f"keras_attn {keras_attn.__version__}, keras {keras.__version__}")


if __name__ == "__main__":
    main()
