"""The transport seam: the one object through which an engine moves tensor data.

``Transport`` offers every collective the engine runs (allreduce, reduce-scatter,
allgather, broadcast, alltoall, Adasum) over one private communicator. Each method builds
its call (``calls``), the pure rule ``ringtrain.transport.choice.choose`` picks its route
once, and the route object (``routes``) carries it: MPI messages, the host's shared-memory
ring, the ring that reads peers' memory in place, the hierarchical composition, or, for
GPU memory, a copy through the host and back, or MPI itself where it is CUDA-aware.
"""

import dataclasses
import functools
import os

import numpy as np
from mpi4py import MPI

from ringtrain.buffers import BufferPool
from ringtrain.kernels import is_device_array
from ringtrain.ops import ReduceOp
from ringtrain.transport import schedule
from ringtrain.transport.attach import AttachRing
from ringtrain.transport.calls import Adasum, Allgather, Alltoall, Broadcast, Carried, Reduce
from ringtrain.transport.choice import (
    Capabilities,
    Collective,
    Route,
    choose,
    hierarchical_wanted,
)
from ringtrain.transport.device_mpi import takes_device_memory
from ringtrain.transport.hierarchical import HierarchicalAllreduce
from ringtrain.transport.link_chunk import LinkChunkChoice
from ringtrain.transport.messages import MessageTransport
from ringtrain.transport.progress import Waiter
from ringtrain.transport.routes import (
    AttachRoute,
    DeviceRoute,
    HierarchicalRoute,
    LocalRoute,
    MessagesRoute,
    SharedRoute,
    StagedRoute,
)
from ringtrain.transport.shared import SharedRegions, SharedRing

_ALLREDUCE = Collective.ALLREDUCE
_REDUCE_SCATTER = Collective.REDUCE_SCATTER
_CROSSING = frozenset({Route.MESSAGES, Route.HIERARCHICAL})  # rings whose chunk is tried


class Transport:
    """Every collective of one rank over a duplicate of ``comm``; see the module docstring.

    Built collectively over ``comm``, whose ``topology`` it is. How calls run must match on
    every rank, so rank 0's ``settings`` (ring chunk, its trial and window, shared-memory sizes,
    hierarchical, the collective timeout, autotune) win. ``pool`` holds the scratch buffers.
    Under autotune, ``retune`` switches the ring chunk and hierarchical or flat between calls;
    the chunk trial across hosts is then off, unless the user set the chunk.
    """

    def __init__(self, comm: MPI.Comm, topology, settings, pool: BufferPool):
        comm = self._comm = comm.Dup()  # tensor data never shares a channel with the user's
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        hierarchical = hierarchical_wanted(
            settings.hierarchical_allreduce, topology.host_count, topology.most_per_host
        )
        both_ways = topology.host_count > 1 and topology.most_per_host > 1
        user_set = settings.user_set
        switchable = settings.autotune and both_ways and "hierarchical_allreduce" not in user_set
        trial = settings.ring_chunk_trial and not (
            settings.autotune and "ring_chunk_bytes" not in user_set
        )
        agreed = comm.bcast(
            (
                settings.ring_chunk_bytes,
                trial,
                settings.ring_window_bytes,
                settings.shared_memory_bytes,
                settings.shared_result_bytes,
                hierarchical,
                switchable,
                settings.collective_timeout,
                settings.cuda_aware_mpi,
                settings.cache_capacity,
            ),
            root=0,
        )
        (
            chunk,
            trial,
            window,
            shared_bytes,
            result_bytes,
            hierarchical,
            switchable,
            timeout,
            cuda_aware,
            cache_capacity,
        ) = agreed
        # Rank 0's, as the timeout: every rank's agreement rounds carry as many slots.
        self.cache_capacity = cache_capacity
        self.hierarchical_switchable = switchable
        self.chunk_bytes = chunk
        self.waiter = Waiter(timeout, topology)
        everyone = range(self.size)
        self.messages = MessageTransport(comm, chunk, window, pool, self.waiter, everyone)
        self.hierarchical = None
        self.shared = None
        self.attach = None
        if hierarchical or switchable:
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
        # Rank 0's setting, or each rank's library asked: one rank that cannot take device
        # memory stages every rank's calls, which must all take the same route.
        device_mpi = takes_device_memory(cuda_aware)
        device_mpi = self.size > 1 and bool(comm.allreduce(int(device_mpi), op=MPI.MIN))
        self.capabilities = Capabilities(
            size=self.size,
            shared_bytes=shared_bytes if self.shared is not None else 0,
            attach_below=self.attach.limit_bytes if self.attach is not None else 0,
            core_each=self.size <= cores,
            hierarchical=hierarchical,
            across_hosts=not topology.one_host,
            device_mpi=device_mpi,
        )
        self._routes = self._build_routes()

    def _build_routes(self) -> dict:
        """Return the route object of every ``choice.Route`` this job can take."""
        routes = {
            Route.LOCAL: LocalRoute(),
            Route.MESSAGES: MessagesRoute(self.messages),
            Route.RING: MessagesRoute(self.messages, ring_allgather=True),
            Route.STAGED: StagedRoute(self.run),
        }
        if self.capabilities.device_mpi:
            routes[Route.DEVICE] = DeviceRoute(self._comm, self.waiter)
        if self.hierarchical is not None:
            routes[Route.HIERARCHICAL] = HierarchicalRoute(self.hierarchical)
        if self.shared is not None:
            routes[Route.SHARED] = SharedRoute(self.shared)
        if self.attach is not None:
            routes[Route.ATTACH] = AttachRoute(self.shared, self.attach)
        return routes

    def retune(self, chunk_bytes: int, hierarchical: bool) -> None:
        """Cut rings at ``chunk_bytes`` from the next call; split by host or not where both work.

        Every rank calls it alike, between two calls (``engine.tuning``).
        """
        self.chunk_bytes = chunk_bytes
        rings = [self.messages, *(self.hierarchical.rings() if self.hierarchical else ())]
        for ring in rings:
            ring.chunk_bytes = ring.link_chunk_bytes = chunk_bytes
        if self.hierarchical_switchable and hierarchical != self.capabilities.hierarchical:
            self.capabilities = dataclasses.replace(self.capabilities, hierarchical=hierarchical)

    def link_rate(self) -> float | None:
        """Return the bytes per second this rank last sent across hosts at (None: unmeasured)."""
        if self.capabilities.across_hosts and self.capabilities.hierarchical:
            across = self.hierarchical.across
            return across.link_rate if across is not None else None
        return self.messages.link_rate if self.capabilities.across_hosts else None

    def allreduce(self, src, dst, op: ReduceOp, postscale: float = 1.0, codec=None) -> int:
        """Reduce 1-D ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        Every rank must call this with the same length, dtype, op and ``codec``: None, or
        the ``codec.WireCodec`` that a float32 reduction's partial sums cross the link
        through. Every rank ends with bitwise-identical ``dst``. Returns the
        ``perf_counter_ns`` time at which this rank's reduce-scatter part ended (the
        allgather part overlaps its tail).
        """
        bounds = _even_bounds(len(src), self.size)
        return self.run(Reduce(_ALLREDUCE, src, dst, op, postscale, bounds, codec))[1]

    def allreduce_new(self, src, op: ReduceOp, postscale: float, new, read_only: bool, codec=None):
        """Reduce 1-D ``src`` as ``allreduce`` does, into a new array; return it and the time.

        The result is ``new(len(src))``, or, when every rank passes ``read_only`` and the
        call runs through either ring of the host, a read-only array that its ranks share.
        """
        bounds = _even_bounds(len(src), self.size)
        call = Reduce(_ALLREDUCE, src, None, op, postscale, bounds, codec, new, read_only)
        return self.run(call)

    def reduce_scatter(self, src, dst, op: ReduceOp, postscale: float, bounds) -> int:
        """Reduce ``src`` over all ranks; afterwards ``dst[bounds[rank]]`` holds this rank's part.

        ``bounds`` lists each rank's (start, stop) range and must be the same on every rank;
        the rest of ``dst`` is left with partial results. Returns the time it ended.
        """
        return self.run(Reduce(_REDUCE_SCATTER, src, dst, op, postscale, bounds))[1]

    def allgatherv(self, send, recv, counts, displacements) -> None:
        """Gather every rank's bytes ``send`` into ``recv``: rank r's at ``displacements[r]``."""
        self.run(Allgather(send, recv, counts, displacements))

    def broadcast(self, buffer, root: int) -> None:
        """Overwrite the bytes ``buffer`` on every rank with ``root``'s."""
        self.run(Broadcast(buffer, root))

    def alltoallv(self, send, sent, recv, got) -> None:
        """Send ``sent[r]`` bytes of ``send`` to rank r, and take ``got[r]`` bytes from it."""
        self.run(Alltoall(send, sent, recv, got))

    def adasum(self, vector, scratch) -> None:
        """Combine every rank's ``vector`` by Adasum, in place; ``scratch`` is as large."""
        self.run(Adasum(vector, scratch))

    def run(self, call) -> Carried:
        """Carry ``call`` (``calls``) by the one route that the rule picks for it."""
        if type(call) is not Reduce:
            route = choose(call.collective, call.nbytes, False, self.capabilities)
            return self._routes[route].run(call)
        src, dst, codec = call.src, call.dst, call.codec
        device = type(src) is not np.ndarray and is_device_array(src)
        host = not device and _host_contiguous(src) and (dst is None or _host_contiguous(dst))
        compressed, nbytes = codec is not None, call.nbytes
        route = choose(call.collective, nbytes, host, self.capabilities, compressed, device)
        carrier = self._routes[route]
        if self.link_chunks is None or route not in _CROSSING:  # one host, or no trial
            return carrier.run(call)
        trial = call.collective is _ALLREDUCE and not compressed  # compressed: the chunk stays
        return self.link_chunks.run(nbytes, lambda: carrier.run(call), trial)

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
