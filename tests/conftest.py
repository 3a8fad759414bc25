"""Tests run two at a time (pytest-xdist), except a module marked ``alone``: nothing beside it.

The multi-host test's jobs and a job of a test beside them both hung once (CI run of
022a9c3), so such a module holds a lock that every other test shares, and takes it whole.
"""

import contextlib
import fcntl

import pytest

_LOCK = "/tmp/ringtrain-tests.lock"


@contextlib.contextmanager
def _locked(how):
    with open(_LOCK, "a") as file:
        fcntl.flock(file, how)
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
