"""A pytest plugin (tests/conftest.py imports its hook): the pytest-xdist
workers of one pass share the machine fairly.

A test marked `exclusive` starts several busy processes that work in
lockstep (JAX processes over gloo, TensorFlow workers over gRPC: every step
ends in a collective that waits for the slowest process). On a 2-core
machine, a test of the other xdist worker beside them leaves one of them
without a core at every step, and the whole job waits for it. So an
`exclusive` test runs with no other test beside it: every test holds a
shared lock on a file of this pass while it runs (setup, call and teardown,
so module fixtures that train count too), an `exclusive` one the lock
alone. A second file is the turnstile: a worker waiting for the lock alone
holds it, so the other worker's next test queues behind it instead of
taking the shared lock again before the waiting worker is woken.

Without xdist (one process) nothing runs beside a test: no lock is taken.
"""

import fcntl
import getpass
import os
import tempfile

import pytest


def _pass_locks(config):
    """(turnstile, lock): files this pass's xdist workers share; None in a
    run without xdist workers."""
    if not hasattr(config, "workerinput"):
        return None
    locks = getattr(config, "_keras_attn_locks", None)
    if locks is None:
        stem = os.path.join(tempfile.gettempdir(), "keras_attn_tests_"
                            f"{getpass.getuser()}_{config.workerinput['testrunuid']}")
        locks = config._keras_attn_locks = (open(stem + ".turnstile", "a+"),
                                            open(stem + ".lock", "a+"))
    return locks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    locks = _pass_locks(item.config)
    if locks is None:
        yield
        return
    turnstile, lock = locks
    mode = fcntl.LOCK_EX if item.get_closest_marker("exclusive") else fcntl.LOCK_SH
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, mode)
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
