"""Tests run two at a time (pytest-xdist), except a module marked ``alone``: nothing beside it.

The multi-host test's jobs and a job of a test beside them both hung once (CI run of
022a9c3), so such a module holds a lock that every other test shares, and takes it whole.
A test that waits for the lock waits in its setup, which the tests' timeout leaves out
(``timeout_func_only``): the multi-host module alone takes about as long as that timeout.
The wait has a bound of its own, ``ALONE_WAIT_S``.
"""

import contextlib
import fcntl
import time

import pytest

_LOCK = "/tmp/ringtrain-tests.lock"
ALONE_WAIT_S = 1200  # the longest a test waits for a module marked alone to end


@contextlib.contextmanager
def _locked(how):
    with open(_LOCK, "a") as file:
        deadline = time.monotonic() + ALONE_WAIT_S
        while True:
            try:
                fcntl.flock(file, how | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"waited {ALONE_WAIT_S} s for the test lock {_LOCK}")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _alone(node):
    return node.get_closest_marker("alone") is not None


@pytest.fixture(scope="module", autouse=True)
def _module_alone(request):
    """Hold every other test off while a module marked ``alone`` runs, once they have ended."""
    if not _alone(request.node):
        yield
        return
    with _locked(fcntl.LOCK_EX):
        yield


@pytest.fixture(autouse=True)
def _test_beside_others(request):
    """Run any other test beside others, but never beside a module marked ``alone``."""
    if _alone(request.node):
        yield
        return
    with _locked(fcntl.LOCK_SH):
        yield
