import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_conformer_asr_smoke(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path))  # the speech cache goes to a fresh place
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "conformer_asr.py"), "--smoke",
         "--export", str(tmp_path / "saved")],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"greedy: WER [0-9.]+", result.stdout), result.stdout[-2000:]
    assert (tmp_path / "saved" / "saved_model.pb").exists()
    assert any(name.startswith("spoken_digits") for name in os.listdir(tmp_path / ".cache" / "keras_attn"))
