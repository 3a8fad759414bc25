"""Allgather, broadcast, alltoall, reducescatter, the object collectives and barrier.

Results are compared against NumPy answers from every rank's data. Usage:
``check_collectives.py [SLOTS,...]``, the ranks on each host (default: all on one host).
"""

import sys
import time

import ml_dtypes
import numpy as np
from common import OPS, assert_equal, expected, main, rank_data
from mpi4py import MPI

import ringtrain
from ringtrain import settings, topology
from ringtrain.buffers import BufferPool
from ringtrain.transport.messages import displacements
from ringtrain.transport.router import Transport


def check_allgather_ring(r, n):
    """Check the transport's own allgather ring in 5-byte chunks: 0, 1 and uneven bytes a rank."""
    chosen = settings.read(ring_chunk_bytes=5)
    comm = MPI.COMM_WORLD
    transport = Transport(comm, topology.discover(comm), chosen, BufferPool())
    for counts in ([0] * n, [1] * n, [7 * i for i in range(n)], [13 - i for i in range(n)]):
        mine = rank_data(r, (counts[r],), np.uint8, sum(counts))
        recv = np.zeros(sum(counts), np.uint8)
        transport.messages.allgatherv_ring(mine, recv, counts, displacements(counts))
        want = [rank_data(i, (counts[i],), np.uint8, sum(counts)) for i in range(n)]
        assert_equal(recv, np.concatenate(want), f"allgather ring of {counts} bytes")
    transport.free()


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()

    for dtype in (np.uint8, np.int64, np.float16, ml_dtypes.bfloat16, np.float64):
        # Allgather: rank i contributes i rows (rank 0 none), trailing shape (3,).
        got = ringtrain.allgather(rank_data(r, (r, 3), dtype), name=f"ag.{np.dtype(dtype)}")
        want = np.concatenate([rank_data(i, (i, 3), dtype) for i in range(n)])
        assert_equal(got, want, f"allgather {np.dtype(dtype)}")

        # Broadcast from every root.
        for root in range(n):
            got = ringtrain.broadcast(
                rank_data(r, (2, 5), dtype), root, name=f"bc.{np.dtype(dtype)}.{root}"
            )
            assert_equal(got, rank_data(root, (2, 5), dtype), f"broadcast root {root}")

    # Broadcast of zero-length and 0-d arrays.
    assert_equal(ringtrain.broadcast(np.zeros(0, np.int32), 0), np.zeros(0, np.int32), "bc 0")
    assert_equal(ringtrain.broadcast(np.float32(r), n - 1), np.float32(n - 1), "bc 0-d")

    # Alltoall with uneven splits: rank i sends (i + j) % 3 rows to rank j.
    def splits_of(i):
        return [(i + j) % 3 for j in range(n)]

    def rows_of(i):
        return rank_data(i, (sum(splits_of(i)), 2), np.int32)

    got = ringtrain.alltoall(rows_of(r), splits=splits_of(r), name="a2a")
    pieces = []
    for i in range(n):
        start = sum(splits_of(i)[:r])
        pieces.append(rows_of(i)[start : start + splits_of(i)[r]])
    assert_equal(got, np.concatenate(pieces), "alltoall uneven")
    # Alltoall without splits spreads rows evenly, first ranks one more.
    got = ringtrain.alltoall(np.arange(2 * n + 1, dtype=np.float32) + 100 * r, name="a2a.even")
    base = (2 * n + 1) // n
    extra = (2 * n + 1) % n
    start = r * base + min(r, extra)
    count = base + (1 if r < extra else 0)
    want = np.concatenate(
        [np.arange(start, start + count, dtype=np.float32) + 100 * i for i in range(n)]
    )
    assert_equal(got, want, "alltoall even")

    # Reducescatter of uneven rows for every op.
    rows = 2 * n + 1
    for op in OPS:
        for dtype in (np.int32, np.float32, np.float16):
            full = expected(op, [rank_data(i, (rows, 3), dtype, 7) for i in range(n)], dtype)
            got = ringtrain.reducescatter(
                rank_data(r, (rows, 3), dtype, 7), op=op, name=f"rs.{op.name}.{np.dtype(dtype)}"
            )
            base, extra = divmod(rows, n)
            start = r * base + min(r, extra)
            assert_equal(
                got,
                full[start : start + base + (1 if r < extra else 0)],
                f"reducescatter {op.name} {np.dtype(dtype)}",
            )

    # Rows wide enough that each rank's share is cut into several chunks (shared memory).
    wide = [rank_data(i, (rows, 100_003), np.float32, 8) for i in range(n)]
    got = ringtrain.reducescatter(wide[r], op=ringtrain.Sum, name="rs.wide")
    base, extra = divmod(rows, n)
    start = r * base + min(r, extra)
    want = expected(ringtrain.Sum, wide, np.float32)[start : start + base + (1 if r < extra else 0)]
    assert_equal(got, want, "reducescatter wide")

    # Grouped allgather: rank i gives i rows of one tensor and i % 2 of another, of two dtypes.
    def pieces(i):
        return [rank_data(i, (i, 2), np.int64, 10), rank_data(i, (i % 2, 3, 2), np.float16, 11)]

    handle = ringtrain.grouped_allgather_async(pieces(r), name="gag")
    got = ringtrain.synchronize(handle)
    assert ringtrain.poll(handle)
    for k in range(2):
        want = np.concatenate([pieces(i)[k] for i in range(n)])
        assert_equal(got[k], want, f"grouped allgather member {k}")
    got = ringtrain.grouped_allgather([np.full((1, 1), r, np.int32)])  # unnamed
    assert_equal(got[0], np.arange(n, dtype=np.int32).reshape(n, 1), "grouped allgather of one")
    # Grouped reducescatter of two tensors, each shared out as reducescatter does.
    both = [[rank_data(i, (rows, 2), np.float64, 12), rank_data(i, (n, 4), np.float32, 13)]
            for i in range(n)]  # fmt: skip
    got = ringtrain.grouped_reducescatter(both[r], op=ringtrain.Max, name="grs")
    for k, length in enumerate((rows, n)):
        full = expected(ringtrain.Max, [b[k] for b in both], both[0][k].dtype)
        base, extra = divmod(length, n)
        start = r * base + min(r, extra)
        want = full[start : start + base + (1 if r < extra else 0)]
        assert_equal(got[k], want, f"grouped reducescatter member {k}")
    # A bad member fails the call before anything is submitted: the same names then work.
    for call in (ringtrain.grouped_allgather, ringtrain.grouped_reducescatter):
        for bad, kind in (([np.ones(2), np.float32(1)], ValueError), ([], ValueError)):
            try:
                call(bad, name="grouped.checked")
            except kind:
                pass
            else:
                raise AssertionError(f"{call.__name__}({bad!r}) was accepted")
        got = call([np.ones((n, 2))], name="grouped.checked")
        assert len(got) == 1, got

    # An allgather of 4 MiB or more: across hosts it takes the message ring (transport.choice).
    # Rank 0 contributes no rows, the others 100,003 float64 rows each.
    shapes = [(100_003 * min(i, 1), 6) for i in range(n)]
    got = ringtrain.allgather(rank_data(r, shapes[r], np.float64, 14), name="ag.big")
    want = np.concatenate([rank_data(i, shapes[i], np.float64, 14) for i in range(n)])
    assert_equal(got, want, "allgather of 4 MiB or more")
    check_allgather_ring(r, n)

    # Objects.
    obj = ringtrain.broadcast_object({"epoch": 3, "from": r} if r == n - 1 else None, n - 1)
    assert obj == {"epoch": 3, "from": n - 1}, obj
    assert ringtrain.allgather_object(("rank", r, "x" * r)) == [
        ("rank", i, "x" * i) for i in range(n)
    ]

    # A barrier holds every rank until the last arrives: rank i arrives 0.15 * i s late.
    ringtrain.allreduce(np.zeros(1), name="before.barrier")
    started = time.monotonic()
    time.sleep(0.15 * r)
    ringtrain.barrier()
    waited = time.monotonic() - started
    assert waited >= 0.15 * (n - 1) - 0.05, f"rank {r} left the barrier after {waited:.3f} s"

    # Horovod's build and topology checks.
    slots = [int(count) for count in sys.argv[1].split(",")] if len(sys.argv) > 1 else [n]
    homogeneous = len(set(slots)) == 1
    assert ringtrain.is_homogeneous() == homogeneous, f"hosts of {slots} ranks: homogeneous?"
    assert ringtrain.mpi_built() and ringtrain.mpi_enabled() and ringtrain.mpi_threads_supported()
    assert not any(
        f()
        for f in (
            ringtrain.gloo_built,
            ringtrain.gloo_enabled,
            ringtrain.nccl_built,
            ringtrain.ddl_built,
            ringtrain.ccl_built,
            ringtrain.rocm_built,
        )
    )
    ringtrain.shutdown()


main(body)
