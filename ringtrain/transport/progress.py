"""Waiting on peers without burning a core, and failing when one stops making progress.

Each wait is for one message or one collective step, so the time it takes is the time since
the last progress with that peer, however long the whole transfer is: a slow but moving
1 GiB allreduce completes a chunk every few seconds even over a slow link, and never trips
the timeout. A wait first polls (yielding the CPU between polls) ``SPINS`` times, then
sleeps between polls, doubling the sleep up to ``LONGEST_SLEEP``: a stuck rank stops eating
its core within milliseconds, and ranks that outnumber the cores do not starve each other.
"""

import os
import time

from ringtrain.errors import CollectiveTimeoutError

# A wait first polls this many times, yielding the CPU between polls: about a millisecond
# (a sched_yield takes 0.3-1 us), counted rather than timed to keep a clock off each poll.
SPINS = 2000
_FIRST_SLEEP = 20e-6
# A sleep overshoots the message's arrival by this much at most: 3% of a 1 MiB chunk's time
# at 1 Gbit/s (8.4 ms), for under 1% of a core while a rank waits.
LONGEST_SLEEP = 250e-6
# A rank that waits only for ranks of its own host waits this much longer: those usually wait
# in turn for the host that stopped answering, and the rank that waits for that host itself
# should be the one to report it.
LOCAL_GRACE_SECONDS = 10.0


class Waiter:
    """Waits on MPI requests of one rank; fails after ``timeout`` seconds without progress.

    ``timeout`` 0 waits for ever (still sleeping between polls); a wait for ranks of this
    rank's own host only gets ``LOCAL_GRACE_SECONDS`` more. Ranks are those of the
    communicator whose ``topology`` it is; the error names them and their hosts.
    """

    def __init__(self, timeout: float, topology):
        self.timeout = timeout
        self._rank = topology.rank
        self._hosts = topology.host_names
        self._world = topology.world_ranks

    @property
    def size(self) -> int:
        """Return the number of ranks of the communicator."""
        return len(self._hosts)

    def wait(self, request, peers, what: str) -> None:
        """Return once MPI ``request`` completes; ``peers`` are the ranks it waits for.

        Raises ``CollectiveTimeoutError`` naming them, their hosts and ``what`` once
        ``timeout`` seconds pass without the request completing.
        """
        self.until(request.Test, peers, what)

    def until(self, ready, peers, what: str) -> None:
        """Return once ``ready()`` is true, polling it as ``wait`` polls a request."""
        for _ in range(SPINS):
            if ready():
                return
            os.sched_yield()
        self._sleep_until(ready, peers, what, time.perf_counter())

    def _sleep_until(self, ready, peers, what, began) -> None:
        """Poll ``ready()`` with growing sleeps between, until it is true or the wait times out.

        The timeout counts from ``began``; the spinning before it (about a millisecond) is
        not counted.
        """
        limit = self.timeout
        if limit and all(self._hosts[p] == self._hosts[self._rank] for p in peers):
            limit += LOCAL_GRACE_SECONDS
        pause = _FIRST_SLEEP
        while not ready():
            waited = time.perf_counter() - began
            if limit and waited >= limit:
                raise self.timed_out(peers, what, waited)
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_SLEEP)

    def wait_all(self, requests, peers, what: str) -> None:
        """Return once every one of ``requests`` completes (see ``wait``)."""
        for request in requests:
            self.wait(request, peers, what)

    def timed_out(self, peers, what, waited) -> CollectiveTimeoutError:
        """Return the error for a wait of ``waited`` seconds on ``peers`` during ``what``."""
        named = ", ".join(f"rank {p} on {self._hosts[p]}" for p in peers)
        return CollectiveTimeoutError(
            f"rank {self._rank} on {self._hosts[self._rank]} waited {waited:.0f} s for "
            f"{named} during {what}, with no progress (RINGTRAIN_COLLECTIVE_TIMEOUT="
            f"{self.timeout:g}): the peer is frozen, dead or unreachable",
            [(self._world[p], self._hosts[p]) for p in peers],
        )
