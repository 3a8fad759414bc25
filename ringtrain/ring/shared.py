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

An allreduce may also leave its result in the file's result area (``ringtrain.ring.results``),
where every rank writes its finished segment and then reads the whole result in place: no
allgather copies. It does so when every rank asked for a new, read-only result and holds
nothing at the call's place; each rank writes its vote beside the regions before the first
barrier, and after it every rank reads the same votes.
"""

import mmap
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from ringtrain.buffers import aligned_size
from ringtrain.ring import schedule
from ringtrain.ring.results import SharedResults

_DIRECTORY = "/dev/shm"


class SharedRegions:
    """One shared-memory file: two ``capacity``-byte regions per rank, votes, results.

    The result area has ``result_bytes``. Collective over ``comm``, whose ranks must share a
    host. ``available`` is False on every rank when some rank could not create or map the
    file; the reason is printed once.
    """

    def __init__(self, comm: MPI.Comm, capacity: int, result_bytes: int = 0):
        self.capacity = capacity
        self._stride = aligned_size(capacity)  # each region starts aligned
        size = comm.Get_size()
        votes_at = 2 * self._stride * size
        results_at = votes_at + aligned_size(2 * size)
        total = results_at + result_bytes
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
        self.votes = None  # [half, rank]: 1 where that rank may take the call's result place
        self.results = None
        if self._map is not None:
            self.votes = self._bytes[votes_at : votes_at + 2 * size].reshape(2, size)
            if result_bytes > 0:
                self.results = SharedResults(memoryview(self._map)[results_at:total])

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

    def run(self, backend, src, dst, op, postscale, bounds, allgather, new=None, read_only=False):
        """Reduce ``src`` into ``dst`` as ``Ring`` does; return the result and its time.

        The time is when the reduce-scatter ended. ``dst[bounds[rank]]`` gets this rank's
        reduced segment; with ``allgather``, every segment. ``src`` may be ``dst``. With
        ``dst`` None (an allgather only), the result is a new array: read-only in the result
        area if every rank passed ``read_only`` and can take it there (see the module
        docstring), else ``new(len(src))``.
        """
        half, self._half = self._half, 1 - self._half
        regions = [self._regions.region(r, half, len(src), src.dtype) for r in range(self.size)]
        mine, left = regions[self.rank], regions[(self.rank - 1) % self.size]
        steps = self._steps
        lo, hi = bounds[steps[0].send]
        mine[lo:hi] = src[lo:hi]
        results = self._regions.results
        vote = False
        if allgather and results is not None:
            place = results.place(src.nbytes)
            vote = (
                dst is None
                and read_only
                and place is not None
                and results.free_here(place, src.nbytes)
            )
            self._regions.votes[half, self.rank] = vote
        barrier = self.comm.Barrier
        barrier()
        # Every rank reads the same votes; one that voted no knows the outcome already.
        shared = vote and bool(self._regions.votes[half].all())
        if shared:
            dst = results.take(place, len(src), src.dtype)
        elif dst is None:
            dst = new(len(src))
        last = len(steps) - 1
        for t, step in enumerate(steps):
            lo, hi = bounds[step.recv]
            if t < last:
                backend.reduce(mine[lo:hi], src[lo:hi], left[lo:hi], op)
                barrier()
            elif allgather and not shared:
                backend.reduce(mine[lo:hi], src[lo:hi], left[lo:hi], op, postscale)
            else:
                backend.reduce(dst[lo:hi], src[lo:hi], left[lo:hi], op, postscale)
        reduced = time.perf_counter_ns()
        if allgather:
            barrier()  # every rank's finished segment is in its region, or in the result
            if shared:
                dst.flags.writeable = False
            else:
                for owner, (lo, hi) in enumerate(bounds):
                    dst[lo:hi] = regions[owner][lo:hi]
        return dst, reduced
