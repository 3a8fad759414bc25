"""Host buffers that are allocated once, grown when needed and reused by every call."""

import math
import sys

import numpy as np

# TensorFlow takes a NumPy result over without copying it only when its data starts on a
# 64-byte boundary; NumPy's own allocations of large arrays start 16 bytes past a page.
ALIGNMENT = 64


def aligned_size(nbytes: int) -> int:
    """Return ``nbytes`` rounded up to a whole number of ALIGNMENT blocks."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def aligned_empty(shape, dtype) -> np.ndarray:
    """Return an uninitialised array of ``shape`` whose data starts on an ALIGNMENT boundary."""
    shape, dtype, nbytes = _layout(shape, dtype)
    return _aligned_view(np.empty(nbytes + ALIGNMENT, np.uint8), shape, dtype, nbytes)


def _layout(shape, dtype):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    return shape, dtype, math.prod(shape) * dtype.itemsize


def _aligned_view(raw, shape, dtype, nbytes):
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


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
        shape, dtype, nbytes = _layout(shape, dtype)
        size = nbytes + ALIGNMENT
        if nbytes < self._smallest:
            return aligned_empty(shape, dtype)
        owners = self._owners
        for i in range(len(owners)):
            if owners[i].nbytes == size and self._idle(i):
                owner = owners.pop(i)
                owners.append(owner)
                return _aligned_view(owner, shape, dtype, nbytes)
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
        return _aligned_view(owner, shape, dtype, nbytes)

    @property
    def held_bytes(self) -> int:
        """Return how many bytes of memory the pool keeps, held by callers or idle."""
        return sum(owner.nbytes for owner in self._owners)

    def _idle(self, i) -> bool:
        # The list's reference and getrefcount's argument: no view of it is alive.
        return sys.getrefcount(self._owners[i]) == 2


class BufferPool:
    """Named host buffers: ``get`` returns a view of a reused allocation, grown on demand."""

    def __init__(self):
        self._raw: dict[str, np.ndarray] = {}

    def get(self, name: str, count: int, dtype) -> np.ndarray:
        """Return a 1-D array of ``count`` elements of ``dtype`` backed by buffer ``name``.

        The contents are whatever the previous user left; a later ``get`` of the same name
        may return the same memory.
        """
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        raw = self._raw.get(name)
        if raw is None or raw.nbytes < nbytes:
            # Grow geometrically so a slowly growing workload reallocates only a few times.
            size = max(nbytes, 0 if raw is None else 2 * raw.nbytes, 4096)
            raw = np.empty(size, dtype=np.uint8)
            self._raw[name] = raw
        return raw[:nbytes].view(dtype)
