import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_attention_tour_smoke(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "attention_tour.py"), "--smoke", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reversal accuracy on the sentence" in result.stdout
    for name in ("positional_encoding.png", "attention_block_0.png", "attention_block_1.png"):
        with open(tmp_path / name, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
