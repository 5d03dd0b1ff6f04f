"""Trains a tiny dropout model with `ResumableTrainer`; run by test_resumable.py.

    python _resumable_worker.py DIRECTORY RESULT.npz [--hang-after-step N]
        [--die-at-step N] [--die-at-epoch-begin E]
        [--reference REFERENCE_DIRECTORY REFERENCE.npz]

3 epochs x 10 steps, a checkpoint every 3 steps. Writes every model and
optimizer variable and the history to RESULT.npz when training ends.
`--hang-after-step` stops in the middle of training after that step, until
the process is killed (so that a test SIGKILLs it from outside mid-epoch
wherever the machine's load puts it: no race with the epoch's end);
`--die-*` SIGKILL the process itself at a given global step (after the step,
before the checkpoint of that step) or at the beginning of an epoch.
`--reference` first trains the same run uninterrupted (no hang, no death)
in its own directory and writes its result: the run an interrupted one must
end like, without a process of its own (a TensorFlow start costs more than
the training).

Runs on the backend in KERAS_BACKEND. On TensorFlow, op determinism makes
TF pick deterministic kernels (and refuse unseeded random ops), so that
two processes running the same steps get bit-identical results; without it
a multi-threaded CPU reduction may sum in another order. JAX on CPU is
deterministic already.
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attn.training import ResumableTrainer  # noqa: E402

EPOCHS, STEPS, BATCH = 3, 10, 8


def dataset_fn(epoch):
    """The same batches on every call: the shuffle is keyed on the epoch."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((STEPS * BATCH, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    order = np.random.default_rng([17, epoch]).permutation(len(x))
    return tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(BATCH)


def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class Interrupt(keras.callbacks.Callback):
    def __init__(self, hang_after_step, die_at_step, die_at_epoch_begin):
        super().__init__()
        self.hang_after_step, self.die_at_step = hang_after_step, die_at_step
        self.die_at_epoch_begin = die_at_epoch_begin
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if epoch == self.die_at_epoch_begin:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        step = self.epoch * STEPS + batch + 1
        if step == self.die_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        while step == self.hang_after_step:  # until the test kills the process
            time.sleep(1)


def train(directory, result, interrupt):
    model = build_model()
    trainer = ResumableTrainer(directory, checkpoint_every=3)
    history = trainer.fit(
        model,
        dataset_fn,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=[interrupt],
        verbose=2,
    )
    arrays = {f"model.{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.variables)}
    arrays.update(
        (f"optimizer.{i}", keras.ops.convert_to_numpy(v))
        for i, v in enumerate(model.optimizer.variables)
    )
    np.savez(result, history=json.dumps(history), **arrays)


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("result")
    parser.add_argument("--hang-after-step", type=int, default=-1)
    parser.add_argument("--die-at-step", type=int, default=-1)
    parser.add_argument("--die-at-epoch-begin", type=int, default=-1)
    parser.add_argument("--reference", nargs=2, metavar=("DIRECTORY", "RESULT"))
    args = parser.parse_args(argv)
    if keras.backend.backend() == "tensorflow":
        tf.config.experimental.enable_op_determinism()
    if args.reference:
        train(*args.reference, Interrupt(-1, -1, -1))
        keras.backend.clear_session()  # the run below starts as in a new process
        print("reference done", flush=True)
    train(args.directory, args.result,
          Interrupt(args.hang_after_step, args.die_at_step, args.die_at_epoch_begin))
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
