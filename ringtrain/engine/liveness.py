"""Whether the other ranks' engines still answer: heartbeats on the control channel.

Every engine sends the coordinator a message at least every ``beat_every`` seconds (an empty
one when it has nothing to say), and the coordinator sends every rank one likewise. A rank
whose process is frozen (SIGSTOP, a hung kernel or driver) or cut off falls silent. The
coordinator fails when some tensor waits for ranks and a rank has been silent for the
timeout; any other rank fails when it waits for responses and the coordinator has been
silent that long. A completed collective shows that every rank took part, so it counts as
hearing from everyone: no engine beats during a long transfer, and that is no silence.
"""

import time

_LONGEST_BEAT = 1.0  # seconds between heartbeats at most


class Liveness:
    """When this rank last heard from each rank of ``size``, and when it last spoke.

    ``timeout`` 0 turns the check off (and the heartbeats with it).
    """

    def __init__(self, timeout: float, size: int, clock=time.monotonic):
        self.timeout = timeout
        self.beat_every = min(_LONGEST_BEAT, timeout / 4) if timeout else 0.0
        self._clock = clock
        now = clock()
        self._heard = [now] * size
        self._spoke = now

    def heard(self, rank: int) -> None:
        """Note a message from ``rank``."""
        self._heard[rank] = self._clock()

    def heard_all(self) -> None:
        """Note that every rank took part in a collective that completed."""
        self._heard = [self._clock()] * len(self._heard)

    def spoke(self) -> None:
        """Note that this rank has just sent a message (a heartbeat or any other)."""
        self._spoke = self._clock()

    def beat_due(self) -> bool:
        """Return True if this rank has been quiet for a heartbeat's interval."""
        return bool(self.beat_every) and self._clock() - self._spoke >= self.beat_every

    def silent(self, ranks) -> list[tuple[int, float]]:
        """Return (rank, seconds) for each of ``ranks`` silent for longer than the timeout."""
        if not self.timeout:
            return []
        now = self._clock()
        return [(r, now - self._heard[r]) for r in ranks if now - self._heard[r] > self.timeout]
