"""Hierarchical allreduce: reduce within each host, ring across hosts, broadcast within hosts.

Across hosts only one rank per host takes part, so the slow links between hosts carry
``2(h-1)/h`` of the data for ``h`` hosts, instead of the flat ring's ``2(p-1)/p`` for ``p``
ranks split over every link of the ring.
"""

import time

from mpi4py import MPI

from ringtrain.ops import ReduceOp
from ringtrain.transport.local import copy_scaled
from ringtrain.transport.messages import MessageTransport
from ringtrain.transport.schedule import segment_bounds

_MPI_OPS = {
    ReduceOp.Sum: MPI.SUM,
    ReduceOp.Min: MPI.MIN,
    ReduceOp.Max: MPI.MAX,
    ReduceOp.Product: MPI.PROD,
}


class HierarchicalAllreduce:
    """The allreduce of one rank split by host (module docstring); built collectively."""

    def __init__(self, comm: MPI.Comm, topology, chunk_bytes: int, window_bytes: int, pool, waiter):
        rank = comm.Get_rank()
        self._local = comm.Split(color=topology.host, key=rank)
        self._local_ranks = topology.local_ranks()
        self._waiter = waiter
        is_leader = self._local.Get_rank() == 0
        cross = comm.Split(0 if is_leader else MPI.UNDEFINED, key=rank)
        self._across = None
        if is_leader:
            leaders = sorted(set(topology.hosts))
            self._across = MessageTransport(cross, chunk_bytes, window_bytes, pool, waiter, leaders)

    def allreduce(self, src, dst, op: ReduceOp, postscale: float, compression=None) -> int:
        """Reduce ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        ``compression`` (a 16-bit dtype, or None) applies to the ring across hosts only: the
        reduce and broadcast within each host stay in ``src``'s dtype. Returns the
        ``perf_counter_ns`` time at which the reduction across hosts ended.
        """
        mpi_op = _MPI_OPS[op]
        across = self._across
        wait, what = self._waiter.wait, f"a hierarchical allreduce of {src.nbytes} bytes"
        if across is not None:
            send = MPI.IN_PLACE if src is dst else src
            wait(self._local.Ireduce(send, dst, mpi_op, root=0), self._local_ranks, what)
            if across.size > 1:
                bounds = segment_bounds(len(dst), across.size)
                reduced = across.ring(dst, dst, op, postscale, bounds, True, compression)
            else:
                copy_scaled(dst, dst, postscale)
                reduced = time.perf_counter_ns()
        else:
            wait(self._local.Ireduce(src, None, mpi_op, root=0), self._local_ranks, what)
            reduced = time.perf_counter_ns()
        wait(self._local.Ibcast(dst, root=0), self._local_ranks, what)
        return reduced

    def free(self) -> None:
        """Free the per-host and across-host communicators."""
        if self._across is not None:
            self._across.comm.Free()
        self._local.Free()
