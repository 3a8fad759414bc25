"""The stall inspector: names submitted by some ranks but not by others, for too long."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Stall:
    """A name that ranks ``submitted`` sent and waited ``age`` seconds for the ranks ``missing``."""

    name: str
    submitted: tuple
    missing: tuple
    age: float


class StallInspector:
    """Tracks when each pending name was first submitted and reports those that waited long."""

    def __init__(self, warn_after: float, shutdown_after: float | None):
        self.warn_after = warn_after
        self.shutdown_after = shutdown_after
        self._first_seen: dict[str, float] = {}
        self._warned: set[str] = set()

    def seen(self, name: str, now: float) -> None:
        """Note that ``name`` was submitted by some rank at ``now`` (first time counts)."""
        self._first_seen.setdefault(name, now)

    def done(self, name: str) -> None:
        """Forget ``name``: every rank has submitted it, no submission is left, or it failed."""
        self._first_seen.pop(name, None)
        self._warned.discard(name)

    def check(self, now: float, ranks_of) -> tuple[list[Stall], list[Stall]]:
        """Return (stalls to warn about now, stalls past the shutdown time).

        ``ranks_of(name)`` gives (the ranks that submitted ``name``, those that have not).
        Each stall is warned about once; a zero ``warn_after`` turns warnings off.
        """
        warn, fatal = [], []
        for name, first in self._first_seen.items():
            age = now - first
            if self.shutdown_after is not None and age >= self.shutdown_after:
                fatal.append(Stall(name, *map(tuple, ranks_of(name)), age))
            elif self.warn_after > 0 and age >= self.warn_after and name not in self._warned:
                self._warned.add(name)
                warn.append(Stall(name, *map(tuple, ranks_of(name)), age))
        return warn, fatal


def describe(stall: Stall) -> str:
    """Return a one-line account of ``stall`` for a warning or an error."""
    return (
        f"tensor {stall.name!r} has waited {stall.age:.1f} s for ranks {_ranks(stall.missing)}, "
        f"which have not submitted it (ranks {_ranks(stall.submitted)} have); every rank must "
        "submit the same names"
    )


def _ranks(ranks):
    return "[" + ", ".join(str(r) for r in ranks) + "]"
