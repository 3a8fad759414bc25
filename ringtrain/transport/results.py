"""Results that the ranks of one host share: where the next one goes, and who still holds what.

An allreduce through shared memory can leave its result in one place that every rank of the
host reads, instead of each rank copying every segment out into memory of its own. Such a
result is read-only, and it keeps its bytes for as long as anything refers to it: each one
is an array whose base is a ``memoryview`` of its own, and every view of the array,
TensorFlow's tensors over it included, keeps that base alive.

Every rank places the same results at the same offsets: places follow each other round the
area in call order, whatever the ranks decide. Whether a call may use its place is decided
together (see ``SharedRing``): each rank says whether it still holds any result there.
"""

import weakref

import numpy as np

from ringtrain.buffers import aligned_size


class SharedResults:
    """The result area of one shared-memory file: ``memory``, seen the same by every rank."""

    def __init__(self, memory: memoryview):
        self.capacity = len(memory)
        self._memory = memory
        self._next = 0
        self._held: list[tuple[int, int, weakref.ref]] = []  # (start, stop, its base)

    def place(self, nbytes: int) -> int | None:
        """Return the offset of the next result of ``nbytes`` (None if it never fits).

        Every rank must ask for every call, in the same order: the next place starts where
        this one ends, whether or not the call used it.
        """
        size = aligned_size(nbytes)
        if nbytes == 0 or size > self.capacity:
            return None
        start = self._next if self._next + size <= self.capacity else 0
        self._next = start + size
        return start

    def free_here(self, start: int, nbytes: int) -> bool:
        """Return True if this rank holds no result that overlaps ``nbytes`` at ``start``."""
        self._held = [h for h in self._held if h[2]() is not None]
        stop = start + nbytes
        return all(h_stop <= start or stop <= h_start for h_start, h_stop, _ in self._held)

    def take(self, start: int, count: int, dtype) -> np.ndarray:
        """Return ``count`` elements of ``dtype`` at ``start``, held until no view of it is left."""
        nbytes = count * np.dtype(dtype).itemsize
        array = np.frombuffer(self._memory[start : start + nbytes], dtype)
        self._held.append((start, start + nbytes, weakref.ref(array.base)))
        return array
