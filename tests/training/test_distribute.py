"""`data_parallel`: two replicas train like one device with the same global
batch, on TensorFlow (two logical CPU devices) and JAX (two XLA host devices).

The training runs happen in `distribute_worker.py` subprocesses, because the
devices must be configured before TensorFlow or JAX initialises; each worker
trains every model once on one device and once under `data_parallel`, from
the same seed, for 4 steps of a global batch of 8. `TF_CONFIG` jobs (one
worker and several): tests/training/test_tf_multiworker.py.

Tolerance: per-step losses agree to `RTOL = 1e-5` relative. The runs differ
only in the order float32 sums are taken (per replica, then across replicas),
about 1e-7 relative per step; the workers train with SGD, whose update is
linear in the gradient, so that stays 1e-7 after 4 steps (measured: at most
8e-7, including the rounding of recovering step losses from Keras's running
mean). The effects these tests must tell apart are far larger: a loss not
scaled for the replicas doubles (the Conformer bug fixed here), and a mean
taken per replica moves the first losses of BERT pretraining and of the
Transformer by 1e-4 to 1e-2 relative on this data.
"""

import inspect
import json
import os
import socket
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from keras_attn.training import distribute
from keras_attn.training.distribute import data_parallel
from keras_attn.training.distribute import describe_replicas
from test_case import jax_cpu_devices_flags

# The training runs choose their engine in their own subprocesses; the rest
# is argument checking: run once, in the TensorFlow pass.
# One worker runs the module: its training-run fixtures are computed once
# (`--dist loadgroup`), not once per pytest-xdist worker.
pytestmark = [pytest.mark.backend_independent, pytest.mark.xdist_group("distribute")]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "distribute_worker.py")
RTOL = 1e-5
STEPS = 4  # batches of 8 in the workers' 32 examples: global batches
TF_MODELS = ("vit", "bert_pretrainer", "transformer", "conformer")
JAX_MODELS = ("vit", "bert_pretrainer", "transformer")
# Losses that are means over a count varying per example (real predictions,
# real tokens): tf.distribute takes them per replica (see distribute.py).
PER_REPLICA_MEANS = ("bert_pretrainer", "transformer")


def _env(engine, jax_devices=2, **extra):
    env = dict(os.environ, KERAS_BACKEND=engine, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    if engine == "jax":
        # After this process's own flags (conftest.py's faster XLA compile:
        # a third of the JAX workers' CPU time), which the device count's
        # flags override where they overlap.
        env["XLA_FLAGS"] = " ".join(
            [os.environ.get("XLA_FLAGS", ""), jax_cpu_devices_flags(jax_devices)])
    env.update(extra)
    return env


def _worker_command(engine, models, output_dir, multi_worker=False):
    command = [sys.executable, WORKER, "--engine", engine, "--models", ",".join(models)]
    return command + (["--multi-worker"] if multi_worker else []) + [str(output_dir)]


def _result(completed):
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _run_worker(engine, models, output_dir):
    return _result(
        subprocess.run(
            _worker_command(engine, models, output_dir),
            capture_output=True, text=True, env=_env(engine), timeout=600,
        )
    )


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def tf_runs(tmp_path_factory):
    return _run_worker("tensorflow", TF_MODELS, tmp_path_factory.mktemp("tf"))


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    return _run_worker("jax", JAX_MODELS, tmp_path_factory.mktemp("jax"))


def _check_two_replicas(run, inside, outside):
    single, parallel = run["single"], run["distributed"]
    assert (single["replicas"], parallel["replicas"]) == (1, 2)
    assert (single["weight_devices"], parallel["weight_devices"]) == (1, 2)
    assert (single["inside"], parallel["inside"]) == (outside, inside)
    assert parallel["after"] == outside  # the block put the previous state back
    # 32 examples in batches of 8 take 4 steps on 2 replicas too: the dataset
    # batch is the global batch, not the per-replica one.
    assert len(single["losses"]) == len(parallel["losses"]) == STEPS


@pytest.mark.large
@pytest.mark.parametrize("name", ["vit", "conformer"])
def test_tensorflow_two_replicas_match_one_device(tf_runs, name):
    run = tf_runs[name]
    _check_two_replicas(run, inside="MirroredStrategy", outside="_DefaultDistributionStrategy")
    np.testing.assert_allclose(
        run["distributed"]["losses"], run["single"]["losses"], rtol=RTOL
    )


@pytest.mark.large
@pytest.mark.parametrize("name", PER_REPLICA_MEANS)
def test_tensorflow_takes_count_normalised_means_per_replica(tf_runs, name):
    """The first step's loss is that of the batch's two halves averaged (the
    documented tf.distribute behaviour), which differs from the batch's own
    by more than the tolerance."""
    run = tf_runs[name]
    _check_two_replicas(run, inside="MirroredStrategy", outside="_DefaultDistributionStrategy")
    first = run["distributed"]["losses"][0]
    np.testing.assert_allclose(first, run["single"]["split_first_loss"], rtol=RTOL)
    assert abs(first - run["single"]["losses"][0]) > RTOL * abs(first)


@pytest.mark.large
@pytest.mark.parametrize("name", JAX_MODELS)
def test_jax_two_replicas_match_one_device(jax_runs, name):
    run = jax_runs[name]
    _check_two_replicas(run, inside="DataParallel", outside="NoneType")
    np.testing.assert_allclose(
        run["distributed"]["losses"], run["single"]["losses"], rtol=RTOL
    )
    if name in PER_REPLICA_MEANS:
        # The halves' average differs by more than the tolerance, so the
        # match shows that JAX took the mean over the global batch.
        split = run["single"]["split_first_loss"]
        assert abs(split - run["single"]["losses"][0]) > RTOL * abs(split)


@pytest.mark.large
@pytest.mark.parametrize(
    "engine, name",
    [("tensorflow", name) for name in TF_MODELS] + [("jax", name) for name in JAX_MODELS],
)
def test_keras_save_after_distributed_training_reloads(tf_runs, jax_runs, engine, name):
    runs = tf_runs if engine == "tensorflow" else jax_runs
    assert runs[name]["distributed"]["reload_max_diff"] < 1e-5


@pytest.mark.large
def test_jax_two_processes_match_one_device(jax_runs, tmp_path):
    """The multi-host route of the README on one machine: two processes of
    one CPU device each, joined by `keras.distribution.initialize()` from the
    KERAS_DISTRIBUTION_* variables; each process reads its half of every
    global batch."""
    port = _free_port()
    for rank in range(2):
        (tmp_path / str(rank)).mkdir()
    processes = [
        subprocess.Popen(
            _worker_command("jax", ["vit"], tmp_path / str(rank), multi_worker=True),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env(
                "jax", jax_devices=1,
                KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                KERAS_DISTRIBUTION_PROCESS_ID=str(rank),
            ),
        )
        for rank in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=300) for process in processes]
    finally:
        for process in processes:  # a process left waiting for its peer
            process.kill()
    single = jax_runs["vit"]["single"]["losses"]
    for process, (stdout, stderr) in zip(processes, outputs):
        result = _result(subprocess.CompletedProcess([], process.returncode, stdout, stderr))
        run = result["vit"]["distributed"]
        assert (run["replicas"], run["weight_devices"], run["inside"]) == (2, 2, "DataParallel")
        np.testing.assert_allclose(run["losses"], single, rtol=RTOL)
        assert run["reload_max_diff"] == 0.0  # the saved weights are the trained ones


# --- In the test process: TensorFlow backend, one CPU device ---------------


@pytest.mark.tf_only
def test_disabled_is_a_no_op():
    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with data_parallel(enabled=False) as replicas:
            assert replicas == 1
            assert not tf.distribute.has_strategy()


@pytest.mark.tf_only
def test_one_device_warns_and_trains_undistributed():
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) == 1  # no GPU build here
    with pytest.warns(UserWarning, match="only one device was found"):
        with data_parallel() as replicas:
            assert replicas == 1
            assert not tf.distribute.has_strategy()


@pytest.mark.tf_only
def test_named_devices_are_used_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with data_parallel(devices=["/cpu:0"]) as replicas:
            import tensorflow as tf

            strategy = tf.distribute.get_strategy()
            assert replicas == 1
            assert isinstance(strategy, tf.distribute.MirroredStrategy)


def test_torch_backend_is_refused(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(ValueError, match="not on torch. Received: backend='torch'"):
        with data_parallel():
            pass
    with data_parallel(enabled=False) as replicas:  # disabled: no backend needed
        assert replicas == 1


@pytest.mark.parametrize("devices", ["/gpu:0", [], ["/gpu:0", 1]])
def test_malformed_devices_are_refused(devices):
    with pytest.raises(ValueError, match="Received: devices="):
        with data_parallel(devices=devices):
            pass


@pytest.mark.tf_only
def test_devices_cannot_be_named_with_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{}")
    with pytest.raises(ValueError, match="cannot be chosen when TF_CONFIG is set"):
        with data_parallel(devices=["/cpu:0"]):
            pass


def test_jax_initialize_reads_the_keras_distribution_variables():
    assert distribute.JAX_PROCESS_ENV == (
        "KERAS_DISTRIBUTION_JOB_ADDRESSES",
        "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID",
    )
    source = inspect.getsource(keras.distribution.initialize)
    for name in distribute.JAX_PROCESS_ENV:
        assert f'"{name}"' in source


def test_heartbeat_timeout_variable_reaches_jax_initialize(monkeypatch):
    """KERAS_ATTN_HEARTBEAT_TIMEOUT is how long JAX's distributed runtime
    waits for a silent process (tests/zoo/test_multiprocess.py loses one);
    unset, JAX's default stays; a value that is not a positive integer is
    refused by name before anything connects."""
    import jax
    from keras.src.backend.jax import distribution_lib

    # What keras.distribution.initialize does on the JAX backend: it calls
    # jax.distributed.initialize with the job's address and ids only.
    assert "jax.distributed.initialize(" in inspect.getsource(distribution_lib.initialize)
    calls = []

    def recorded(**kwargs):
        calls.append(kwargs)

    monkeypatch.setattr(jax.distributed, "initialize", recorded)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(keras.distribution, "initialize", lambda address, count, index: (
        jax.distributed.initialize(coordinator_address=address, num_processes=count,
                                   process_id=index)))
    for name, value in zip(distribute.JAX_PROCESS_ENV, ("localhost:1234", "2", "1")):
        monkeypatch.setenv(name, value)
    job = dict(coordinator_address="localhost:1234", num_processes=2, process_id=1)
    monkeypatch.delenv(distribute.HEARTBEAT_TIMEOUT_ENV, raising=False)
    distribute._jax_initialize()
    monkeypatch.setenv(distribute.HEARTBEAT_TIMEOUT_ENV, "15")
    distribute._jax_initialize()
    assert calls == [job, dict(job, heartbeat_timeout_seconds=15)]
    assert jax.distributed.initialize is recorded  # put back after the call
    for value in ("0", "ten"):
        monkeypatch.setenv(distribute.HEARTBEAT_TIMEOUT_ENV, value)
        with pytest.raises(ValueError, match=f"`KERAS_ATTN_HEARTBEAT_TIMEOUT`: it must be a "
                           f"positive integer. Received: KERAS_ATTN_HEARTBEAT_TIMEOUT='{value}'"):
            distribute._jax_initialize()
    assert len(calls) == 2


def test_describe_replicas():
    assert describe_replicas(4, batch_size=64) == (
        "4 replicas: global batch 64 = 16 examples per replica per step"
    )
    with pytest.raises(ValueError, match="multiple of the 2 replicas.*batch_size=9"):
        describe_replicas(2, batch_size=9)
    with pytest.raises(ValueError, match="Received: replicas=0"):
        describe_replicas(0, batch_size=8)
    with pytest.raises(ValueError, match="Received: batch_size=True"):
        describe_replicas(1, batch_size=True)


@pytest.mark.tf_only
def test_process_rows_gives_each_process_its_slice_of_every_batch():
    """Process k of N keeps rows k/N to (k+1)/N of each batch, short ones
    too: the processes' slices, in order, are the global batch."""
    import tensorflow as tf

    images = np.arange(12, dtype="float32").reshape(6, 2)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(6))).batch(4)  # 4, 2
    slices = [list(distribute.process_rows(dataset, k, 2).as_numpy_iterator()) for k in (0, 1)]
    assert [len(x) for x, _ in slices[0]] == [2, 1]
    for batch, (global_x, global_y) in enumerate(dataset.as_numpy_iterator()):
        np.testing.assert_array_equal(
            np.concatenate([slices[k][batch][0] for k in (0, 1)]), global_x)
        np.testing.assert_array_equal(
            np.concatenate([slices[k][batch][1] for k in (0, 1)]), global_y)
