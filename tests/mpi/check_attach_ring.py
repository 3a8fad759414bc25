"""The ring that reads peers' buffers in place (cross-memory attach), without the engine.

Calls larger than the shared-memory regions take it. Every rank's result is checked against
NumPy for lengths 0, 1, uneven and several pieces long, in place and not, reduce-scatter
alone, every op, with calls through the shared-memory ring in between (they share the
flags), and with one rank starting late while the others run ahead; then new results,
read-only in the shared result area where every rank asks for one.
"""

import time

import numpy as np
from common import (
    OPS,
    assert_equal,
    expected,
    main,
    rank_data,
    same_bits_everywhere,
    transport,
)
from mpi4py import MPI

import ringtrain
from ringtrain.transport.attach import PIECE_BYTES
from ringtrain.transport.schedule import segment_bounds


def body():
    comm = MPI.COMM_WORLD.Dup()
    r, n = comm.Get_rank(), comm.Get_size()
    # Calls of more than 16 bytes take the attach ring; those of up to 16, shared memory.
    ring = transport(comm, shared_memory_bytes=16, shared_result_bytes=0)
    if n == 1:
        assert ring.attach is None  # one rank has no one to read
        comm.Free()
        return
    assert ring.attach is not None, "this host should let ranks read each other's memory"
    if r == n - 1:
        time.sleep(0.5)  # the others start, and wait for this rank where they must
    uneven = 3 * PIECE_BYTES // 4 + 13  # pieces of float32: several per segment, the last short
    for salt, length in enumerate([0, 1, 3, 7, 1025, 10_007, uneven]):
        for dtype in (np.float32, np.int64, np.float64):
            what = f"{np.dtype(dtype)} length {length}"
            mine = rank_data(r, (length,), dtype, salt)
            everyone = [rank_data(q, (length,), dtype, salt) for q in range(n)]
            for op in OPS:
                if op == ringtrain.Average:
                    continue  # the engine turns Average into Sum and a scale before the ring
                dst = np.full(length, 99, dtype)
                ring.allreduce(mine, dst, op)
                assert_equal(dst, expected(op, everyone, dtype), f"{what} {op.name}")
                same_bits_everywhere(dst, f"{what} {op.name}")
            in_place = mine.copy()
            scale = 1.0 if dtype == np.int64 else 0.5
            ring.allreduce(in_place, in_place, ringtrain.Sum, postscale=scale)
            want = (expected(ringtrain.Sum, everyone, dtype) * scale).astype(dtype)
            assert_equal(in_place, want, f"{what} in place")
            # A reduce-scatter alone: this rank's segment is reduced, the rest left alone.
            bounds = segment_bounds(length, n)
            part = np.zeros(length, dtype)
            ring.reduce_scatter(mine, part, ringtrain.Sum, 1.0, bounds)
            lo, hi = bounds[r]
            assert_equal(part[lo:hi], expected(ringtrain.Sum, everyone, dtype)[lo:hi], what)
            # A call small enough for the shared-memory regions, between two that are not.
            small = [rank_data(q, (2,), np.float32, salt) for q in range(n)]
            got = np.empty(2, np.float32)
            ring.allreduce(small[r], got, ringtrain.Max)
            assert_equal(got, expected(ringtrain.Max, small, np.float32), "shared in between")
    new_results(comm, r, n, uneven)
    comm.Free()


def new_results(comm, r, n, uneven):
    """Check new results: read-only in the result area where every rank asks, and intact."""
    area = 1 << 20
    ring = transport(comm, shared_memory_bytes=16, shared_result_bytes=area)
    held, shared_count = [], 0
    for salt, length in enumerate([1, 7, 1025, 10_007, area // 8 + 3, uneven]):
        for dtype in (np.float32, np.int64, np.float64):
            everyone = [rank_data(q, (length,), dtype, 40 + salt) for q in range(n)]
            for op, read_only in ((ringtrain.Sum, True), (ringtrain.Max, True),
                                  (ringtrain.Min, r != 0), (ringtrain.Product, False)):  # fmt: skip
                what = f"new {np.dtype(dtype)} length {length} {op.name} read_only={read_only}"
                got, _ = ring.allreduce_new(
                    everyone[r], op, 1.0, lambda count, t=dtype: np.full(count, 99, t), read_only
                )
                want = expected(op, everyone, dtype)
                assert_equal(got, want, what)
                same_bits_everywhere(got, what)
                # Shared where every rank asked and the result fits the area's free part;
                # a rank that asked may still get its own where another did not.
                shared = not got.flags.writeable
                assert not shared or (read_only and got.nbytes <= area), what
                shared_count += shared
                if op == ringtrain.Sum and length != 7:
                    held.append((what, got, want))  # held until the end, through later calls
    assert shared_count > 0, "no call took a shared result"
    for what, got, want in held:
        assert_equal(got, want, f"{what}, held to the end")


main(body)
