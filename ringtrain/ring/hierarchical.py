"""Hierarchical allreduce: reduce within each host, ring across hosts, broadcast within hosts.

Across hosts only one rank per host takes part, so the slow links between hosts carry
``2(h-1)/h`` of the data for ``h`` hosts, instead of the flat ring's ``2(p-1)/p`` for ``p``
ranks split over every link of the ring.
"""

import time

from mpi4py import MPI

from ringtrain.ops import ReduceOp
from ringtrain.ring.collective import Ring

_MPI_OPS = {
    ReduceOp.Sum: MPI.SUM,
    ReduceOp.Min: MPI.MIN,
    ReduceOp.Max: MPI.MAX,
    ReduceOp.Product: MPI.PROD,
}


class HierarchicalRing:
    """Ring collectives of one rank, with allreduce split by host; see the module docstring."""

    def __init__(self, comm: MPI.Comm, topology, chunk_bytes: int, pool):
        self.flat = Ring(comm, chunk_bytes, pool)
        self._local = comm.Split(color=topology.host, key=comm.Get_rank())
        is_leader = self._local.Get_rank() == 0
        cross = comm.Split(0 if is_leader else MPI.UNDEFINED, key=comm.Get_rank())
        self._across = Ring(cross, chunk_bytes, pool) if is_leader else None

    def allreduce(self, src, dst, op: ReduceOp, postscale: float = 1.0) -> int:
        """Reduce ``src`` over all ranks into ``dst`` (may be ``src``), like ``Ring.allreduce``."""
        mpi_op = _MPI_OPS[op]
        if self._across is not None:
            self._local.Reduce(MPI.IN_PLACE if src is dst else src, dst, mpi_op, root=0)
            reduced = self._across.allreduce(dst, dst, op, postscale)
        else:
            self._local.Reduce(src, None, mpi_op, root=0)
            reduced = time.perf_counter_ns()
        self._local.Bcast(dst, root=0)
        return reduced

    def allreduce_new(self, src, op: ReduceOp, postscale: float, new, read_only: bool):
        """Reduce ``src`` into ``new(len(src))``; return it and the time, as ``Ring``'s does.

        Results are never shared here: ranks on several hosts cannot share memory.
        """
        result = new(len(src))
        return result, self.allreduce(src, result, op, postscale)

    def reduce_scatter(self, src, dst, op, postscale, bounds) -> int:
        """Run the flat ring's reduce-scatter: each rank keeps its own share anyway."""
        return self.flat.reduce_scatter(src, dst, op, postscale, bounds)

    def free(self) -> None:
        """Free the per-host and across-host communicators."""
        if self._across is not None:
            self._across.comm.Free()
        self._local.Free()
