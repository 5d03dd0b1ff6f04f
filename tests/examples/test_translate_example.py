import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_translate_smoke():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "translate.py"), "--smoke"],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("greedy", "beam"):
        match = re.search(rf"{name} BLEU: ([0-9.]+)  exact match: ([0-9.]+)", result.stdout)
        assert match, result.stdout[-3000:]
        assert 0.0 <= float(match.group(1)) <= 100.0 and 0.0 <= float(match.group(2)) <= 1.0
    assert "examples (english -> greedy | beam | reference)" in result.stdout
    # The bucketed batches have a known count: Keras does not warn at the
    # end of the first epoch, and fit's log shows the total.
    assert "ran out of data" not in result.stderr + result.stdout
    assert "shuffle=True" not in result.stderr + result.stdout
