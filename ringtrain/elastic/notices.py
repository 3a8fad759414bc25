"""A rank's count of the launcher's notices that an elastic job's hosts have changed.

``ringtrain-run`` sends mpirun ``contract.NOTICE_SIGNAL``, which Open MPI passes on to every
rank of the job. A rank counts the signals it gets; ``State.check_host_updates`` compares
the ranks' counts at each commit, and where one has a notice the others have not seen yet,
they all stop there and exit with ``contract.RESTART_STATUS`` so that the launcher
relaunches them on the new hosts.
"""

import signal

from ringtrain import contract


class Notices:
    """The notices that this process has received since ``install()``.

    A signal handler belongs to the whole process, so the process has one counter, which
    ``counter()`` returns: the guard installs it, and the states read it.
    """

    def __init__(self):
        self._received = 0

    def install(self) -> None:
        """Count the notice signal from now on instead of dying of it (from the main thread)."""
        signal.signal(contract.NOTICE_SIGNAL, self._count)

    @property
    def received(self) -> int:
        """How many notices this process has received."""
        return self._received

    def _count(self, signum, frame):
        self._received += 1


_COUNTER = Notices()


def counter() -> Notices:
    """Return this process's one notice counter."""
    return _COUNTER
