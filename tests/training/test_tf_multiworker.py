"""`data_parallel` on TensorFlow with `TF_CONFIG` (one process per worker,
one CPU device each, on localhost): `Model.fit` and `evaluate` run under
the MultiWorkerMirroredStrategy, which Keras 3 alone cannot do
(keras-team/keras#20585; `keras_attn._keras_compat.tensorflow_multi_worker_fit`), and
two workers, like one, end with the weights of one process given the same
global batch.

The processes run this file as a script (`--worker`): the strategy must be
made before TensorFlow initialises. The job of one worker also trains the
reference afterwards, outside the strategy (`data_parallel(enabled=False)`):
one process on its one CPU device. Tolerance 1e-6: the runs differ only in
the order float32 sums are taken, and SGD keeps that rounding-sized.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.backend_independent
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOBAL_BATCH = 8
STEPS = 4


def _train(distributed):
    """Trains a tiny ViT for 2 epochs of STEPS global batches under
    `data_parallel(enabled=distributed)` and evaluates it: what this
    process sees."""
    import keras
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    from keras_attn.models.vit import build_vit
    from keras_attn.training.distribute import data_parallel

    originals = (trainer.reduce_per_replica, trainer.TensorFlowTrainer._maybe_symbolic_build)
    with data_parallel(enabled=distributed) as replicas:
        rng = np.random.default_rng(1)
        images = rng.integers(0, 256, (STEPS * GLOBAL_BATCH, 8, 8, 1)).astype("uint8")
        labels = rng.integers(0, 3, STEPS * GLOBAL_BATCH).astype("int32")
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH)
        keras.utils.set_random_seed(0)
        model = build_vit("vit_tiny_16", num_classes=3, image_size=8, patch_size=4,
                          num_channels=1, hidden_dim=16, num_layers=1, num_heads=2,
                          intermediate_dim=32)
        model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # The reference op by op: the same arithmetic, without tracing graphs.
        model.run_eagerly = not distributed
        history = model.fit(dataset, epochs=2, verbose=0).history
        evaluation = model.evaluate(dataset, verbose=0, return_dict=True)
        strategy = type(tf.distribute.get_strategy()).__name__
    restored = originals == (trainer.reduce_per_replica,
                             trainer.TensorFlowTrainer._maybe_symbolic_build)
    return {
        "replicas": replicas, "strategy": strategy, "history": history,
        "evaluation": evaluation, "restored": restored,
        "weights": [keras.ops.convert_to_numpy(v).tolist() for v in model.weights],
    }


def _worker(reference):
    """Prints one JSON line: this worker's distributed run, and with
    `reference` the same training outside the strategy, in this process."""
    import keras

    keras.config.disable_traceback_filtering()  # whole tracebacks in failures
    result = _train(distributed=True)
    if reference:
        result["reference"] = _train(distributed=False)
    print(json.dumps(result))


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _start(workers, index, reference=False):
    """Worker `index` of a job of `len(workers)` workers (addresses)."""
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
               TF_CONFIG=json.dumps(tf_config))
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker"]
        + (["--reference"] if reference else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _results(processes, timeout=600):
    try:
        outputs = [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:  # a worker left waiting for its peer
            process.kill()
            process.wait()
    results = []
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def _assert_trained_alike(worker, single):
    """Every step's logs (for two workers: the mean over both), the
    evaluation and the weights."""
    assert worker["restored"]  # Keras's own code is back after the block
    for key, values in single["history"].items():
        np.testing.assert_allclose(worker["history"][key], values, rtol=1e-6)
    for key, value in single["evaluation"].items():
        np.testing.assert_allclose(worker["evaluation"][key], value, rtol=1e-6)
    for trained, reference in zip(worker["weights"], single["weights"], strict=True):
        np.testing.assert_allclose(trained, reference, rtol=0, atol=1e-6)


@pytest.mark.large
def test_one_and_two_tensorflow_workers_fit_like_one_process():
    # (Was also tests/training/test_distribute.py's one-worker TF_CONFIG
    # test, which trained in a process of its own.)
    alone = [f"localhost:{_free_port()}"]
    pair = [f"localhost:{_free_port()}" for _ in range(2)]
    processes = [_start(alone, 0, reference=True)] + [_start(pair, index) for index in range(2)]
    one, *both = _results(processes)
    single = one["reference"]
    assert (single["replicas"], single["strategy"]) == (1, "_DefaultDistributionStrategy")
    # A one-worker TF_CONFIG selects the multi-worker strategy: one replica.
    assert (one["replicas"], one["strategy"]) == (1, "CollectiveAllReduceStrategy")
    _assert_trained_alike(one, single)
    for worker in both:
        assert (worker["replicas"], worker["strategy"]) == (2, "CollectiveAllReduceStrategy")
        _assert_trained_alike(worker, single)
    for a, b in zip(both[0]["weights"], both[1]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)  # the replicas stay identical


if __name__ == "__main__" and sys.argv[1] == "--worker":
    _worker(reference=sys.argv[2:] == ["--reference"])
