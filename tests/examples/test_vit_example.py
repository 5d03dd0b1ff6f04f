import re

import pytest

from _example import run_example

pytestmark = pytest.mark.backend_independent


@pytest.mark.slow
def test_vit_classify_smoke(tmp_path):
    result = run_example("vit_classify.py", "--smoke", "--output", tmp_path)
    match = re.search(r"test accuracy: ([0-9.]+)", result.stdout)
    assert match, result.stdout[-3000:]
    assert 0.0 <= float(match.group(1)) <= 1.0
    with open(tmp_path / "rollout.png", "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
