import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_vit_classify_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "vit_classify.py"), "--smoke", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    match = re.search(r"test accuracy: ([0-9.]+)", result.stdout)
    assert match, result.stdout[-3000:]
    assert 0.0 <= float(match.group(1)) <= 1.0
    with open(tmp_path / "rollout.png", "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
