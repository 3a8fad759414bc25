"""The ring's reduce-scatter and an allgather through shared memory, for ranks on one host.

Each rank owns a region of one shared-memory file that every rank of the host maps. Where the
message ring sends a partial sum to its right neighbour, here a rank leaves it in its own
region and the neighbour, after a barrier, reads it straight into its reduction: no message
protocol, no copy into a receive buffer. The reduce-scatter follows the ring's schedule; in the
allgather every rank then copies each finished segment from the region of the rank that
finished it, in one step.

Every region is double: consecutive calls alternate halves, so a rank that starts the next
call cannot overwrite data a slower rank still reads from the last one (to reach a half again
it must pass a barrier of the call in between, which the slower rank enters only once done).
"""

import mmap
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from ringtrain.buffers import ALIGNMENT
from ringtrain.ring import schedule

_DIRECTORY = "/dev/shm"


class SharedRegions:
    """One shared-memory file with two regions of ``capacity`` bytes per rank of ``comm``.

    Collective over ``comm``, whose ranks must share a host. ``available`` is False on every
    rank when some rank could not create or map the file; the reason is printed once.
    """

    def __init__(self, comm: MPI.Comm, capacity: int):
        self.capacity = capacity
        self._stride = -(-capacity // ALIGNMENT) * ALIGNMENT  # each region starts aligned
        total = 2 * self._stride * comm.Get_size()
        path, error = None, None
        if comm.Get_rank() == 0:
            try:
                fd, path = tempfile.mkstemp(prefix="ringtrain-", dir=_DIRECTORY)
                try:
                    # Reserve the pages now: on a full tmpfs a sparse file fails later, in a
                    # write, with SIGBUS.
                    os.posix_fallocate(fd, 0, total)
                finally:
                    os.close(fd)
            except OSError as err:
                error = f"cannot create a {total}-byte file in {_DIRECTORY}: {err}"
        path, error = comm.bcast((path, error), root=0)
        self._map = None
        if error is None:
            try:
                with open(path, "r+b") as f:
                    self._map = mmap.mmap(f.fileno(), total)
            except OSError as err:
                error = f"rank {comm.Get_rank()} cannot map {path}: {err}"
        errors = [e for e in comm.allgather(error) if e is not None]
        if comm.Get_rank() == 0 and path is not None:
            os.unlink(path)  # every rank has it mapped or gave up: nothing is left behind
        self.available = not errors
        if errors:
            self._map = None
            if comm.Get_rank() == 0:
                sys.stderr.write(
                    f"ringtrain: warning: {errors[0]}; the ring on this host sends every "
                    "segment as an MPI message instead\n"
                )
        self._bytes = np.frombuffer(self._map, np.uint8) if self._map is not None else None
        self._views = {}  # (rank, half, dtype) -> the whole region as that dtype

    def region(self, rank: int, half: int, count: int, dtype) -> np.ndarray:
        """Return ``count`` elements of ``dtype`` at the start of ``rank``'s region ``half``."""
        key = (rank, half, dtype)
        view = self._views.get(key)
        if view is None:
            start = (2 * rank + half) * self._stride
            itemsize = np.dtype(dtype).itemsize
            view = self._bytes[start : start + self.capacity // itemsize * itemsize].view(dtype)
            self._views[key] = view
        return view[:count]


class SharedRing:
    """Ring collectives of one rank through ``regions`` (see the module docstring)."""

    def __init__(self, comm: MPI.Comm, regions: SharedRegions):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._regions = regions
        self._half = 0
        self._steps = schedule.ring_steps(self.rank, self.size, allgather=False)

    def fits(self, count: int, dtype) -> bool:
        """Return True if ``count`` elements of ``dtype`` fit a region."""
        return count * np.dtype(dtype).itemsize <= self._regions.capacity

    def run(self, backend, src, dst, op, postscale, bounds, allgather) -> int:
        """Reduce ``src`` into ``dst`` as ``Ring`` does; return when the reduce-scatter ended.

        ``dst[bounds[rank]]`` gets this rank's reduced segment; with ``allgather``, every
        segment. ``src`` may be ``dst``.
        """
        half, self._half = self._half, 1 - self._half
        regions = [self._regions.region(r, half, len(src), dst.dtype) for r in range(self.size)]
        mine, left = regions[self.rank], regions[(self.rank - 1) % self.size]
        steps = self._steps
        lo, hi = bounds[steps[0].send]
        mine[lo:hi] = src[lo:hi]
        barrier = self.comm.Barrier
        barrier()
        last = len(steps) - 1
        for t, step in enumerate(steps):
            lo, hi = bounds[step.recv]
            if t < last:
                backend.reduce(mine[lo:hi], src[lo:hi], left[lo:hi], op)
                barrier()
            elif allgather:
                backend.reduce(mine[lo:hi], src[lo:hi], left[lo:hi], op, postscale)
            else:
                backend.reduce(dst[lo:hi], src[lo:hi], left[lo:hi], op, postscale)
        reduced = time.perf_counter_ns()
        if allgather:
            barrier()  # every rank's finished segment is in its region
            for owner, (lo, hi) in enumerate(bounds):
                dst[lo:hi] = regions[owner][lo:hi]
        return reduced
