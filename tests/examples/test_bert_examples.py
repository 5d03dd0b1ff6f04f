import json
import math
import os
import re
import subprocess
import sys

import pytest

from _example import ROOT
from _example import run_example

pytestmark = pytest.mark.backend_independent

# Rows of 32 in batches of 64 (the examples' defaults: 64 and 32): the smoke
# runs take half the steps, each on shorter rows; every stage still runs.
SMALL = ("--sequence-length", 32, "--batch-size", 64)


@pytest.mark.slow
def test_pretrain_then_finetune_smoke(tmp_path):
    checkpoint = tmp_path / "pretrain"
    out = run_example("bert_pretrain.py", "--smoke", *SMALL, "--output", checkpoint).stdout
    match = re.search(r"mlm loss before ([0-9.]+) after ([0-9.]+)", out)
    assert match, out[-3000:]
    before, after = float(match.group(1)), float(match.group(2))
    assert math.isfinite(before) and math.isfinite(after)
    assert sorted(os.listdir(checkpoint)) == ["backbone.keras", "vocab.txt"]

    out = run_example("bert_finetune.py", "--smoke", *SMALL, "--checkpoint", checkpoint,
                      "--output", tmp_path / "finetune",
                      "--formats", "saved_model_float32,onnx_float32").stdout
    match = re.search(r"test accuracy: ([0-9.]+)", out)
    assert match, out[-3000:]
    assert 0.0 <= float(match.group(1)) <= 1.0
    assert re.search(r"served: .* -> (specialnames|compound|debugger|string-methods)", out)
    assert os.path.exists(tmp_path / "finetune" / "saved_model" / "saved_model.pb")
    # The SavedModel on raw strings and ONNX Runtime on token ids score the
    # test set as the Keras model does.
    with open(tmp_path / "finetune" / "served.json") as stream:
        served = json.load(stream)
    assert sorted(served["exports"]) == ["onnx_float32", "saved_model_float32"]
    for entry in served["exports"].values():
        assert entry["value"] == pytest.approx(served["keras"], abs=1e-6)
        assert entry["megabytes"] > 0
    assert os.path.exists(tmp_path / "finetune" / "onnx_float32" / "model.onnx")


@pytest.mark.slow
def test_finetune_with_lora_trains_the_adapters_and_head_and_exports_merged(tmp_path):
    out = run_example("bert_finetune.py", "--smoke", *SMALL, "--from-scratch", "--lora-rank", "2",
                      "--output", tmp_path,
                      "--formats", "saved_model_float32,litert_float32").stdout
    match = re.search(r"trainable parameters: ([0-9,]+) of ([0-9,]+) \(LoRA rank 2", out)
    assert match, out[-3000:]
    trainable, total = (int(group.replace(",", "")) for group in match.groups())
    assert 0 < trainable < total / 20
    assert re.search(r"test accuracy: [0-9.]+ .* ms a step after the first epoch; peak memory", out)
    # The merged model is what is exported and served.
    assert re.search(r"served: .* -> (specialnames|compound|debugger|string-methods)", out)
    assert os.path.exists(tmp_path / "saved_model" / "saved_model.pb")
    served = json.loads((tmp_path / "served.json").read_text())["exports"]
    assert served["litert_float32"]["value"] == served["saved_model_float32"]["value"]


@pytest.mark.parametrize("formats, named", [("bogus", "'bogus'"),
                                            ("onnx_float32", "'onnx_float32'")])
def test_finetune_refuses_bad_formats_before_training(tmp_path, formats, named):
    """An unknown format, or a list without the SavedModel the others are
    checked against: exit 2 naming the value, before any data or training."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "bert_finetune.py"), "--smoke",
         "--from-scratch", "--output", str(tmp_path / "out"), "--formats", formats],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"--formats={named}" in result.stderr and "saved_model_float32" in result.stderr
    assert not (tmp_path / "out").exists()
