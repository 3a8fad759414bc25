"""Where the kernel forbids reading a rank's memory, large calls go as MPI messages.

The last rank makes itself non-dumpable, and the job runs without CAP_SYS_PTRACE (the test
starts every rank under ``setpriv``), so no other rank may read it: ``init()``'s probe must
find that on every rank, and calls beyond the shared-memory regions must still reduce right.
"""

import ctypes

import numpy as np
from common import assert_equal, expected, main, rank_data, transport
from mpi4py import MPI

import ringtrain
from ringtrain.transport.attach import PIECE_BYTES

_PR_SET_DUMPABLE = 4


def body():
    comm = MPI.COMM_WORLD.Dup()
    r, n = comm.Get_rank(), comm.Get_size()
    if r == n - 1 and ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    # Calls of more than 16 bytes would read peers' buffers in place, were it allowed.
    ring = transport(comm, shared_memory_bytes=16, shared_result_bytes=0)
    assert ring.shared is not None, "the shared-memory regions should still be there"
    assert ring.attach is None, f"rank {r}: the probe missed that rank {n - 1} is unreadable"
    for salt, length in enumerate([5, 1025, 3 * PIECE_BYTES // 4 + 13]):
        everyone = [rank_data(q, (length,), np.float32, salt) for q in range(n)]
        dst = np.empty(length, np.float32)
        ring.allreduce(everyone[r], dst, ringtrain.Sum)
        assert_equal(dst, expected(ringtrain.Sum, everyone, np.float32), f"length {length}")
    comm.Free()
    # Through the engine, with regions of 64 bytes.
    ringtrain.init(shared_memory_bytes=64)
    for salt, length in enumerate([3, 100_003]):
        everyone = [rank_data(q, (length,), np.float64, salt) for q in range(n)]
        got = ringtrain.allreduce(everyone[r], op=ringtrain.Max, name=f"refused.{salt}")
        assert_equal(got, expected(ringtrain.Max, everyone, np.float64), f"engine {length}")
    ringtrain.shutdown()


main(body)
