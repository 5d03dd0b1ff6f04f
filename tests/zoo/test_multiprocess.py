"""`keras-attn train --distribute` as two JAX processes on this machine (JAX's
CPU collectives over gloo between local processes), joined by
`KERAS_DISTRIBUTION_*` on a free port: one run written by process 0, a lost
worker, a resume (by the two processes, and by one: another process count),
a worker started differently.

Every process is started and ended here (killed in a `finally`); nothing is
left running. The timeouts are generous (a loaded 2-core machine) and no
duration is asserted.
"""

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

from _tiny import ROOT
from _tiny import TINY
from test_case import jax_cpu_devices_flags

pytestmark = [pytest.mark.backend_independent, pytest.mark.slow,
              pytest.mark.xdist_group("distribute"), pytest.mark.exclusive]
RECIPE = "vit_tiny_digits"
# Compiled steps (as on a GPU); checkpoints every 2 of 6 steps of a global
# batch of 32, an epoch that reads the data's short last batch too.
SETS = TINY[RECIPE] + ["training.epochs=1", "training.steps_per_epoch=6",
                       "training.checkpoint_every=2", "training.jit_compile=true",
                       "training.batch_size=32"]
TIMEOUT = 900
# JAX's heartbeat timeout in the jobs (KERAS_ATTN_HEARTBEAT_TIMEOUT, read by
# keras_attn.training.distribute): a survivor ends that long after its peer
# is lost, 100 s by default. The heartbeats come from a thread of their own,
# so a loaded machine's slow steps do not delay them.
HEARTBEAT_SECONDS = "15"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _command(output, extra=(), recipe=RECIPE, sets=SETS):
    sets = [item for value in list(sets) + list(extra) for item in ("--set", value)]
    return [sys.executable, "-m", "keras_attn.cli", "train", recipe, "--output", str(output),
            "--verbose", "0", "--distribute", "--no-export", *sets]


def _env(**extra):
    # One device a process, beside this process's own flags (conftest.py's
    # faster XLA compile: jax_cpu_devices_flags keeps them).
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS=jax_cpu_devices_flags(1),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    for name in list(env):
        if name.startswith("KERAS_DISTRIBUTION_") or name in ("TF_CONFIG", "SLURM_PROCID",
                                                              "RANK", "JOBSET_NAME"):
            env.pop(name)
    env.update(extra)
    return env


def _start(tmp_path, outputs, extras=((), ()), **command):
    """Two processes of one job, process k writing its output to
    `outputs[k]` (`command`: `_command`'s recipe and sets); returns the
    Popen objects (output in files beside)."""
    port = _free_port()
    processes = []
    for rank, (output, extra) in enumerate(zip(outputs, extras)):
        log = open(tmp_path / f"log{rank}-{port}.txt", "w+")
        processes.append(subprocess.Popen(
            _command(output, extra, **command), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env=_env(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                     KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                     KERAS_DISTRIBUTION_PROCESS_ID=str(rank),
                     KERAS_ATTN_HEARTBEAT_TIMEOUT=HEARTBEAT_SECONDS)))
        processes[-1].log = log
    return processes


def _finish(processes, timeout=TIMEOUT):
    """Waits for every process; returns [(returncode, output)]; kills what
    is left either way."""
    try:
        for process in processes:
            process.wait(timeout=timeout)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    results = []
    for process in processes:
        process.log.seek(0)
        results.append((process.returncode, process.log.read()))
        process.log.close()
    return results


def _weights(path):
    import zipfile

    import h5py

    with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as stream:
        with h5py.File(stream, "r") as weights:
            found = []
            weights.visititems(lambda name, item: found.append(
                (name, np.asarray(item))) if isinstance(item, h5py.Dataset) else None)
    return dict(found)


def _single(tmp_path):
    """The reference run: one process, one device, the same global batch
    (started, output in a file beside; `_finish` waits for it)."""
    log = open(tmp_path / "single.txt", "w+")
    process = subprocess.Popen(_command(tmp_path / "single"), cwd=tmp_path, env=_env(),
                               stdout=log, stderr=subprocess.STDOUT)
    process.log = log
    return process


def _check_the_survivor_and_its_checkpoint(tmp_path, run, code, log):
    """Process 0 of the job whose process 1 was killed stopped on its own,
    naming what happened, and kept only complete checkpoints, which one
    process reads. Returns the kept checkpoint's manifest path and time."""
    assert code != 0, log[-3000:]
    assert "Process 0 of 2: a collective of this job failed" in log, log[-3000:]
    assert "Task 1 heartbeat timeout" in log, log[-3000:]  # JAX names the lost one
    assert not os.path.exists(run / "model.keras")
    assert not glob.glob(str(run / "**" / "*.tmp"), recursive=True)
    from keras_attn.training.checkpoints import CheckpointManager

    kept = CheckpointManager(str(run / "checkpoints")).latest()
    assert kept.manifest["step_in_epoch"] < 6
    kept_path = run / "checkpoints" / (kept.name + ".json")
    kept_time = os.stat(kept_path).st_mtime_ns
    # The checkpoint of two processes holds whole arrays: one process reads it.
    evaluated = subprocess.run(
        [sys.executable, "-m", "keras_attn.cli", "evaluate", str(run), "--json"], cwd=tmp_path,
        env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    source = json.loads(evaluated.stdout.strip().splitlines()[-1])["source"]
    assert source == f"checkpoint at step {kept.step} (the run has not finished)"
    return kept_path, kept_time


def test_two_processes_write_one_run_survive_a_lost_worker_and_resume(tmp_path):
    # Two processes; process 1 is killed once process 0 wrote a checkpoint
    # (mid-epoch: 2 of 6 steps). Process 0 must stop on its own, naming what
    # happened, and keep only complete checkpoints.
    run, other = tmp_path / "run", tmp_path / "other"
    processes = _start(tmp_path, [run, other])
    try:
        deadline = time.time() + TIMEOUT
        while not glob.glob(str(run / "checkpoints" / "ckpt-*.json")):
            assert time.time() < deadline and processes[0].poll() is None, "no checkpoint"
            time.sleep(0.5)
        processes[1].send_signal(signal.SIGKILL)
        # The reference run (its own directory, a job of one process) trains
        # while process 0 waits out the heartbeat timeout, idle.
        single = _single(tmp_path)
    finally:
        (code, log), _ = _finish(processes)
    try:
        kept_path, kept_time = _check_the_survivor_and_its_checkpoint(tmp_path, run, code, log)
    except BaseException:
        single.kill()
        raise
    finally:
        [(single_code, single_log)] = _finish([single])
    assert single_code == 0, single_log[-3000:]

    # A copy of the run resumes on ONE process (another process count: the
    # checkpoint holds whole arrays and the data position is global), while
    # the same two commands again resume the run itself: process 0 resumes
    # from its checkpoint and sends it to process 1, whose own directory
    # holds nothing.
    alone = tmp_path / "resumed_alone"
    shutil.copytree(run, alone)
    log_alone = open(tmp_path / "alone.txt", "w+")
    resumed_alone = subprocess.Popen(_command(alone), cwd=tmp_path, env=_env(),
                                     stdout=log_alone, stderr=subprocess.STDOUT)
    resumed_alone.log = log_alone
    try:
        (code0, log0), (code1, log1) = _finish(_start(tmp_path, [run, other]))
    finally:
        [(code_alone, log_alone)] = _finish([resumed_alone])
    assert code0 == 0, log0[-3000:]
    assert code1 == 0, log1[-3000:]
    assert code_alone == 0, log_alone[-3000:]
    # Resumed, not started again: the checkpoint it resumed from is still the
    # one the killed run wrote (a fresh start rewrites it; 3 are kept).
    assert os.stat(kept_path).st_mtime_ns == kept_time
    assert os.stat(alone / "checkpoints" / kept_path.name).st_mtime_ns == kept_time
    assert "process 1 of 2: trained vit_tiny_digits; process 0 writes the run" in log1
    assert not os.path.exists(other)  # process 1 wrote nothing
    for name in ("model.keras", "results.json", "recipe.json", "learning_curves.png"):
        assert os.path.exists(run / name), name
    assert json.loads((run / "results.json").read_text())["steps"] == 6
    # The final weights are those of one process with the same global batch
    # (the same examples per step; float sums taken in another order).
    expected = _weights(tmp_path / "single" / "model.keras")
    for resumed in (run, alone):
        found = _weights(resumed / "model.keras")
        assert sorted(found) == sorted(expected)
        # (measured: at most 2.3e-7 apart)
        for name in expected:
            np.testing.assert_allclose(found[name], expected[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{resumed.name}: {name}")
    assert json.loads((alone / "results.json").read_text())["steps"] == 6


def test_a_worker_started_with_another_seed_is_refused_by_name(tmp_path):
    # One shared output: process 0 holds its lock, process 1 neither takes
    # nor trips on it (else one of them would report the lock instead).
    results = _finish(_start(tmp_path, [tmp_path / "run"] * 2,
                             extras=((), ("training.seed=1",))))
    for code, log in results:
        assert code != 0, log[-3000:]
        assert ("The processes of this job were started with another seed: process 1 "
                "differs from process 0") in log, log[-3000:]
    assert not glob.glob(str(tmp_path / "run" / "checkpoints" / "*"))


# Item 7 for the other families: what a global batch split over processes
# could change is each family's own. BERT's masked-LM loss and the
# Transformer's loss are means over a count that varies per example (the
# masked tokens, the real target tokens), the Conformer normalises with
# BatchNorm over the batch and scores with CTC: over two JAX processes each
# is computed on the global batch (one jax.Array across the processes), so
# the weights must be those of one process. BERT's batches (32) and the
# Transformer's (16) divide by 2; the Conformer's third step is a length
# bucket's batch of 3 utterances, filled up to 4 with its first again
# (`even_batches`), a filler that must count for nothing: an utterance of
# no frames (in no BatchNorm statistics) with an empty transcript and
# weight 0 (`Task.weightless_rows`). Fed as a plain row it counted twice:
# measured, weights up to 1.3e-4 apart (a convolution's bias; 1.5e-4 for a
# BatchNorm moving mean), against the 1e-6 compared.
FAMILIES = {"bert_tiny_pydoc": 3, "transformer_numbers": 3, "conformer_tiny_digits": 3}
# Adam with epsilon 1 and a large rate: a step moves each weight by about
# rate x gradient. With the recipes' epsilon (1e-6 to 1e-9) a weight whose
# gradient is zero in exact arithmetic (the key projection's bias: softmax
# over the keys ignores a shift they all share; the bias of the depthwise
# convolution that BatchNorm follows) moves by +-rate on float rounding
# alone, in both runs differently; here it stays put, and a gradient 1% off
# still shows (measured on the Conformer with a duplicated row: 3e-4 to
# 8e-4 apart against the 1e-6 compared).
STEP_SIZE = {"bert_tiny_pydoc": ["training.optimizer.learning_rate=0.05"],
             "transformer_numbers": ["training.schedule.warmup_steps=1"],  # rate 0.1
             "conformer_tiny_digits": ["training.optimizer.learning_rate=0.05"]}


def _family_sets(recipe):
    from _tiny import tiny_overrides

    return tiny_overrides(recipe, run=False) + STEP_SIZE[recipe] + [
        "training.optimizer.epsilon=1", "training.epochs=1",
        f"training.steps_per_epoch={FAMILIES[recipe]}", "training.checkpoint_every=2",
        "training.jit_compile=true"]


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    """The one-process references of FAMILIES, trained in ONE process (one
    interpreter start instead of three) by `runs.train`, what `keras-attn
    train` calls, with the same recipe, overrides and `distribute=True` (one
    device: it trains alone); started at once, waited for by the first test
    that reads it."""
    directory = tmp_path_factory.mktemp("one_process")
    script = "\n".join([
        "import json, sys",
        "from keras_attn.zoo import runs",
        "for recipe, output, sets in json.loads(sys.argv[1]):",
        "    runs.train(recipe, sets, output=output, distribute=True, export=False,"
        " verbose=0)",
    ])
    plan = [[name, str(directory / name), _family_sets(name)] for name in FAMILIES]
    log = open(directory / "log.txt", "w+")
    process = subprocess.Popen([sys.executable, "-c", script, json.dumps(plan)], cwd=directory,
                               env=_env(), stdout=log, stderr=subprocess.STDOUT)
    process.log = log
    finished = []

    def wait():
        if not finished:
            finished.extend(_finish([process]))
        [(code, text)] = finished
        assert code == 0, text[-3000:]
        return directory

    try:
        yield wait
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("recipe", FAMILIES)
def test_two_processes_train_each_family_to_the_weights_of_one(tmp_path, recipe,
                                                                one_process_runs):
    run, other = tmp_path / "run", tmp_path / "other"
    (code0, log0), (code1, log1) = _finish(
        _start(tmp_path, [run, other], recipe=recipe, sets=_family_sets(recipe)))
    assert code0 == 0, log0[-3000:]
    assert code1 == 0, log1[-3000:]
    assert f"process 1 of 2: trained {recipe}; process 0 writes the run" in log1
    assert not os.path.exists(other)  # process 1 wrote nothing
    assert json.loads((run / "results.json").read_text())["steps"] == FAMILIES[recipe]
    expected = _weights(one_process_runs() / recipe / "model.keras")
    found = _weights(run / "model.keras")
    assert sorted(found) == sorted(expected)
    for name in expected:
        # The optimizer's moments hold the gradients' sums over every frame
        # or token, summed in another order (measured: 1.7e-6 on one element
        # of the Conformer's first convolution's first moment, value -0.0117).
        atol = 1e-5 if name.startswith("optimizer/") else 1e-6
        np.testing.assert_allclose(found[name], expected[name], rtol=1e-5, atol=atol,
                                   err_msg=f"{recipe}: {name}")
