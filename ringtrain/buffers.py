"""Host buffers that are allocated once, grown when needed and reused by every call."""

import math

import numpy as np

# TensorFlow takes a NumPy result over without copying it only when its data starts on a
# 64-byte boundary; NumPy's own allocations of large arrays start 16 bytes past a page.
ALIGNMENT = 64


def aligned_size(nbytes: int) -> int:
    """Return ``nbytes`` rounded up to a whole number of ALIGNMENT blocks."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def aligned_empty(shape, dtype) -> np.ndarray:
    """Return an uninitialised array of ``shape`` whose data starts on an ALIGNMENT boundary."""
    shape, dtype, nbytes = layout(shape, dtype)
    return aligned_view(np.empty(nbytes + ALIGNMENT, np.uint8), shape, dtype, nbytes)


def layout(shape, dtype):
    """Return ``shape`` as a tuple, ``dtype`` as a NumPy dtype, and their bytes."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    return shape, dtype, math.prod(shape) * dtype.itemsize


def aligned_view(raw, shape, dtype, nbytes) -> np.ndarray:
    """Return the ALIGNMENT-aligned array of ``shape`` that starts in the bytes ``raw``."""
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class BufferPool:
    """Named host buffers: ``get`` returns a view of a reused allocation, grown on demand.

    ``allocate(nbytes)`` makes each allocation, a 1-D uint8 host array: NumPy's own memory
    by default, page-locked memory for staging device data (``kernels`` ``pinned_empty``).
    """

    def __init__(self, allocate=None):
        self._raw: dict[str, np.ndarray] = {}
        self._allocate = allocate if allocate is not None else _host_bytes

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
            raw = self._allocate(size)
            self._raw[name] = raw
        return raw[:nbytes].view(dtype)


def _host_bytes(nbytes: int) -> np.ndarray:
    """Return ``nbytes`` uninitialised bytes of NumPy's own memory."""
    return np.empty(nbytes, dtype=np.uint8)
