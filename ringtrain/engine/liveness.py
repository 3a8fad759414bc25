"""Whether the other ranks' engines still answer: heartbeats on the control channel.

Every engine sends the coordinator an empty message every ``beat_every`` seconds, and the
coordinator sends every rank one likewise; each also checks then whether a peer it waits
for has been silent too long. A rank
whose process is frozen (SIGSTOP, a hung kernel or driver) or cut off falls silent. The
coordinator fails when some tensor waits for ranks and a rank has been silent for the
timeout; any other rank fails when it waits for responses and the coordinator has been
silent that long. A completed collective shows that every rank took part, so it counts as
hearing from everyone; and a rank whose transfer waits for a peer beats from that wait
(``transport.progress``): one that waits in turn for a lost rank is not taken for silent.

The rank that finds a peer lost tells every other rank (a ``transport.progress.LostNotice``),
which looks for such notices at each heartbeat and in its transfers' waits, and gives up
in turn with its own error, telling the others that it did and whom it waited for.
``Reports`` keeps the notices a rank has seen, and follows them to the ranks lost in fact.
"""

import time

_LONGEST_BEAT = 1.0  # seconds between heartbeats at most
# A rank that gives up listens this long at most for the others' notices before it says whom
# it blames and fails its callers: each gives up at its next heartbeat at the latest.
CONFIRM_SECONDS = _LONGEST_BEAT
# It ends the job this long after it gave up at most: a second more, after its callers got
# their errors, for the lines of every rank to reach mpirun (a fraction of a second when the
# machine is busy).
REPORT_SECONDS = CONFIRM_SECONDS + 1.0


class Liveness:
    """When this rank last heard from each rank of ``size``, and when it beats next.

    ``timeout`` 0 turns the check off (and the heartbeats with it).
    """

    def __init__(self, timeout: float, size: int, clock=time.monotonic):
        self.timeout = timeout
        self.beat_every = min(_LONGEST_BEAT, timeout / 4) if timeout else 0.0
        self._clock = clock
        now = clock()
        self._heard = [now] * size
        self._everyone = now  # when a collective last completed: every rank took part
        self._next_beat = now + self.beat_every if timeout else float("inf")
        # An idle engine sleeps this long at a time: it wakes for its next heartbeat, and
        # takes the coordinator's notices (a peer's shutdown, a lost rank) at least as often.
        self.idle_seconds = self.beat_every or _LONGEST_BEAT

    def heard(self, rank: int) -> None:
        """Note a message from ``rank``."""
        self._heard[rank] = self._clock()

    def heard_all(self) -> None:
        """Note that every rank took part in a collective that completed."""
        self._everyone = self._clock()

    def beat_due(self) -> bool:
        """Return True, once every ``beat_every`` seconds, when it is time for a heartbeat."""
        now = self._clock()
        if now < self._next_beat:
            return False
        self._next_beat = now + self.beat_every
        return True

    def silent(self, ranks) -> list[tuple[int, float]]:
        """Return (rank, seconds) for each of ``ranks`` silent for longer than the timeout."""
        if not self.timeout:
            return []
        now, everyone = self._clock(), self._everyone
        quiet = [(r, now - max(self._heard[r], everyone)) for r in ranks]
        return [(r, seconds) for r, seconds in quiet if seconds > self.timeout]


class Reports:
    """The notices of lost peers that this rank has seen (``transport.progress.LostNotice``).

    Every rank that gives up sends one: whom it waited for, and whether it found them lost
    itself. Its sender is alive, whoever named it: a rank that waits for a rank that waits
    in turn for the lost one may time out first, and name the wrong one. Following each
    rank that answered to the ranks it waited for leads to those that never answered.
    """

    def __init__(self):
        self._notices = []
        self._waited_for: dict[int, tuple[int, ...]] = {}  # by each rank that answered

    def add(self, notices) -> None:
        """Note each of ``notices``."""
        for notice in notices:
            self._notices.append(notice)
            self._waited_for[notice.reporter] = notice.waited_for

    def first(self):
        """Return the first notice of a rank that found peers lost, or None."""
        return next((notice for notice in self._notices if notice.found), None)

    def answered(self, rank: int) -> bool:
        """Return True if ``rank`` has sent a notice: it is alive."""
        return rank in self._waited_for

    def settled(self, ranks) -> bool:
        """Return True once each of ``ranks`` has answered, or is lost.

        Lost: named by a rank that found it lost, and silent since (``unanswered``).
        """
        named = [r for notice in self._notices if notice.found for r in notice.waited_for]
        lost = set(self.unanswered(named))
        return all(self.answered(r) or r in lost for r in ranks)

    def unanswered(self, ranks) -> list[int]:
        """Return the ranks behind ``ranks`` that never answered, in order.

        A rank of ``ranks`` that answered leads on to the ranks that it waited for.
        """
        seen, todo, silent = set(), list(ranks), set()
        while todo:
            rank = todo.pop()
            if rank not in seen:
                seen.add(rank)
                if rank in self._waited_for:
                    todo.extend(self._waited_for[rank])
                else:
                    silent.add(rank)
        return sorted(silent)
