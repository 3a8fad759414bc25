"""Whether the other ranks' engines still answer: heartbeats on the control channel.

Every engine sends the coordinator an empty message every ``beat_every`` seconds, and the
coordinator sends every rank one likewise; each also checks then whether a peer it waits
for has been silent too long. A rank
whose process is frozen (SIGSTOP, a hung kernel or driver) or cut off falls silent. The
coordinator fails when some tensor waits for ranks and a rank has been silent for the
timeout; any other rank fails when it waits for responses and the coordinator has been
silent that long. A completed collective shows that every rank took part, so it counts as
hearing from everyone: no engine beats during a long transfer, and that is no silence.
"""

import time

_LONGEST_BEAT = 1.0  # seconds between heartbeats at most


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
