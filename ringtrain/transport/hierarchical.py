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

    def __init__(self, comm: MPI.Comm, topology, chunk_bytes: int, pool):
        self._local = comm.Split(color=topology.host, key=comm.Get_rank())
        is_leader = self._local.Get_rank() == 0
        cross = comm.Split(0 if is_leader else MPI.UNDEFINED, key=comm.Get_rank())
        self._across = MessageTransport(cross, chunk_bytes, pool) if is_leader else None

    def allreduce(self, src, dst, op: ReduceOp, postscale: float) -> int:
        """Reduce ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        Returns the ``perf_counter_ns`` time at which the reduction across hosts ended.
        """
        mpi_op = _MPI_OPS[op]
        across = self._across
        if across is not None:
            self._local.Reduce(MPI.IN_PLACE if src is dst else src, dst, mpi_op, root=0)
            if across.size > 1:
                bounds = segment_bounds(len(dst), across.size)
                reduced = across.ring(dst, dst, op, postscale, bounds, allgather=True)
            else:
                copy_scaled(dst, dst, postscale)
                reduced = time.perf_counter_ns()
        else:
            self._local.Reduce(src, None, mpi_op, root=0)
            reduced = time.perf_counter_ns()
        self._local.Bcast(dst, root=0)
        return reduced

    def free(self) -> None:
        """Free the per-host and across-host communicators."""
        if self._across is not None:
            self._across.comm.Free()
        self._local.Free()
