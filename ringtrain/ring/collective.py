"""Ring allreduce and reduce-scatter over an mpi4py communicator, chunked and pipelined.

Only buffer (uppercase) calls are used: tensor data is never pickled. Each segment is cut
into chunks; a chunk is forwarded to the right neighbour as soon as it has been received and
reduced, while the next chunks are still in flight, so sending one piece overlaps reducing
the previous one. Receives are posted ahead into a few reused scratch slots.

When every rank is on one host, host calls of more than 2 MiB take the ring of
``ringtrain.ring.attach`` where the kernel allows it and the host has a core for every rank,
and smaller ones (or any that fit the regions, where either does not hold) the
shared-memory ring of ``ringtrain.ring.shared``; calls too large for the regions take the
attach ring wherever the kernel allows it.
"""

import functools
import os
import time
from collections import deque

import numpy as np
from mpi4py import MPI

from ringtrain import kernels
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.ring import schedule
from ringtrain.ring.attach import AttachRing
from ringtrain.ring.shared import SharedRegions, SharedRing

_TAG = 7
_WINDOW = 4  # receives posted ahead of the one being reduced
# Host calls of more than this many bytes read peers' buffers in place where the kernel lets
# them, even when they fit the shared-memory regions, if every rank can have a core of its
# own. Through the engine at -np 2 on 2 cores that ring was 10% faster at 3 MiB and 17% at
# 4 MiB, level at 2 MiB, and slower at 1 MiB, where the ranks' skew costs it more; at -np 4
# on 2 cores it was 8-24% slower at 3 and 4 MiB, since it waits for every rank at the end of
# a call (docs/benchmarks.md).
ATTACH_ABOVE_BYTES = 2 << 20


class Ring:
    """The ring collectives of one rank over ``comm`` (a private communicator).

    Built collectively over ``comm``. With ``shared_bytes`` and ``one_host`` (every rank of
    ``comm`` on one host: ``Topology.one_host``, the same on every rank), calls
    of up to that many bytes go through shared memory (``ringtrain.ring.shared``), and
    ``result_bytes`` of it can hold results that the ranks share (``allreduce_new``); host
    calls of more than ``ATTACH_ABOVE_BYTES`` (where the host has a core for every rank),
    and larger ones, read peers' buffers in place instead (``ringtrain.ring.attach``) where
    the kernel lets every rank do so.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        chunk_bytes: int,
        pool: BufferPool | None = None,
        shared_bytes: int = 0,
        result_bytes: int = 0,
        one_host: bool = False,
    ):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.chunk_bytes = chunk_bytes
        self._pool = pool or BufferPool()
        self._right = (self.rank + 1) % self.size
        self._left = (self.rank - 1) % self.size
        self.shared = None
        self.attach = None
        self._attach_above = None  # bytes above which calls that fit the regions read in place
        if shared_bytes > 0 and self.size > 1 and one_host:
            regions = SharedRegions(comm, shared_bytes, result_bytes)
            if regions.available:
                self.shared = SharedRing(comm, regions)
                self.attach = AttachRing.create(comm, regions, self._pool)
                cores = comm.allreduce(os.cpu_count() or 1, op=MPI.MIN)
                if self.attach is not None and self.size <= cores:
                    self._attach_above = ATTACH_ABOVE_BYTES

    def allreduce(self, src, dst, op: ReduceOp, postscale: float = 1.0) -> int:
        """Reduce 1-D ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        Every rank must call this with the same length, dtype and op. Every rank ends with
        bitwise-identical ``dst``. Returns the ``perf_counter_ns`` time at which this rank's
        reduce-scatter part ended (the allgather part overlaps its tail).
        """
        bounds = _even_bounds(len(src), self.size)
        return self._run(src, dst, op, postscale, bounds, allgather=True)

    def allreduce_new(self, src, op: ReduceOp, postscale: float, new, read_only: bool):
        """Reduce 1-D ``src`` as ``allreduce`` does, into a new array; return it and the time.

        The result is ``new(len(src))``, or, when every rank passes ``read_only`` and the
        call runs through either ring of the host, a read-only array that its ranks share.
        """
        bounds = _even_bounds(len(src), self.size)
        if self._through_shared(src):
            return self.shared.run(src, None, op, postscale, bounds, True, new, read_only)
        if len(src) > 0 and self._through_attach(src):
            call = self.shared.take_call()
            return self.attach.run(src, None, op, postscale, bounds, True, call, new, read_only)
        result = new(len(src))
        return result, self._run(src, result, op, postscale, bounds, allgather=True)

    def reduce_scatter(self, src, dst, op: ReduceOp, postscale: float, bounds) -> None:
        """Reduce ``src`` over all ranks; afterwards ``dst[bounds[rank]]`` holds this rank's part.

        ``bounds`` lists each rank's (start, stop) range and must be the same on every rank;
        the rest of ``dst`` is left with partial results.
        """
        self._run(src, dst, op, postscale, bounds, allgather=False)

    def _run(self, src, dst, op, postscale, bounds, allgather):
        backend = kernels.backend_for(dst)
        if self.size == 1 or len(src) == 0:
            if len(src) and (src is not dst or postscale != 1.0):
                backend.pack([src], dst, [0], postscale)
            return time.perf_counter_ns()
        if self._through_shared(src):
            return self.shared.run(src, dst, op, postscale, bounds, allgather)[1]
        if self._through_attach(src) and _host_contiguous(dst):
            call = self.shared.take_call()
            return self.attach.run(src, dst, op, postscale, bounds, allgather, call)[1]
        steps = schedule.ring_steps(self.rank, self.size, allgather)
        chunk = max(1, self.chunk_bytes // dst.itemsize)
        last_reduce = self.size - 2
        recvs = [
            (t, lo, hi)
            for t, step in enumerate(steps)
            for lo, hi in schedule.chunks(*bounds[step.recv], chunk)
        ]
        stride = min(chunk, len(src))
        scratch = self._pool.get("ring-scratch", _WINDOW * stride, dst.dtype)
        comm, right, left = self.comm, self._right, self._left
        # Sends whose source region a later allgather receive overwrites must finish before
        # that receive is posted: reduce-scatter forwards, and the first sends when the data
        # is reduced in place.
        first_sends = [
            comm.Isend(src[lo:hi], right, _TAG)
            for lo, hi in schedule.chunks(*bounds[steps[0].send], chunk)
        ]
        in_place = np.may_share_memory(src, dst)
        hazard_sends = first_sends if in_place else []
        final_sends = [] if in_place else first_sends
        posted = deque()
        next_recv = 0

        def post_ahead():
            nonlocal next_recv, hazard_sends
            while next_recv < len(recvs) and len(posted) < _WINDOW:
                t, lo, hi = recvs[next_recv]
                if steps[t].reduce:
                    slot = (next_recv % _WINDOW) * stride
                    target = scratch[slot : slot + hi - lo]
                else:
                    if hazard_sends:
                        MPI.Request.Waitall(hazard_sends)
                        hazard_sends = []
                    target = dst[lo:hi]
                posted.append((comm.Irecv(target, left, _TAG), t, lo, hi, target))
                next_recv += 1

        post_ahead()
        reduce_scatter_end = time.perf_counter_ns()
        while posted:
            request, t, lo, hi, target = posted.popleft()
            request.Wait()
            if steps[t].reduce:
                scale = postscale if t == last_reduce else 1.0
                backend.reduce(dst[lo:hi], src[lo:hi], target, op, scale)
                reduce_scatter_end = time.perf_counter_ns()
            if t + 1 < len(steps):
                sends = hazard_sends if t < last_reduce else final_sends
                sends.append(comm.Isend(dst[lo:hi], right, _TAG))
            post_ahead()
        MPI.Request.Waitall(hazard_sends + final_sends)
        return reduce_scatter_end

    def _through_attach(self, src) -> bool:
        # Peers read this rank's buffers by address: host memory (NumPy arrays; device
        # arrays are not), contiguous. Where the result goes is checked apart: a new one is.
        return (
            self.attach is not None
            and _host_contiguous(src)
            and self.attach.fits(len(src), src.itemsize)
        )

    def _through_shared(self, src) -> bool:
        if self.shared is None or len(src) == 0 or not self.shared.fits(len(src), src.dtype):
            return False
        above = self._attach_above
        return above is None or src.nbytes <= above or not self._through_attach(src)


def _host_contiguous(array) -> bool:
    """Return True for a C-contiguous NumPy array, which a peer can read by its address."""
    return isinstance(array, np.ndarray) and array.flags.c_contiguous


@functools.lru_cache(maxsize=256)
def _even_bounds(length, size):
    """Return ``schedule.segment_bounds(length, size)``, kept for the lengths seen lately."""
    return tuple(schedule.segment_bounds(length, size))
