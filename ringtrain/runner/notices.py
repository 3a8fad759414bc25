"""The notice that an elastic job's hosts have changed, from ``ringtrain-run`` to every rank.

The launcher sends mpirun ``SIGNAL``, which Open MPI passes on to every rank of the job.
A rank counts the signals it gets; ``ringtrain.elastic`` compares the ranks' counts at each
commit, and where one has a notice the others have not seen yet, they all stop there and
exit with ``RESTART_STATUS`` so that the launcher relaunches them on the new hosts.
"""

import signal

SIGNAL = signal.SIGUSR2
RESTART_STATUS = 75  # EX_TEMPFAIL: the ranks stopped at a commit, to be relaunched

_received = 0


def install() -> None:
    """Count ``SIGNAL`` from now on instead of dying of it (call from the main thread)."""
    signal.signal(SIGNAL, _count)


def received() -> int:
    """Return how many notices this process has received."""
    return _received


def _count(signum, frame):
    global _received
    _received += 1
