"""Gradient checkpointing: peak memory and step time of a BERT training step
with `remat=False` and `remat=True`. Not a test.

Each setting runs in a fresh child process (peak RSS is per process), so the
step times are not interleaved like the other benchmarks': read them as
rough. On JAX the script also prints the bytes the backward pass keeps from
the forward pass (the leaves of `jax.vjp`'s function), which does not depend
on how the compiler schedules the program.

Run:
    python benchmarks/remat.py                                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/remat.py --steps 5
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def child(args):
    import keras
    import numpy as np
    from keras import ops

    from keras_attn.models.bert import build_bert

    keras.utils.set_random_seed(0)
    model = build_bert(
        "bert_mini", vocabulary_size=1000, num_layers=args.num_layers,
        max_sequence_length=args.length, remat=args.remat,
    )
    ids = np.random.default_rng(0).integers(1, 1000, (args.batch_size, args.length)).astype("int32")
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
              "padding_mask": np.ones_like(ids)}

    def loss_of(outputs):
        return ops.mean(ops.square(outputs["sequence_output"]))

    saved_mib = None
    if keras.backend.backend() == "jax":
        import jax

        state = [v.value for v in model.non_trainable_variables]

        def loss(values):
            outputs, _ = model.stateless_call(values, state, inputs, training=True)
            return loss_of(outputs)

        trainable = [v.value for v in model.trainable_variables]
        saved = jax.eval_shape(  # shapes only: nothing is computed
            lambda values: jax.tree_util.tree_leaves(jax.vjp(loss, values)[1]), trainable
        )
        saved_mib = sum(np.prod(s.shape) * s.dtype.itemsize for s in saved) / 2**20
        grad = jax.jit(jax.grad(loss))

        def step():
            jax.block_until_ready(grad(trainable))

    else:
        import tensorflow as tf

        @tf.function
        def train_step():
            with tf.GradientTape() as tape:
                loss = loss_of(model(inputs, training=True))
            return tape.gradient(loss, model.trainable_variables)

        def step():
            tf.nest.map_structure(lambda g: g if g is None else g.numpy(), train_step(),
                                  expand_composites=True)

    step()  # compiles
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_s": float(np.median(times)),
        "saved_mib": saved_mib,
        "parameters": model.count_params(),
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--remat", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.remat is not None:
        args.remat = bool(args.remat)
        return child(args)
    import keras

    print(f"backend {keras.backend.backend()}, bert_mini widths, {args.num_layers} layers, "
          f"batch {args.batch_size} x {args.length}, median of {args.steps} steps")
    results = {}
    for remat in (0, 1):
        command = [sys.executable, __file__, "--remat", str(remat),
                   "--num-layers", str(args.num_layers), "--batch-size", str(args.batch_size),
                   "--length", str(args.length), "--steps", str(args.steps)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[remat] = result = json.loads(output.strip().splitlines()[-1])
        saved = "" if result["saved_mib"] is None else f", saved for backward {result['saved_mib']:.0f} MiB"
        print(f"remat={bool(remat)!s:5}: peak RSS {result['peak_rss_mib']:.0f} MiB, "
              f"step {result['step_s']:.2f} s{saved}")
    plain, remat = results[0], results[1]
    print(f"remat / plain: peak RSS {remat['peak_rss_mib'] / plain['peak_rss_mib']:.2f}, "
          f"step time {remat['step_s'] / plain['step_s']:.2f}")


if __name__ == "__main__":
    main()
