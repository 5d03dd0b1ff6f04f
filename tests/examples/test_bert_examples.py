import math
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(name, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), "--smoke", *args],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_pretrain_then_finetune_smoke(tmp_path):
    checkpoint = tmp_path / "pretrain"
    out = run_example("bert_pretrain.py", "--output", str(checkpoint))
    match = re.search(r"mlm loss before ([0-9.]+) after ([0-9.]+)", out)
    assert match, out[-3000:]
    before, after = float(match.group(1)), float(match.group(2))
    assert math.isfinite(before) and math.isfinite(after)
    assert sorted(os.listdir(checkpoint)) == ["backbone.keras", "vocab.txt"]

    out = run_example("bert_finetune.py", "--checkpoint", str(checkpoint),
                      "--output", str(tmp_path / "finetune"))
    match = re.search(r"test accuracy: ([0-9.]+)", out)
    assert match, out[-3000:]
    assert 0.0 <= float(match.group(1)) <= 1.0
    assert re.search(r"served: .* -> (specialnames|compound|debugger|string-methods)", out)
    assert os.path.exists(tmp_path / "finetune" / "saved_model" / "saved_model.pb")
