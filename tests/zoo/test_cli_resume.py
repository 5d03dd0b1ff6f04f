"""`keras-attn train` killed mid-epoch and started again with the same
command ends where an uninterrupted run ends (issue 7, "Nothing lost")."""

import glob
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from _tiny import ROOT
from _tiny import TINY
from keras_attn.models import vit  # noqa: F401  (registers ViT for load_model)

pytestmark = [pytest.mark.tf_only, pytest.mark.large]

# Dropout stays on (the recipe's 0.1); 2 epochs x 10 steps, a checkpoint
# every 4 steps (4 and 8 inside the first epoch, so the resumed run crosses an
# epoch end: the second epoch's order and augmentation are made again); no
# XLA so that the first steps come quickly.
STEPS_PER_EPOCH = 10
SETTINGS = TINY["vit_tiny_digits"] + [
    "training.epochs=2", f"training.steps_per_epoch={STEPS_PER_EPOCH}",
    "training.checkpoint_every=4", "training.jit_compile=false", "training.batch_size=16",
]


def _command(run):
    # --no-export: the weights are compared; the SavedModel is tested by
    # test_cli.py's end-to-end runs.
    sets = [item for value in SETTINGS for item in ("--set", value)]
    return [sys.executable, "-m", "keras_attn.cli", "train", "vit_tiny_digits",
            "--output", str(run), "--verbose", "2", "--no-export", *sets]


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def _weights(run):
    model = keras.saving.load_model(os.path.join(run, "model.keras"), compile=False)
    return [keras.ops.convert_to_numpy(v) for v in model.weights]


def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    done = subprocess.run(_command(reference), env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    process = subprocess.Popen(_command(killed), env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    mid_epoch = None
    while time.time() < deadline and process.poll() is None:
        # A finished checkpoint has its manifest; steps 4, 8, 12, 16 fall
        # inside an epoch (10 and 20 are epoch ends).
        steps = [int(os.path.basename(p)[5:13])
                 for p in glob.glob(str(killed / "checkpoints" / "ckpt-*.json"))]
        mid_epoch = next((s for s in steps if s % STEPS_PER_EPOCH), None)
        if mid_epoch is not None:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait(timeout=60)
    assert mid_epoch is not None and process.returncode == -signal.SIGKILL, (
        "the run ended before it could be killed"
    )
    assert not (killed / "model.keras").exists()

    again = subprocess.run(_command(killed), env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from ckpt-" in again.stdout + again.stderr
    for a, b in zip(_weights(reference), _weights(killed), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_distributed_run_checkpoints_and_resumes_on_tensorflow(tmp_path):
    """`--distribute` on two logical CPUs (MirroredStrategy): checkpoints
    read the replicated and sync-on-read (metric) variables, and a run cut
    back to a mid-epoch checkpoint resumes from it."""
    run = tmp_path / "run"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_two_cpu_cli.py")
    sets = [item for value in TINY["vit_tiny_digits"] + [
        "training.epochs=2", "training.steps_per_epoch=5", "training.checkpoint_every=3",
        "training.jit_compile=false",
    ] for item in ("--set", value)]
    # --no-export: what is tested is the checkpoints (the SavedModel of a
    # distributed run: test_cli.py's data-parallel JAX run).
    command = [sys.executable, script, "train", "vit_tiny_digits", "--output", str(run),
               "--verbose", "2", "--distribute", "--no-export", *sets]
    first = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 replicas" in first.stdout
    # Cut the run back to its oldest checkpoint (mid-epoch 2) and go on.
    manifests = sorted(glob.glob(str(run / "checkpoints" / "ckpt-*.json")))
    assert len(manifests) > 1
    for manifest in manifests[1:]:
        os.remove(manifest)
        os.remove(manifest[:-len(".json")] + ".npz")
    os.remove(run / "results.json")
    os.remove(run / "model.keras")
    second = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resuming from {os.path.basename(manifests[0])[:-5]}.npz" in second.stdout
    assert (run / "model.keras").exists() and (run / "results.json").exists()
