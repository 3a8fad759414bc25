"""The hosts that failed an elastic job: left out for a cool-down, dropped for good at a limit.

When a launch fails, the launcher blames hosts from what its ranks said
(``culprits``): a host whose rank stopped answering its peers, or else the host of a rank
that failed on its own. A blamed host is left out of the launches for ``cooldown`` seconds,
and for the rest of the job once it has been blamed ``limit`` times. As in Horovod's
elastic driver, a host whose cool-down is over comes back: a running job is relaunched to
take it in at its next commit.
"""

import time
from collections.abc import Callable, Iterable

from ringtrain.runner import hosts
from ringtrain.runner.hosts import Host


class Blacklist:
    """How often each host failed the job, and until when it is left out."""

    def __init__(self, cooldown: float, limit: int, clock: Callable[[], float] = time.monotonic):
        """Leave a failed host out ``cooldown`` s, and for good at its ``limit``-th failure."""
        self._cooldown = cooldown
        self._limit = limit
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def fail(self, name: str) -> str:
        """Count a failure of host ``name`` and leave it out; return what becomes of it."""
        self._failures[name] = self._failures.get(name, 0) + 1
        self._until[name] = self._clock() + self._cooldown
        if self.dropped(name):
            return (
                f"failed {self._failures[name]} times (--blacklist-limit {self._limit}); "
                "it is left out for good"
            )
        return (
            f"failed (time {self._failures[name]} of --blacklist-limit {self._limit}); "
            f"it is left out for {self._cooldown:g} s (--blacklist-cooldown)"
        )

    def dropped(self, name: str) -> bool:
        """Return True if host ``name`` has failed ``limit`` times: it is out for good."""
        return self._failures.get(name, 0) >= self._limit

    def left_out(self, name: str) -> bool:
        """Return True if host ``name`` is dropped or still cooling down."""
        return self.dropped(name) or self._clock() < self._until.get(name, -float("inf"))

    def usable(self, found: Iterable[Host]) -> list[Host]:
        """Return the hosts of ``found`` that are not left out, in their order."""
        return [host for host in found if not self.left_out(host.name)]

    def describe(self, found: Iterable[Host]) -> str:
        """Return which hosts of ``found`` are left out and why, or "" if none is."""
        out = [
            f"{host.name} ({'for good' if self.dropped(host.name) else 'cooling down'})"
            for host in found
            if self.left_out(host.name)
        ]
        return f"left out: {', '.join(out)}" if out else ""


def culprits(placed: tuple[Host, ...], unreachable: set[int], failed: set[int]) -> list[str]:
    """Return the hosts of ``placed`` to blame for a failed launch, in their order.

    ``unreachable``: the ranks that peers found unreachable or frozen; ``failed``: the ranks
    that failed on their own, which count only when no rank was unreachable (ranks that lose
    a peer fail too). Ranks are placed in order, by slot. When every host is blamed, none
    is: the program failed, or the hosts lost each other, and leaving all out helps no one.
    """
    ranks = unreachable or failed
    named = {hosts.host_of_rank(list(placed), rank) for rank in ranks}
    blamed = [host.name for host in placed if host.name in named]
    return [] if len(blamed) == len(placed) else blamed
