"""Waiting on peers without burning a core, and failing when one stops making progress.

Each wait is for one message or one collective step, so the time it takes is the time since
the last progress with that peer, however long the whole transfer is: a slow but moving
1 GiB allreduce completes a chunk every few seconds even over a slow link, and never trips
the timeout. A wait also ends when another rank reports a lost peer (a ``LostNotice``): the
rank that found it tells every other, and each of those fails with its own error, naming
what it waited for, rather than waiting out its own timeout. A wait first polls (yielding
the CPU between polls) ``SPINS`` times, then sleeps between polls, doubling the sleep up
to ``LONGEST_SLEEP``: a stuck rank stops eating its core within milliseconds, and ranks that
outnumber the cores do not starve each other. On a rank alone on its host, a ring's wait
for its next chunk adapts how long it polls to how long the waits before it took
(``Waiter.until``): on a slow link those take milliseconds, and polling through them took
the cores from the training beside them.
"""

import os
import time
from typing import NamedTuple

from ringtrain.errors import CollectiveTimeoutError

# A wait first polls at most this many times, yielding the CPU between polls: about 1.6 ms
# (an MPI request's test and a sched_yield take about 0.8 us), counted rather than timed to
# keep a clock off each poll.
SPINS = 2000
# ... and a ring's wait for its next chunk at least this many: one that sleeps more than
# SHORT_SLEEPS times after its polls (20 + 40 us, 100-200 us with the kernel's timer slack)
# halves the next one's polls, down to MIN_SPINS; one that ends sooner doubles them.
MIN_SPINS = 32
SHORT_SLEEPS = 2
_FIRST_SLEEP = 20e-6
# A sleep overshoots the message's arrival by this much at most: 3% of a 1 MiB chunk's time
# at 1 Gbit/s (8.4 ms), for under 1% of a core while a rank waits.
LONGEST_SLEEP = 250e-6
# A rank that waits only for ranks of its own host waits this much longer: those usually wait
# in turn for the host that stopped answering, and the rank that waits for that host itself
# should be the one to report it.
LOCAL_GRACE_SECONDS = 10.0
# A sleeping wait looks for another rank's report of a lost peer this often (an MPI probe).
LISTEN_EVERY = 0.01


class LostNotice(NamedTuple):
    """What a rank that gives up tells the others (ranks of their communicator)."""

    reporter: int  # the rank that gives up
    waited_for: tuple[int, ...]  # the peers it waited for
    found: bool  # it found them lost itself; else another rank's notice made it give up
    reason: str  # its own error's message


def _no_notice():
    return None


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
        self._notices = _no_notice
        self._mates = frozenset(
            r for r, h in enumerate(self._hosts) if h == self._hosts[self._rank]
        )
        self._adapts = topology.alone_on_host  # (``until``)
        self.spins = SPINS  # polls of the next adapting wait before it sleeps (``until``)

    def listen(self, notices) -> None:
        """Call ``notices()`` every ``LISTEN_EVERY`` s of a sleeping wait, and while lingering.

        A wait fails once it returns a ``LostNotice`` (not None). The caller may do more in
        it meanwhile (the engine beats), but must not raise.
        """
        self._notices = notices

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

    def until(self, ready, peers, what: str, adapt: bool = False) -> None:
        """Return once ``ready()`` is true, polling it as ``wait`` polls a request.

        It polls ``SPINS`` times, then sleeps between polls. An ``adapt`` wait (a ring's wait
        for its next chunk, which takes milliseconds on a slow link) of a rank alone on its
        host polls ``spins`` times instead: one that ends within ``SHORT_SLEEPS`` sleeps
        doubles them (up to ``SPINS``), since polling a little longer would have caught it,
        and a longer one halves them (down to ``MIN_SPINS``). Where a host runs several
        ranks, the polls also move the host's own transfers, and polling less cost 2 x 2
        hosts 3-4% at 4 MiB (docs/benchmarks.md, "Polling while a ring waits").
        """
        adapt = adapt and self._adapts
        spins = self.spins if adapt else SPINS
        for _ in range(spins):
            if ready():
                return
            os.sched_yield()
        sleeps = self._sleep_until(ready, peers, what, time.perf_counter())
        if adapt:
            short = sleeps <= SHORT_SLEEPS
            self.spins = min(SPINS, spins * 2) if short else max(MIN_SPINS, spins // 2)

    def _sleep_until(self, ready, peers, what, began) -> int:
        """Poll ``ready()`` with growing sleeps between, until it is true or the wait times out.

        The timeout counts from ``began``; the polling before it (1.6 ms at most) is not
        counted. Returns how many times it slept.
        """
        limit = self.timeout
        if limit and self._mates.issuperset(peers):
            limit += LOCAL_GRACE_SECONDS
        pause = _FIRST_SLEEP
        listen_at = 0.0
        sleeps = 0
        while not ready():
            waited = time.perf_counter() - began
            if limit and waited >= limit:
                notice = self._notices()  # came meanwhile: the peer may be waiting in turn
                if notice is not None:
                    raise self.relayed(notice, peers, what)
                raise self.timed_out(peers, what, waited)
            if waited >= listen_at:
                listen_at = waited + LISTEN_EVERY
                notice = self._notices()
                if notice is not None:
                    raise self.relayed(notice, peers, what)
            time.sleep(pause)
            sleeps += 1
            pause = min(pause * 2, LONGEST_SLEEP)
        return sleeps

    def wait_all(self, requests, peers, what: str) -> None:
        """Return once every one of ``requests`` completes (see ``wait``)."""
        for request in requests:
            self.wait(request, peers, what)

    def linger(self, requests, seconds: float, until=None) -> None:
        """Poll ``requests`` and the notices for ``seconds``, or until ``until()`` is true.

        For a rank about to end the job: its sends progress meanwhile (best effort, as one
        to a lost host may never complete), the other ranks have time to act on them, and
        their notices reach ``listen``'s ``notices``. ``until`` is asked after each look at
        the notices; it returns early only once the sends have gone too.
        """
        end = time.perf_counter() + seconds
        pending = list(requests)
        while time.perf_counter() < end:
            pending = [request for request in pending if not request.Test()]
            self._notices()
            if until is not None and not pending and until():
                return
            time.sleep(LISTEN_EVERY)

    def timed_out(self, peers, what, waited) -> CollectiveTimeoutError:
        """Return the error for a wait of ``waited`` seconds on ``peers`` during ``what``."""
        return CollectiveTimeoutError(
            f"rank {self._rank} on {self._hosts[self._rank]} waited {waited:.0f} s for "
            f"{self._named(peers)} during {what}, with no progress (RINGTRAIN_COLLECTIVE_TIMEOUT="
            f"{self.timeout:g}): the peer is frozen, dead or unreachable",
            self._located(peers),
        )

    def relayed(self, notice: LostNotice, peers, what: str) -> CollectiveTimeoutError:
        """Return the error for a wait on ``peers`` during ``what``, ended by ``notice``.

        ``peers`` may be empty: ``what`` then says what this rank was doing instead.
        """
        doing = f"waiting for {self._named(peers)} during {what}" if peers else what
        return CollectiveTimeoutError(
            f"rank {self._rank} on {self._hosts[self._rank]} gave up: {self._report(notice)}; "
            f"this rank was {doing}",
            self._located(peers),
            self._located([notice.reporter])[0],
        )

    def taken_back(self, answered, unanswered) -> str:
        """Return that the ranks ``answered``, named lost, are not, and who never answered."""
        lost = (
            f"{self._named(unanswered)}, waited for in turn, never answered"
            if unanswered
            else "every rank waited for in turn answered"
        )
        return (
            f"rank {self._rank} on {self._hosts[self._rank]}: {self._named(answered)} "
            f"answered after all (gave up in turn and said so), so it is not lost; {lost}"
        )

    def notice(self, err: CollectiveTimeoutError) -> LostNotice:
        """Return what to tell the other ranks as this rank gives up with ``err``.

        It names the peers that ``err`` says it waited for, found lost unless another rank's
        notice told of its loss.
        """
        waited_for = tuple(self._world.index(rank) for rank, _ in err.peers)
        return LostNotice(self._rank, waited_for, err.reported_by is None, str(err))

    def _report(self, notice: LostNotice) -> str:
        return (
            f"{self._named([notice.reporter])} reported {self._named(notice.waited_for)} frozen, "
            f"dead or unreachable ({notice.reason})"
        )

    def _named(self, peers) -> str:
        return ", ".join(f"rank {p} on {self._hosts[p]}" for p in peers)

    def _located(self, peers) -> list[tuple[int, str]]:
        return [(self._world[p], self._hosts[p]) for p in peers]
