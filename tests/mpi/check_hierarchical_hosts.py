"""The hierarchical allreduce on pretend hosts: every dtype and op against NumPy.

The ranks are split into hosts (``common.pretend_hosts``), so one machine runs the paths
that split work by host: -np 4 (2 hosts of 2) and -np 6 (2 hosts of 3) give each rank a
segment that it reduces from its host's ranks chunk by chunk and carries across hosts;
-np 3 (hosts of 2 and 1) goes through each host's first rank; -np 2 (hosts of 1) is the
ring across hosts alone. 256-byte chunks, so the
pieces within a host and the rings across hosts run in many chunks. In place and not. At
-np 4 and 6, float32 calls just below and above the size that goes through each host's
first rank even where the hosts are of one size, in 256 KiB chunks.
16-bit floats are widened by the engine before they reach a transport, so they are left out.
"""

import numpy as np
from common import DTYPES, OPS, assert_equal, expected, main, pretend_hosts, rank_data
from mpi4py import MPI

from ringtrain import settings
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.transport.choice import LEADERS_FROM_BYTES
from ringtrain.transport.router import Transport


def body():
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    topology = pretend_hosts(comm, {2: 1, 6: 3}.get(n, 2))
    chosen = settings.read(hierarchical_allreduce=True, ring_chunk_bytes=256)
    transport = Transport(comm, topology, chosen, BufferPool())
    assert transport.capabilities.hierarchical
    for dtype in [d for d in DTYPES if np.dtype(d).kind in "iu" or np.dtype(d).itemsize > 2]:
        for op in OPS:
            reduce_op, postscale = (ReduceOp.Sum, 1 / n) if op is ReduceOp.Average else (op, 1.0)
            if np.dtype(dtype).kind in "iu" and postscale != 1.0:
                continue  # integer averages go through the engine's own division
            for length in (0, 1, 5, 1001, 4099):
                data = [rank_data(i, (length,), dtype, salt=length) for i in range(n)]
                want = expected(op, data, dtype)
                what = f"{np.dtype(dtype).name} {op.name} {length} on {n} ranks"
                got = np.empty(length, dtype)
                transport.allreduce(data[r], got, reduce_op, postscale)
                assert_equal(got, want, what)
                in_place = data[r].copy()
                transport.allreduce(in_place, in_place, reduce_op, postscale)
                assert_equal(in_place, want, f"{what}, in place")
    transport.free()
    if n in (4, 6):  # hosts of one size, several ranks each: where choice.through_leaders applies
        _either_side_of_the_leaders_threshold(comm, topology)


def _either_side_of_the_leaders_threshold(comm, topology):
    """Check Sum calls just below and from choice.LEADERS_FROM_BYTES, the first ranks' side."""
    r, n = comm.Get_rank(), comm.Get_size()
    chosen = settings.read(hierarchical_allreduce=True, ring_chunk_bytes=256 << 10)
    transport = Transport(comm, topology, chosen, BufferPool())
    for length in (LEADERS_FROM_BYTES // 4 - 1, LEADERS_FROM_BYTES // 4 + 5):
        data = [rank_data(i, (length,), np.float32, salt=length) for i in range(n)]
        want = expected(ReduceOp.Sum, data, np.float32)
        got = np.empty(length, np.float32)
        transport.allreduce(data[r], got, ReduceOp.Sum, 1.0)
        assert_equal(got, want, f"float32 Sum {length} on {n} ranks")
        transport.allreduce(data[r], data[r], ReduceOp.Sum, 1.0)
        assert_equal(data[r], want, f"float32 Sum {length} on {n} ranks, in place")
    transport.free()


main(body)
