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

Then the same processes train a recipe as users do (`keras_attn.zoo.runs.train`,
what `keras-attn train` calls): the two workers `--distribute` into one shared
output, which the chief (worker 0) alone writes, and the job of one worker
the one-process reference, undistributed, into its own.

Then a lost worker and a resume: a fresh job of two workers trains the
recipe into an output of its own, and worker 1 is killed with SIGKILL
mid-epoch, after the chief's first checkpoint (step 2 of 4). The chief must
stop on its own with the error naming worker 1, keeping only complete
checkpoints; the same two commands again must resume from that checkpoint
to the weights of the one-process reference, and so must a copy of the
stopped run resumed by one process (another worker count).
"""

import faulthandler
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.backend_independent
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOBAL_BATCH = 8
STEPS = 4
# Seconds a test waits for its workers in all (generous: a loaded 2-core
# machine; no duration is asserted).
TIMEOUT = 600
# A tiny vit_tiny_digits (tests/zoo/_tiny.py's sizes): 4 steps of a global
# batch of 32 with a checkpoint at step 2 (mid-epoch: the running metrics
# too) and at the epoch's end. No dropout: under tf.distribute each replica
# draws its own masks, for its share of the batch (the augmentation is the
# pipeline's, keyed by batch, the same on every worker). Adam with an epsilon
# of 1 steps by about lr * m, as SGD does: with the default, a rounding-sized
# difference in a near-zero gradient becomes a whole step (measured: 8e-5).
RECIPE = "vit_tiny_digits"
OVERRIDES = ["model.overrides.num_layers=1", "model.overrides.hidden_dim=16",
             "model.overrides.intermediate_dim=32", "model.overrides.num_heads=2",
             "model.overrides.dropout=0.0", "training.optimizer.epsilon=1.0",
             "training.optimizer.learning_rate=0.05", "training.epochs=1",
             "training.steps_per_epoch=4", "training.checkpoint_every=2",
             "training.jit_compile=false", "training.batch_size=32"]


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


def _writes_under(directory):
    """The paths under `directory` that this process opens for writing,
    creates, renames or removes from now on (Python's audit events: the
    package's files are all written from Python but the chief's TensorBoard
    logs); a list, filled as it goes."""
    root = os.path.realpath(directory)
    found = []

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = any(c in (mode or "") for c in "wax+") or flags & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        else:
            path, writes = args[0], event in ("os.mkdir", "os.rename", "os.remove",
                                              "os.rmdir", "shutil.rmtree")
        if writes and isinstance(path, (str, os.PathLike)):
            if os.path.realpath(path).startswith(root):
                found.append(os.fspath(path))

    sys.addaudithook(hook)
    return found


def _collectives_check():
    """What `broadcast_arrays` and `broadcast_json` give this worker when
    each worker sends its own values (process 0's are received), and what
    `check_processes_agree` says of a seed that differs between workers."""
    from keras_attn.training import distribute

    index = distribute.process_index()
    arrays = [np.array([-0.0, np.nan, 1.5 + index], "float32"),
              np.arange(3, dtype="int64") - 2 ** 40 * index, np.array([index] * 5, "uint8"),
              np.array([[True, index == 0]])]
    received = distribute.broadcast_arrays(arrays)
    try:
        distribute.check_processes_agree({"recipe": "same", "seed": index})
        refusal = None
    except ValueError as error:
        refusal = str(error)
    return {"arrays": [[a.dtype.str, a.shape, a.tobytes().hex()] for a in received],
            "json": distribute.broadcast_json({"from": index}), "refusal": refusal}


def _worker(reference, output):
    """Prints one JSON line: this worker's distributed run, and with
    `reference` the same training outside the strategy, in this process;
    then its `runs.train` of RECIPE into `output` (distributed but with
    `reference`), what it returned and the paths it wrote there."""
    import keras

    keras.config.disable_traceback_filtering()  # whole tracebacks in failures
    result = _train(distributed=True)
    if reference:
        result["reference"] = _train(distributed=False)
    from keras_attn.training.distribute import initialize_processes
    from keras_attn.zoo import runs

    result["process"] = initialize_processes()
    result["collectives"] = _collectives_check()
    written = _writes_under(output)
    returned = runs.train(RECIPE, OVERRIDES, output=output, distribute=not reference,
                          export=False, verbose=0)
    result.update(returned=sorted(returned), written=written)
    print(json.dumps(result))


def _train_or_die(output, die):
    """`runs.train` of RECIPE into `output` as a worker of a job, printing
    the keys it returned; with `die`, this worker kills itself with SIGKILL
    (no cleanup, no exception: as `kill -9` from outside) once it has taken
    part in the first checkpoint (step 2 of 4) and the chief's files of that
    checkpoint are complete, mid-epoch: a worker lost at a known step."""
    import keras

    keras.config.disable_traceback_filtering()
    # Where it hangs, should it: every thread's stack, before `_ended` kills it.
    faulthandler.dump_traceback_later(TIMEOUT - 60)
    from keras_attn.training.resumable import ResumableTrainer
    from keras_attn.zoo import runs

    if die:
        write = ResumableTrainer._write_checkpoint
        manifest = os.path.join(output, "checkpoints", "ckpt-00000002.json")

        def write_then_die(self, *args, **kwargs):
            write(self, *args, **kwargs)
            while not os.path.exists(manifest):  # written by the chief, before step 3
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

        ResumableTrainer._write_checkpoint = write_then_die
    returned = runs.train(RECIPE, OVERRIDES, output=output, distribute=True, export=False,
                          verbose=0)
    print(json.dumps(sorted(returned)))


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _start(workers, index, output, reference=False, mode="--worker"):
    """Worker `index` of a job of `len(workers)` workers (addresses), its
    recipe run written to `output`; `mode`: this file's `--worker`, or
    `--train` (`_train_or_die`, `--die` appended to die). No `workers`: one
    process, without TF_CONFIG."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    if workers:
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *mode.split(), str(output)]
        + (["--reference"] if reference else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ended(processes):
    """`[(returncode, stdout, stderr)]` of each process, once all ended;
    what is still running after TIMEOUT seconds in all (a worker left
    waiting for its peer) is killed, its output kept (`_train_or_die`'s
    workers have printed their threads' stacks by then)."""
    deadline = time.monotonic() + TIMEOUT
    outputs = []
    try:
        for process in processes:
            try:
                outputs.append(process.communicate(
                    timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                process.kill()
                outputs.append(process.communicate())
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return [(process.returncode, *output) for process, output in zip(processes, outputs)]


def _results(processes):
    results = []
    for code, stdout, stderr in _ended(processes):
        assert code == 0, stderr[-3000:]
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


def _weights(path):
    """`{variable path: values}` of a saved model."""
    import keras

    import keras_attn  # noqa: F401 - registers the layers the file names

    model = keras.saving.load_model(path, compile=False)
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def _files(run):
    """The run's files, relative (TensorBoard's event files by folder: their
    names hold the time and the process id)."""
    return sorted(os.path.dirname(os.path.relpath(os.path.join(folder, name), run))
                  if name.startswith("events.out.tfevents") else
                  os.path.relpath(os.path.join(folder, name), run)
                  for folder, _, names in os.walk(run) for name in names)


def _assert_one_run_written_by_the_chief(single, shared, both):
    """The shared output holds one run, the reference's files and weights;
    worker 1 wrote nothing there and said so."""
    chief, other = both
    assert (chief["process"], other["process"]) == ([0, 2], [1, 2])
    assert _files(shared) == _files(single)
    assert "checkpoints/ckpt-00000002.npz" in _files(shared)
    assert "checkpoints/ckpt-00000004.npz" in _files(shared)
    results = json.loads((shared / "results.json").read_text())
    assert chief["returned"] == sorted([*results, "output"])
    assert other["returned"] == ["message", "name", "output", "process", "processes"]
    assert chief["written"] and other["written"] == []
    assert results["steps"] == json.loads((single / "results.json").read_text())["steps"] == 4
    expected, found = _weights(single / "model.keras"), _weights(shared / "model.keras")
    assert sorted(found) == sorted(expected)
    # (measured: at most 3.9e-8 apart; 0.04 when each worker also kept
    # only its half of every batch, as JAX processes do)
    for name in expected:
        np.testing.assert_allclose(found[name], expected[name], rtol=0, atol=1e-6,
                                   err_msg=name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The jobs of one worker (with the reference) and of two workers:
    `(reference run directory, shared run directory, what the worker of one
    printed, what each of the two printed)`."""
    # (Was also tests/training/test_distribute.py's one-worker TF_CONFIG
    # test, which trained in a process of its own.)
    tmp_path = tmp_path_factory.mktemp("tf_workers")
    alone = [f"localhost:{_free_port()}"]
    pair = [f"localhost:{_free_port()}" for _ in range(2)]
    reference_run, shared_run = tmp_path / "single", tmp_path / "shared"
    processes = [_start(alone, 0, reference_run, reference=True)] + [
        _start(pair, index, shared_run) for index in range(2)]
    one, *both = _results(processes)
    return reference_run, shared_run, one, both


@pytest.mark.large
@pytest.mark.exclusive
def test_one_and_two_tensorflow_workers_fit_like_one_process(trained):
    reference_run, shared_run, one, both = trained
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
    # A one-worker TF_CONFIG is one process; of two workers, each receives
    # the chief's values, bit for bit, and each refuses a differing seed.
    assert one["process"] == [0, 1]
    assert one["collectives"]["refusal"] is None  # nothing to compare with
    sent, received = (worker["collectives"] for worker in both)
    assert received["arrays"] == sent["arrays"]
    assert received["json"] == sent["json"] == {"from": 0}
    for index, worker in enumerate(both):
        assert worker["collectives"]["refusal"].startswith(
            "The processes of this job were started with another seed: process 1 differs "
            f"from process 0 (this is process {index} of 2)")
    _assert_one_run_written_by_the_chief(reference_run, shared_run, both)


def _assert_survivor_named_the_lost_worker(run, survivor, lost, workers, stderr):
    """Worker `survivor` stopped with the error naming worker `lost`, and
    the run holds the chief's complete checkpoint of step 2, nothing
    half-written and no model."""
    from keras_attn.training.checkpoints import CheckpointManager

    assert (f"RuntimeError: Process {survivor} of 2 (TF_CONFIG's worker {survivor}): a "
            f"collective of this job failed: process {lost} (TF_CONFIG's worker {lost}, "
            f"{workers[lost]}) was lost") in stderr, stderr[-3000:]
    assert "run the same commands again to resume" in stderr
    assert not os.path.exists(run / "model.keras")
    assert not os.path.exists(run / "results.json")
    assert not glob.glob(str(run / "**" / "*.tmp"), recursive=True)
    assert CheckpointManager(str(run / "checkpoints")).latest().step == 2


@pytest.mark.parametrize("message, lost", [
    # The chief's coordination service saw worker 2's heartbeats stop.
    ("Collective ops is aborted by: Error reported from /job:worker/task:2: The following "
     "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2",
     "process 2 (TF_CONFIG's worker 2, w2:3) was lost"),
    ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC "
     "error information from remote target /job:worker/replica:0/task:0 while calling",
     "process 0 (TF_CONFIG's worker 0, w0:1) was lost"),
    ("Collective ops is aborted by: Socket closed",
     "a worker was lost (TensorFlow's error names none), one of process 0 (TF_CONFIG's "
     "worker 0, w0:1), process 2 (TF_CONFIG's worker 2, w2:3)"),
])
def test_a_collective_aborted_by_a_lost_worker_names_it(monkeypatch, message, lost):
    # This worker is worker 1 of 3; TensorFlow's error names the lost task,
    # or none. Any other error, and a job of one worker, pass unchanged.
    import tensorflow as tf

    from keras_attn.training import distribute

    def strategy(workers):
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": workers}), task_type="worker",
            task_id=len(workers) // 2)
        return type("Strategy", (), {"cluster_resolver": resolver})()

    monkeypatch.setattr(distribute, "_TF_STRATEGIES",
                        {"multi_worker": strategy(["w0:1", "w1:2", "w2:3"])})
    with pytest.raises(RuntimeError) as raised:
        with distribute.naming_lost_processes():
            raise tf.errors.UnavailableError(None, None, "Graph execution error:\n" + message)
    assert str(raised.value).startswith(
        "Process 1 of 3 (TF_CONFIG's worker 1): a collective of this job failed: " + lost)
    assert isinstance(raised.value.__cause__, tf.errors.UnavailableError)
    other = tf.errors.InvalidArgumentError(None, None, "labels out of range")
    with pytest.raises(tf.errors.InvalidArgumentError):
        with distribute.naming_lost_processes():
            raise other
    monkeypatch.setattr(distribute, "_TF_STRATEGIES", {"multi_worker": strategy(["w0:1"])})
    with pytest.raises(tf.errors.UnavailableError):
        with distribute.naming_lost_processes():
            raise tf.errors.UnavailableError(None, None, message)


def test_a_worker_lost_during_the_start_of_run_checks_is_named(monkeypatch, tmp_path):
    # The checks before any step (every process's recipe, seed, data,
    # versions) are collectives: a worker lost there is named as in `fit`,
    # before anything is written.
    import tensorflow as tf

    from keras_attn.training import distribute
    from keras_attn.zoo import runs

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["w0:1", "w1:2"]}), task_type="worker", task_id=0)
    monkeypatch.setattr(distribute, "_TF_STRATEGIES", {
        "multi_worker": type("Strategy", (), {"cluster_resolver": resolver})()})
    monkeypatch.setattr(distribute, "initialize_processes", lambda: (0, 2))

    def lost(values):
        raise tf.errors.UnavailableError(
            None, None, "Collective ops is aborted by: Error reported from /job:worker/task:1: "
            "The following tasks are unhealthy (stopped sending heartbeats):\n"
            "/job:worker/replica:0/task:1")

    monkeypatch.setattr(distribute, "check_processes_agree", lost)
    with pytest.raises(RuntimeError, match=r"^Process 0 of 2 \(TF_CONFIG's worker 0\): a "
                                           r"collective of this job failed: process 1 "
                                           r"\(TF_CONFIG's worker 1, w1:2\) was lost"):
        runs.train(RECIPE, OVERRIDES, output=str(tmp_path / "run"), distribute=True,
                   export=False, verbose=0)
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.large
@pytest.mark.exclusive
def test_a_lost_tensorflow_worker_is_named_and_the_job_resumes(trained, tmp_path):
    # Worker 1 dies after the chief's first checkpoint; the chief, which
    # writes the run, must stop on its own naming it. (The chief lost
    # instead, worker 1 stops naming worker 0, "from remote target
    # /job:worker/replica:0/task:0": checked by hand, see docs/distributed.md.)
    reference_run, run = trained[0], tmp_path / "run"
    workers = [f"localhost:{_free_port()}" for _ in range(2)]
    (code, _, stderr), (lost_code, _, lost_stderr) = _ended(
        [_start(workers, 0, run, mode="--train"),
         _start(workers, 1, run, mode="--train --die")])
    assert lost_code == -signal.SIGKILL, lost_stderr[-3000:]
    assert code == 1, stderr[-3000:]  # ended on its own, within `_ended`'s generous limit
    _assert_survivor_named_the_lost_worker(run, 0, 1, workers, stderr)
    manifest = run / "checkpoints" / "ckpt-00000002.json"
    written = os.stat(manifest).st_mtime_ns

    # The same two commands again, fresh workers on fresh ports: the chief
    # resumes from its checkpoint (left as it was: a start from scratch
    # would write it again) to the weights of the one-process run. Beside
    # them, a copy of the stopped run resumes on ONE process (no TF_CONFIG:
    # another worker count), to the same weights.
    alone = tmp_path / "resumed_alone"
    shutil.copytree(run, alone)
    workers = [f"localhost:{_free_port()}" for _ in range(2)]
    chief, other, single = _results([_start(workers, index, run, mode="--train")
                                     for index in range(2)]
                                    + [_start(None, 0, alone, mode="--train")])
    assert "steps" in chief and "steps" in single
    assert other == ["message", "name", "output", "process", "processes"]
    expected = _weights(reference_run / "model.keras")
    for resumed in (run, alone):
        checkpoint = resumed / "checkpoints" / "ckpt-00000002.json"
        assert os.stat(checkpoint).st_mtime_ns == written, resumed.name
        assert json.loads((resumed / "results.json").read_text())["steps"] == 4
        found = _weights(resumed / "model.keras")
        assert sorted(found) == sorted(expected)
        for name in expected:
            np.testing.assert_allclose(found[name], expected[name], rtol=0, atol=1e-6,
                                       err_msg=f"{resumed.name}: {name}")


if __name__ == "__main__" and sys.argv[1] == "--worker":
    _worker(reference=sys.argv[3:] == ["--reference"], output=sys.argv[2])
elif __name__ == "__main__" and sys.argv[1] == "--train":
    _train_or_die(output=sys.argv[-1], die=sys.argv[2] == "--die")
