import re

import pytest

from _example import run_example

pytestmark = pytest.mark.backend_independent


@pytest.mark.slow
def test_translate_smoke():
    # run_example also checks that the bucketed batches have a known count
    # (Keras does not warn that the input "ran out of data" after the first
    # epoch) and that fit is not given shuffle=True with a dataset.
    result = run_example("translate.py", "--smoke")
    for name in ("greedy", "beam"):
        match = re.search(rf"{name} BLEU: ([0-9.]+)  exact match: ([0-9.]+)", result.stdout)
        assert match, result.stdout[-3000:]
        assert 0.0 <= float(match.group(1)) <= 100.0 and 0.0 <= float(match.group(2)) <= 1.0
    assert "examples (english -> greedy | beam | reference)" in result.stdout
