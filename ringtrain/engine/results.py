"""Result memory: where each collective's result lives, and when it may be shared read-only.

Every rule about result memory, in one place:

- **Private results** come from ``ResultPool``: aligned arrays whose memory is reused once no
  caller holds them. A caller's ``out=`` array gets a copy instead (``deliver``).
- **Read-only shared results.** Ranks of one host may read one copy of an allreduce's result
  in place, in the result area of the shared-memory file (``transport.results``). That is
  safe only for callers that never write to their result:
  1. a caller says so with ``read_only=True`` (``Request.read_only``); ringtrain.tensorflow
     does for the gradients that Keras's own optimizer updates apply
     (``tensorflow.keras.optimizer._reads_only``), which only read them;
  2. the planner makes a unit read-only only where every present request asks and
     ``shareable`` holds (no integer Average divides the result afterwards);
  3. the transport's host rings then vote on every rank whether the result takes a place in
     the area (``transport.shared.SharedRegions.vote``), and hand out a read-only view there,
     or a private result from ``ResultMemory.factory`` where any rank cannot.
"""

import functools
import sys

import numpy as np

from ringtrain.buffers import ALIGNMENT, aligned_empty, aligned_view, layout
from ringtrain.dtypes import is_integer
from ringtrain.ops import ReduceOp


def shareable(meta, dtype) -> bool:
    """Return True if results of ``meta`` may be read-only (and shared by the host's ranks).

    They may where every caller said it never writes to them (checked apart), and no integer
    Average divides them afterwards.
    """
    return not (meta.op == ReduceOp.Average and is_integer(dtype))


def deliver(result, out):
    """Return ``result``, or copy it into the caller's ``out`` and return that."""
    if out is None:
        return result
    np.copyto(out, result)
    return out


class ResultMemory:
    """The private results of one engine, from a ``ResultPool``; see the module docstring."""

    def __init__(self):
        self._pool = ResultPool()

    def empty(self, shape, dtype) -> np.ndarray:
        """Return a new, uninitialised private result of ``shape`` and ``dtype``."""
        return self._pool.empty(shape, dtype)

    def factory(self, dtype):
        """Return ``new(count)``, which makes a 1-D private result of ``dtype``: for transports."""
        return functools.partial(self._pool.empty, dtype=dtype)


class ResultPool:
    """Aligned arrays for results that callers keep; memory no caller holds any more is reused.

    A large array allocated afresh is often a fresh mapping from the operating system, whose
    pages fault in on first write; in training that is every step's gradients, every step.
    The pool keeps the memory of results of at least ``smallest`` bytes, up to ``capacity``
    bytes in all, and ``empty`` hands one out again once nothing outside the pool refers to
    it: CPython's reference count of the memory's owner counts every view of it. A result
    larger than the capacity is kept only while the pool keeps nothing else, so that one
    caller who reduces such a tensor over and over reuses its memory. Smaller results, and
    others beyond the capacity, are plain ``aligned_empty`` arrays. Use from one thread.
    """

    def __init__(self, smallest: int = 1 << 20, capacity: int = 256 << 20):
        self._smallest = smallest
        self._capacity = capacity
        self._owners: list[np.ndarray] = []  # least recently handed out first

    def empty(self, shape, dtype) -> np.ndarray:
        """Return an uninitialised array of ``shape``, aligned as ``aligned_empty``'s are."""
        shape, dtype, nbytes = layout(shape, dtype)
        size = nbytes + ALIGNMENT
        if nbytes < self._smallest:
            return aligned_empty(shape, dtype)
        owners = self._owners
        for i in range(len(owners)):
            if owners[i].nbytes == size and self._idle(i):
                owner = owners.pop(i)
                owners.append(owner)
                return aligned_view(owner, shape, dtype, nbytes)
        # Make room by letting go of idle memory, least recently used first.
        held = self.held_bytes
        i = 0
        while held + size > self._capacity and i < len(owners):
            if self._idle(i):
                held -= owners.pop(i).nbytes
            else:
                i += 1
        owner = np.empty(size, np.uint8)
        if held + size <= self._capacity or not owners:
            owners.append(owner)
        return aligned_view(owner, shape, dtype, nbytes)

    @property
    def held_bytes(self) -> int:
        """Return how many bytes of memory the pool keeps, held by callers or idle."""
        return sum(owner.nbytes for owner in self._owners)

    def _idle(self, i) -> bool:
        # The list's reference and getrefcount's argument: no view of it is alive.
        return sys.getrefcount(self._owners[i]) == 2
