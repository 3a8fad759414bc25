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
``Reports`` keeps the notices a rank has seen, and follows them to the ranks lost in fact;
``PeerWatch`` beats, looks out for notices and silence, and gives up and blames.
"""

import functools
import sys
import time

from ringtrain import contract
from ringtrain.errors import CollectiveTimeoutError

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
        self.size = size
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


class PeerWatch:
    """One rank's heartbeats, its look-outs for lost peers, and its report when it gives up.

    It beats through the engine's negotiation ``side`` (``engine.sides``), hears other
    ranks' notices on ``channel``, and waits and words its errors through ``waiter``
    (``transport.progress.Waiter``), which it listens to: a rank waiting in a transfer
    beats on and hears of lost peers there too.
    """

    def __init__(self, liveness, side, channel, waiter, topology):
        self.liveness = liveness
        self.reports = Reports()  # the notices of lost peers (see ``give_up``)
        self._side = side
        self._channel = channel
        self._waiter = waiter
        self._topology = topology
        waiter.listen(self._while_waiting)

    def beat(self, in_flight, shutdown_sent) -> None:
        """Beat if it is time; then fail if a peer was reported lost or has fallen silent.

        ``in_flight``: the names this rank waits for; ``shutdown_sent``: this rank has asked
        the coordinator to stop every engine.
        """
        if not self.liveness.beat_due():
            return
        self._side.beat()
        notice = self._notices()
        if notice is not None:
            raise self._waiter.relayed(notice, *self._side.awaited(in_flight, shutdown_sent))
        silent, waiting = self._side.silent(in_flight, shutdown_sent)
        if silent:
            topology, liveness = self._topology, self.liveness
            names, world, rank = topology.host_names, topology.world_ranks, topology.rank
            peers = ", ".join(f"rank {r} on {names[r]} for {s:.0f} s" for r, s in silent)
            raise CollectiveTimeoutError(
                f"rank {rank} on {names[rank]} heard nothing from {peers}, while "
                f"{waiting} (RINGTRAIN_COLLECTIVE_TIMEOUT={liveness.timeout:g}): the "
                "peer is frozen, dead or unreachable",
                [(world[r], names[r]) for r, _ in silent],
            )

    def _while_waiting(self):
        """Beat if it is time, while a transfer waits; return a notice of lost peers, or None.

        A rank that waits in a transfer, for a rank that waits in turn for a lost one, beats
        on: it is not silent. It checks no one's silence meanwhile (it takes no messages in).
        """
        if self.liveness.beat_due():
            self._side.beat()
        return self._notices()

    def _notices(self):
        """Note the notices of lost peers that came; return the first that found some, or None."""
        self.reports.add(self._channel.lost_notices())
        return self.reports.first()

    def give_up(self, err) -> None:
        """Say why this rank gives up, tell the others, wait for them to, say whom it blames.

        It waits until every other rank has given up too, or is lost (``Reports.settled``),
        for ``CONFIRM_SECONDS`` at most: a caller given its error may end the job, so no
        rank's callers are given theirs before every rank that can act has its own. Only a
        rank that found peers lost blames ranks, in the contract's unreachable lines, and
        only those behind its peers that never answered (``_blame``): a rank that was told
        may have waited for a rank that is fine.
        """
        # The message names the peers and the tensors; the transport's stack adds nothing.
        sys.stderr.write(f"ringtrain: error: {err}; ending the job\n")
        sys.stderr.flush()
        mine = self._waiter.notice(err)
        self.reports.add([mine])
        # The ranks named lost too: one that is not (it waits in turn) answers, and is not blamed.
        rank = self._topology.rank
        others = [r for r in range(self._topology.size) if r != rank]
        sends = self._channel.tell_lost(mine, others)
        settled = functools.partial(self.reports.settled, others)
        self._waiter.linger(sends, CONFIRM_SECONDS, settled)
        self._blame(mine)

    def _blame(self, mine):
        """Say which ranks named lost answered since, and who never did; blame those if found.

        ``mine``: this rank's own notice. A rank that found its peers lost blames the ranks
        behind them that never answered (``Reports.unanswered``).
        """
        reports = self.reports
        cited = reports.first()
        answered = [r for r in cited.waited_for if reports.answered(r)]
        if answered:
            taken_back = self._waiter.taken_back(answered, reports.unanswered(cited.waited_for))
            sys.stderr.write(f"ringtrain: error: {taken_back}\n")
        if mine.found:
            names, world = self._topology.host_names, self._topology.world_ranks
            for rank in reports.unanswered(mine.waited_for):  # for ringtrain-run (contract)
                sys.stderr.write(contract.unreachable_line(world[rank], names[rank]) + "\n")
        sys.stderr.flush()

    def end_job(self) -> None:
        """Linger while the callers raise their errors, then end the whole job."""
        self._waiter.linger((), REPORT_SECONDS - CONFIRM_SECONDS)
        self._channel.abort(1)
