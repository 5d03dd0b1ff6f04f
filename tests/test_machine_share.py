"""The suite's own plugin (_machine_share.py): under pytest-xdist, a test
marked `exclusive` runs with no other test beside it, and the others still
run side by side."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent
HERE = os.path.dirname(os.path.abspath(__file__))

CONFTEST = """
from _machine_share import pytest_runtest_protocol  # noqa: F401

def pytest_configure(config):
    config.addinivalue_line("markers", "exclusive: runs alone")
"""

# Every test writes when it starts and ends, in one file, appended under a
# lock; the exclusive one in the middle of the others.
TESTS = """
import fcntl, os, time
import pytest

def _log(event):
    with open(os.environ["EVENTS"], "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(event + "\\n")

def _run(name, seconds):
    _log(f"start {name}")
    time.sleep(seconds)
    _log(f"end {name}")

@pytest.mark.parametrize("i", range(6))
def test_before(i):
    _run(f"before{i}", 0.2)

@pytest.mark.exclusive
def test_alone():
    _run("alone", 1.0)

@pytest.mark.parametrize("i", range(6))
def test_after(i):
    _run(f"after{i}", 0.2)
"""


def test_an_exclusive_test_runs_with_no_other_test_beside_it(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_share.py").write_text(TESTS)
    events = tmp_path / "events.txt"
    env = dict(os.environ, EVENTS=str(events),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "13 passed" in result.stdout, result.stdout[-3000:]
    lines = events.read_text().split()
    log = [" ".join(pair) for pair in zip(lines[::2], lines[1::2])]
    start, end = log.index("start alone"), log.index("end alone")
    assert end == start + 1, log  # nothing started or ended while it ran
    assert len(log) == 26, log
