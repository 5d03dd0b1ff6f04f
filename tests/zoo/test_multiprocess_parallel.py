"""`keras-attn train --distribute model_parallel:1x2` as two JAX processes of
one CPU device each (every weight split over the processes, JAX's CPU
collectives over gloo): one run in one shared directory, sharded checkpoints
written by both through orbax-checkpoint, one model.keras that loads on one
process, a job killed (SIGKILL) and resumed exactly by the same commands, a
resume on one process, a directory per host refused by name.

Every process is started and ended here (killed in a `finally`); the
timeouts are generous (a loaded 2-core machine) and no duration is asserted.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import orbax.checkpoint  # noqa: F401  (the dev extra: missing, this fails, never skips)
from test_multiprocess import RECIPE
from test_multiprocess import SETS  # compiled steps, checkpoints every 2 of 6 (3 kept)
from test_multiprocess import TIMEOUT
from test_multiprocess import _env
from test_multiprocess import _finish
from test_multiprocess import _free_port
from test_multiprocess import _weights

# The tiny ViT's 2 heads and inner width 32 split over the 2 processes.
pytestmark = [pytest.mark.backend_independent, pytest.mark.slow,
              pytest.mark.xdist_group("distribute"), pytest.mark.exclusive]


def _start(tmp_path, outputs, tag):
    """The two processes of one job, process k training into `outputs[k]`."""
    port = _free_port()
    sets = [item for value in SETS for item in ("--set", value)]
    processes = []
    for rank, output in enumerate(outputs):
        log = open(tmp_path / f"{tag}{rank}.txt", "w+")
        command = [sys.executable, "-m", "keras_attn.cli", "train", RECIPE, "--output",
                   str(output), "--verbose", "0", "--distribute", "model_parallel:1x2",
                   "--no-export", *sets]
        processes.append(subprocess.Popen(
            command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env=_env(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                     KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                     KERAS_DISTRIBUTION_PROCESS_ID=str(rank),
                     KERAS_ATTN_HEARTBEAT_TIMEOUT="60")))
        processes[-1].log = log
    return processes


def _run_jobs(*jobs):
    """Waits for every process of `jobs` (started together); returns each
    job's [(returncode, output)]; every process ended either way."""
    flat = [process for job in jobs for process in job]
    results = _finish(flat)
    found, start = [], 0
    for job in jobs:
        found.append(results[start:start + len(job)])
        start += len(job)
    return found


def _one_process_outputs(run):
    """On this one process: model.keras, and a fresh model given the run's
    newest (sharded) checkpoint; both models' outputs on test images, and
    the checkpoint's step."""
    from keras_attn.training.resumable import restore_latest
    from keras_attn.zoo.runs import load_run

    _, task, saved, source = load_run(str(run))
    assert source == str(run / "model.keras")
    restored = task.compile(task.build_model())
    step = restore_latest(restored, str(run / "checkpoints"))
    shape = (4,) + tuple(saved.inputs[0].shape[1:])
    images = np.random.default_rng(0).uniform(0, 16, shape).astype("float32")
    return saved, restored, step, images


def _newest_manifest(directory):
    """(name, mtime) of the newest intact checkpoint of `directory`."""
    from keras_attn.training.checkpoints import CheckpointManager

    newest = CheckpointManager(str(directory)).latest()
    path = directory / (newest.name + ".json")
    return newest.name, os.stat(path).st_mtime_ns


def test_model_parallel_across_two_processes_one_run_reloads_resumes_refuses_per_host(
        tmp_path):
    run, killed = tmp_path / "run", tmp_path / "killed"
    # Three jobs of two processes at once: one sharing `run` (the
    # uninterrupted run), one sharing `killed` whose two processes are
    # killed (SIGKILL) once a checkpoint is written, one given a directory
    # per host, refused before any step.
    jobs = [_start(tmp_path, [run, run], "run"),
            _start(tmp_path, [tmp_path / "host0", tmp_path / "host1"], "hosts"),
            _start(tmp_path, [killed, killed], "killed")]
    try:
        deadline = time.time() + TIMEOUT
        while not glob.glob(str(killed / "checkpoints" / "ckpt-*.json")):
            assert time.time() < deadline and jobs[2][0].poll() is None, "no checkpoint"
            time.sleep(0.2)
        for process in jobs[2]:
            process.send_signal(signal.SIGKILL)
    finally:
        [(code0, log0), (code1, log1)], refused, _ = _run_jobs(*jobs)
    assert code0 == 0, log0[-3000:]
    assert code1 == 0, log1[-3000:]
    assert "process 1 of 2: trained vit_tiny_digits; process 0 writes the run" in log1
    assert "(this process wrote its shards of every checkpoint there)" in log1
    for rank, (code, log) in enumerate(refused):
        assert code != 0, log[-3000:]
        assert "Model parallel across processes needs a directory that every process" \
            in log, log[-3000:]
        assert "Process 1 cannot read" in log, log[-3000:]
        assert str(tmp_path / f"host{rank}" / "checkpoints") in log, log[-3000:]
    assert not glob.glob(str(tmp_path / "host*" / "checkpoints" / "ckpt-*"))
    assert not os.path.exists(tmp_path / "host1")  # process 1 wrote nothing
    assert not os.path.exists(killed / "model.keras")
    killed_at = _newest_manifest(killed / "checkpoints")

    # One run: one set of checkpoints (each an orbax directory both processes
    # wrote, committed, and process 0's manifest), one model.keras.
    checkpoints = run / "checkpoints"
    names = sorted(os.listdir(checkpoints))
    assert names == ["ckpt-00000002.json", "ckpt-00000002.orbax", "ckpt-00000004.json",
                     "ckpt-00000004.orbax", "ckpt-00000006.json", "ckpt-00000006.orbax",
                     "history.json"], names
    manifest = json.loads((checkpoints / "ckpt-00000006.json").read_text())
    assert manifest["format"] == "keras_attn.checkpoint.orbax/1"
    assert manifest["processes"] == 2
    assert sorted(glob.glob(str(run / "**" / "model.keras"), recursive=True)) == [
        str(run / "model.keras")]
    assert json.loads((run / "results.json").read_text())["steps"] == 6

    # model.keras loads on ONE process (this one, TensorFlow) and holds the
    # trained weights: those of the final checkpoint, written sharded by two
    # processes and read here by one (orbax reads each array whole).
    saved, restored, step, images = _one_process_outputs(run)
    assert step == 6
    weights = [(a.path, np.asarray(a)) for a in saved.weights if "seed_generator" not in a.path]
    expected = [np.asarray(b) for b in restored.weights if "seed_generator" not in b.path]
    assert len(weights) == len(expected) > 20
    for (path, found), wanted in zip(weights, expected):
        np.testing.assert_array_equal(found, wanted, err_msg=path)
    np.testing.assert_allclose(np.asarray(saved(images)), np.asarray(restored(images)),
                               rtol=1e-5, atol=1e-5)

    # The same two commands resume the killed job from its newest complete
    # checkpoint. A copy of the finished run made to look killed while step
    # 6 was checkpointed (its arrays committed by orbax but no manifest, an
    # orbax temporary directory) resumes from step 4 on ONE process (another
    # process count: it reads the sharded arrays whole). Both end with the
    # uninterrupted run's weights.
    alone = tmp_path / "alone"
    shutil.copytree(run, alone)
    for name in ("model.keras", "results.json", "learning_curves.png",
                 "checkpoints/ckpt-00000006.json"):
        os.remove(alone / name)
    os.makedirs(alone / "checkpoints" / "ckpt-00000006.orbax.orbax-checkpoint-tmp-7")
    with pytest.warns(UserWarning, match="ckpt-00000006.orbax has no manifest"):
        alone_at = _newest_manifest(alone / "checkpoints")
    assert alone_at[0] == "ckpt-00000004"
    log = open(tmp_path / "alone.txt", "w+")
    one = subprocess.Popen(
        [sys.executable, "-m", "keras_attn.cli", "train", RECIPE, "--output", str(alone),
         "--verbose", "0", "--no-export",
         *[item for value in SETS for item in ("--set", value)]],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=_env())
    one.log = log
    [(code0, log0), (code1, log1)], [(code, log)] = _run_jobs(
        _start(tmp_path, [killed, killed], "resumed"), [one])
    assert code0 == 0, log0[-3000:]
    assert code1 == 0, log1[-3000:]
    assert code == 0, log[-3000:]
    expected = _weights(run / "model.keras")
    # Two processes sum as before: the same weights; one sums in another
    # order: float round-off.
    for resumed, at, tolerance in ((killed, killed_at, 0), (alone, alone_at, 1e-5)):
        checkpoints = resumed / "checkpoints"
        # Resumed from it, not started again (that would rewrite it).
        assert os.stat(checkpoints / (at[0] + ".json")).st_mtime_ns == at[1], resumed
        assert not glob.glob(str(checkpoints / "*tmp*")), resumed
        assert os.path.exists(checkpoints / "ckpt-00000006.json"), resumed
        found = _weights(resumed / "model.keras")
        assert sorted(found) == sorted(expected)
        for name in expected:
            np.testing.assert_allclose(found[name], expected[name], rtol=tolerance,
                                       atol=1e-6, err_msg=f"{resumed.name}: {name}")
    # The one process wrote an npz checkpoint after the sharded ones it resumed
    # from, and deleted the orbax arrays of step 6 that had no manifest.
    assert sorted(os.listdir(alone / "checkpoints")) == [
        "ckpt-00000002.json", "ckpt-00000002.orbax", "ckpt-00000004.json",
        "ckpt-00000004.orbax", "ckpt-00000006.json", "ckpt-00000006.npz", "history.json"]
