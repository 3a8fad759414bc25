"""Agreement on cached tensors without a message from every rank to rank 0: counts up a tree.

A tensor that the coordinator has negotiated whole once, with the same meta on every rank,
gets a cache id (``RINGTRAIN_CACHE_CAPACITY`` of them at most). After that, a rank that
submits it again sends nothing to rank 0: it counts the submission under the id. Ranks form
a tree in which each has ``FAN_OUT`` children at most (rank r's parent is
(r - 1) // ``FAN_OUT``), and each passes up, per id, the smallest count of its subtree when
that count rises; rank 0's smallest count is the number of rounds that every rank has
submitted. A round of a name cannot start on a rank before its last round has run there,
so each rise at rank 0 is one new round, which the coordinator then answers as it answers
every other (``Coordinator.agree``), in its one ordered stream.

Rank 0 thus takes one message a step from each of its children (16 at most) instead of one
from every rank, and each rank sends one. Up to 17 ranks the tree is flat, every count
going straight to rank 0: with a binary tree, the counts of rank 3 of 4 ranks on 2 cores
hopped through rank 1, and a lone 4 KiB allreduce ran 16-18% slower (``bench compare``,
-np 4, one run). Counts only grow, so a count that arrives late is never wrong, only late.
What a count cannot carry (a change of shape, a withdrawal, a rank that never submits, a
join) evicts the id (``Coordinator``): every rank sends its counted submissions of that
name whole again, and the coordinator checks them as it checks any. Pure bookkeeping with
no MPI; the engine's side carries the counts.
"""

# Children per rank: rank 0's messages a step stay at this many however many ranks there
# are, and 1024 ranks are 3 hops deep.
FAN_OUT = 16


class CountTree:
    """One rank's place in the tree of ``size`` ranks, and the counts it has seen, per id."""

    def __init__(self, rank: int, size: int, fan_out: int | None = None):
        """``fan_out``: children per rank at most (None: ``FAN_OUT``)."""
        fan_out = fan_out or FAN_OUT
        self.parent = (rank - 1) // fan_out if rank else None
        first = fan_out * rank + 1
        self.children = tuple(range(first, min(first + fan_out, size)))
        self._own: dict[int, int] = {}  # id -> this rank's submissions under it
        self._heard: dict[int, dict[int, int]] = {c: {} for c in self.children}
        self._passed: dict[int, int] = {}  # id -> the smallest count passed up (or agreed)
        self._changed: set[int] = set()

    def submit(self, ident: int) -> int:
        """Count one more submission of this rank under ``ident``; return which it is (1 first)."""
        count = self._own.get(ident, 0) + 1
        self._own[ident] = count
        self._changed.add(ident)
        return count

    def heard(self, child: int, pairs) -> None:
        """Take ``child``'s (id, smallest count of its subtree) ``pairs``."""
        counts = self._heard[child]
        for ident, count in pairs:
            if count > counts.get(ident, 0):
                counts[ident] = count
                self._changed.add(ident)

    def risen(self) -> list[tuple[int, int]]:
        """Return (id, count) for each id whose smallest count over the subtree has risen."""
        out = []
        for ident in self._changed:
            low = self._own.get(ident, 0)
            for counts in self._heard.values():
                low = min(low, counts.get(ident, 0))
            if low > self._passed.get(ident, 0):
                self._passed[ident] = low
                out.append((ident, low))
        self._changed.clear()
        return out

    def forget(self, ident: int) -> None:
        """Drop every count of ``ident``, which stands for nothing any more (evicted)."""
        self._own.pop(ident, None)
        self._passed.pop(ident, None)
        self._changed.discard(ident)
        for counts in self._heard.values():
            counts.pop(ident, None)
