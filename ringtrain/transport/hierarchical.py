"""Hierarchical allreduce: reduce within each host, ring across hosts, broadcast within hosts.

Across hosts only one rank per host takes part, so the slow links between hosts carry
``2(h-1)/h`` of the data for ``h`` hosts, instead of the flat ring's ``2(p-1)/p`` for ``p``
ranks split over every link of the ring.

Every step is point-to-point messages in chunks (``messages.MessageTransport``): the ranks
of a host first run the ring among themselves, so that each holds the host's reduction; the
hosts' first ranks run the ring across hosts; each sends the result to the rest of its host
in chunks. Each wait is for one chunk, so a rank that sleeps between polls (``progress``)
slows a step by a sleep per chunk at most. MPI's non-blocking reduce and broadcast, which
this used before, move only while every rank polls them: with sleeping polls, 2 hosts of 2
ranks took 5 times as long for 16 MiB as with spinning ones.
"""

import time

from mpi4py import MPI

from ringtrain.ops import ReduceOp
from ringtrain.transport.local import copy_scaled
from ringtrain.transport.messages import MessageTransport
from ringtrain.transport.schedule import segment_bounds


class HierarchicalAllreduce:
    """The allreduce of one rank split by host (module docstring); built collectively."""

    def __init__(self, comm: MPI.Comm, topology, chunk_bytes: int, window_bytes: int, pool, waiter):
        rank = comm.Get_rank()
        self._host_count = topology.host_count
        local = comm.Split(color=topology.host, key=rank)
        self._local = MessageTransport(
            local, chunk_bytes, window_bytes, pool, waiter, topology.local_ranks()
        )
        is_leader = local.Get_rank() == 0
        cross = comm.Split(0 if is_leader else MPI.UNDEFINED, key=rank)
        self._across = None
        if is_leader:
            leaders = sorted(set(topology.hosts))
            self._across = MessageTransport(cross, chunk_bytes, window_bytes, pool, waiter, leaders)

    def allreduce(self, src, dst, op: ReduceOp, postscale: float, compression=None) -> int:
        """Reduce ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        ``compression`` (a 16-bit dtype, or None) applies to the ring across hosts only: the
        steps within each host stay in ``src``'s dtype. Returns the ``perf_counter_ns`` time
        at which the reduction across hosts ended.
        """
        local, across = self._local, self._across
        if local.size > 1:
            local.ring(src, dst, op, 1.0, segment_bounds(len(dst), local.size), True)
            src = dst
        if self._host_count == 1:  # every rank holds the whole reduction already
            copy_scaled(src, dst, postscale)
            return time.perf_counter_ns()
        if across is not None:
            bounds = segment_bounds(len(dst), across.size)
            reduced = across.ring(src, dst, op, postscale, bounds, True, compression)
        else:
            reduced = time.perf_counter_ns()
        if local.size > 1:
            local.broadcast_chunks(dst, 0)
        return reduced

    def free(self) -> None:
        """Free the per-host and across-host communicators."""
        if self._across is not None:
            self._across.comm.Free()
        self._local.comm.Free()
