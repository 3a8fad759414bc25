"""The transport seam: the one object through which an engine moves tensor data.

``Transport`` offers every collective the engine runs (allreduce, reduce-scatter,
allgather, broadcast, alltoall, Adasum) over one private communicator, and carries each
call by the route that the pure rule ``ringtrain.transport.choice.choose`` picks: MPI
messages, the host's shared-memory ring, the ring that reads peers' memory in place, or
the hierarchical composition.
"""

import functools
import os
import time

import numpy as np
from mpi4py import MPI

from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.transport import schedule
from ringtrain.transport.attach import AttachRing
from ringtrain.transport.choice import (
    Capabilities,
    Collective,
    Route,
    choose,
    hierarchical_wanted,
)
from ringtrain.transport.hierarchical import HierarchicalAllreduce
from ringtrain.transport.link_chunk import LinkChunkChoice
from ringtrain.transport.local import copy_scaled
from ringtrain.transport.messages import MessageTransport
from ringtrain.transport.progress import Waiter
from ringtrain.transport.shared import SharedRegions, SharedRing

_ALLREDUCE = Collective.ALLREDUCE
_REDUCE_SCATTER = Collective.REDUCE_SCATTER


class Transport:
    """Every collective of one rank over a duplicate of ``comm``; see the module docstring.

    Built collectively over ``comm``, whose ``topology`` it is. How calls run must match on
    every rank, so rank 0's ``settings`` (ring chunk, its trial and window, shared-memory sizes,
    hierarchical, the collective timeout) win. ``pool`` holds the scratch buffers.
    """

    def __init__(self, comm: MPI.Comm, topology, settings, pool: BufferPool):
        comm = self._comm = comm.Dup()  # tensor data never shares a channel with the user's
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        hierarchical = hierarchical_wanted(
            settings.hierarchical_allreduce, topology.host_count, topology.most_per_host
        )
        chunk, trial, window, shared_bytes, result_bytes, hierarchical, timeout = comm.bcast(
            (
                settings.ring_chunk_bytes,
                settings.ring_chunk_trial,
                settings.ring_window_bytes,
                settings.shared_memory_bytes,
                settings.shared_result_bytes,
                hierarchical,
                settings.collective_timeout,
            ),
            root=0,
        )
        self.chunk_bytes = chunk
        self.waiter = Waiter(timeout, topology)
        everyone = range(self.size)
        self.messages = MessageTransport(comm, chunk, window, pool, self.waiter, everyone)
        self.hierarchical = None
        self.shared = None
        self.attach = None
        if hierarchical:
            self.hierarchical = HierarchicalAllreduce(
                comm, topology, chunk, window, pool, self.waiter
            )
        elif shared_bytes > 0 and self.size > 1 and topology.one_host:
            regions = SharedRegions(comm, shared_bytes, result_bytes)
            if regions.available:
                self.shared = SharedRing(comm, regions, self.waiter)
                self.attach = AttachRing.create(comm, regions, pool, self.waiter)
        self.link_chunks = None  # one host, where no ring crosses a link, or no trial
        if trial and not topology.one_host:
            across = self.hierarchical.across if self.hierarchical is not None else None
            crossing = [self.messages, across]
            self.link_chunks = LinkChunkChoice(comm, self.waiter, chunk, crossing)
        cores = comm.allreduce(os.cpu_count() or 1, op=MPI.MIN) if self.attach else 0
        self.capabilities = Capabilities(
            size=self.size,
            shared_bytes=shared_bytes if self.shared is not None else 0,
            attach_below=self.attach.limit_bytes if self.attach is not None else 0,
            core_each=self.size <= cores,
            hierarchical=hierarchical,
            across_hosts=not topology.one_host,
        )

    def allreduce(self, src, dst, op: ReduceOp, postscale: float = 1.0, compression=None) -> int:
        """Reduce 1-D ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        Every rank must call this with the same length, dtype, op and ``compression``: None,
        or the 16-bit dtype (float16, bfloat16) that a float32 reduction's partial sums
        cross the link in. Every rank ends with bitwise-identical ``dst``. Returns the
        ``perf_counter_ns`` time at which this rank's reduce-scatter part ended (the
        allgather part overlaps its tail).
        """
        bounds = _even_bounds(len(src), self.size)
        return self._reduce(_ALLREDUCE, src, dst, op, postscale, bounds, compression)

    def allreduce_new(
        self, src, op: ReduceOp, postscale: float, new, read_only: bool, compression=None
    ):
        """Reduce 1-D ``src`` as ``allreduce`` does, into a new array; return it and the time.

        The result is ``new(len(src))``, or, when every rank passes ``read_only`` and the
        call runs through either ring of the host, a read-only array that its ranks share.
        """
        host = _host_contiguous(src)
        route = choose(_ALLREDUCE, src.nbytes, host, self.capabilities, compression is not None)
        bounds = _even_bounds(len(src), self.size)
        if route is Route.SHARED:
            return self.shared.run(src, None, op, postscale, bounds, True, new, read_only)
        if route is Route.ATTACH:
            call = self.shared.take_call()
            return self.attach.run(src, None, op, postscale, bounds, True, call, new, read_only)
        result = new(len(src))
        return result, self._reduce(_ALLREDUCE, src, result, op, postscale, bounds, compression)

    def reduce_scatter(self, src, dst, op: ReduceOp, postscale: float, bounds) -> int:
        """Reduce ``src`` over all ranks; afterwards ``dst[bounds[rank]]`` holds this rank's part.

        ``bounds`` lists each rank's (start, stop) range and must be the same on every rank;
        the rest of ``dst`` is left with partial results. Returns the time it ended.
        """
        return self._reduce(_REDUCE_SCATTER, src, dst, op, postscale, bounds)

    def _reduce(self, collective, src, dst, op, postscale, bounds, compression=None) -> int:
        host = _host_contiguous(src) and _host_contiguous(dst)
        route = choose(collective, src.nbytes, host, self.capabilities, compression is not None)
        allgather = collective is _ALLREDUCE
        if route is Route.LOCAL:
            copy_scaled(src, dst, postscale)
            return time.perf_counter_ns()
        if route is Route.SHARED:
            return self.shared.run(src, dst, op, postscale, bounds, allgather)[1]
        if route is Route.ATTACH:
            call = self.shared.take_call()
            return self.attach.run(src, dst, op, postscale, bounds, allgather, call)[1]
        if route is Route.HIERARCHICAL:
            call = functools.partial(
                self.hierarchical.allreduce, src, dst, op, postscale, compression
            )
        else:
            call = functools.partial(
                self.messages.ring, src, dst, op, postscale, bounds, allgather, compression
            )
        if self.link_chunks is None:  # one host, or the trial turned off
            return call()
        trial = allgather and compression is None  # a compressed ring keeps its chunk
        return self.link_chunks.run(src.nbytes, call, trial)

    def allgatherv(self, send, recv, counts, displacements) -> None:
        """Gather every rank's bytes ``send`` into ``recv``: rank r's at ``displacements[r]``."""
        if choose(Collective.ALLGATHER, recv.nbytes, False, self.capabilities) is Route.RING:
            self.messages.allgatherv_ring(send, recv, counts, displacements)
        else:
            self.messages.allgatherv(send, recv, counts, displacements)

    def broadcast(self, buffer, root: int) -> None:
        """Overwrite the bytes ``buffer`` on every rank with ``root``'s."""
        self.messages.broadcast(buffer, root)

    def alltoallv(self, send, sent, recv, got) -> None:
        """Send ``sent[r]`` bytes of ``send`` to rank r, and take ``got[r]`` bytes from it."""
        self.messages.alltoallv(send, sent, recv, got)

    def adasum(self, vector, scratch) -> None:
        """Combine every rank's ``vector`` by Adasum, in place; ``scratch`` is as large."""
        self.messages.adasum(vector, scratch)

    def free(self) -> None:
        """Free the communicators this transport made (not the one it was given)."""
        if self.hierarchical is not None:
            self.hierarchical.free()
        self._comm.Free()


def _host_contiguous(array) -> bool:
    """Return True for a C-contiguous NumPy array, which a peer can read by its address."""
    return isinstance(array, np.ndarray) and array.flags.c_contiguous


@functools.lru_cache(maxsize=256)
def _even_bounds(length, size):
    """Return ``schedule.segment_bounds(length, size)``, kept for the lengths seen lately."""
    return tuple(schedule.segment_bounds(length, size))
