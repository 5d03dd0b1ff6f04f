import os
import re

import pytest

from _example import run_example

pytestmark = pytest.mark.backend_independent


@pytest.mark.slow
def test_conformer_asr_smoke(tmp_path):
    # HOME: the speech cache goes to a fresh place.
    result = run_example("conformer_asr.py", "--smoke", "--export", tmp_path / "saved",
                         HOME=str(tmp_path))
    assert re.search(r"greedy: WER [0-9.]+", result.stdout), result.stdout[-2000:]
    assert (tmp_path / "saved" / "saved_model.pb").exists()
    assert any(name.startswith("spoken_digits") for name in os.listdir(tmp_path / ".cache" / "keras_attn"))
