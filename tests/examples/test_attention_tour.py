import pytest

from _example import run_example

pytestmark = pytest.mark.backend_independent


@pytest.mark.slow
def test_attention_tour_smoke(tmp_path):
    result = run_example("attention_tour.py", "--smoke", "--output", tmp_path)
    assert "reversal accuracy on the sentence" in result.stdout
    for name in ("positional_encoding.png", "attention_block_0.png", "attention_block_1.png"):
        with open(tmp_path / name, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
