"""Child processes that a benchmark starts: each in its own session, ended on every exit path."""

import contextlib
import os
import signal
import subprocess

_ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_GRACE = 5  # seconds a launch has to end after SIGTERM before it is killed


class EndedBySignalError(Exception):
    """A signal ended the run; cleanup runs as the stack unwinds."""

    def __init__(self, signum: int):
        super().__init__(f"ended by {signal.Signals(signum).name}")
        self.signum = signum


def end_group(child):
    """End ``child``'s session: SIGTERM, then SIGKILL after a grace period."""
    if child.poll() is not None:
        return
    for how in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, how)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(_GRACE)
            return


@contextlib.contextmanager
def signals_raise():
    """Turn SIGINT, SIGTERM and SIGHUP into ``EndedBySignalError``: cleanup runs as it unwinds."""

    def end(signum, frame):
        for each in _ENDING:  # a second signal must not cut the cleanup short
            signal.signal(each, signal.SIG_IGN)
        raise EndedBySignalError(signum)

    before = {each: signal.signal(each, end) for each in _ENDING}
    try:
        yield
    finally:
        for each, handler in before.items():
            signal.signal(each, handler)
