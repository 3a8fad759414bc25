"""The shared-memory ring alone, without the engine: calls that some ranks run far ahead of.

A rank whose share of a reduce-scatter is empty waits for no one, so it can start call after
call while a late neighbour has not yet read its part of an earlier one. The regions are
double, and a rank must not reuse a half before every rank is done with it: here every
rank's result of every call is checked against NumPy, with the last rank starting late.
"""

import time

import numpy as np
from common import assert_equal, expected, main, rank_data
from mpi4py import MPI

import ringtrain
from ringtrain.topology import discover
from ringtrain.transport.progress import Waiter
from ringtrain.transport.schedule import segment_bounds
from ringtrain.transport.shared import SharedRegions, SharedRing


def body():
    comm = MPI.COMM_WORLD.Dup()
    r, n = comm.Get_rank(), comm.Get_size()
    ring = SharedRing(comm, SharedRegions(comm, 4 << 20), Waiter(60, discover(comm)))
    calls = 6
    # One row of 3 elements: rank 0's share is all of it, the others' shares are empty.
    bounds = [(lo * 3, hi * 3) for lo, hi in segment_bounds(1, n)]
    if r == n - 1:
        time.sleep(0.5)  # the others run ahead meanwhile, as far as the ring lets them
    results = []
    for k in range(calls):
        dst = np.zeros(3, np.float32)
        ring.run(rank_data(r, (3,), np.float32, k), dst, ringtrain.Sum, 1.0, bounds, False)
        results.append(dst.copy())
    for k, got in enumerate(results):
        want = expected(ringtrain.Sum, [rank_data(i, (3,), np.float32, k) for i in range(n)], "f4")
        lo, hi = bounds[r]
        assert_equal(got[lo:hi], want[lo:hi], f"reduce-scatter call {k}")
    # Allreduces of uneven lengths, several chunks long, every rank's own data.
    for k, length in enumerate([1, 7, 300_001]):
        src = rank_data(r, (length,), np.float32, 10 + k)
        dst = np.empty(length, np.float32)
        ring.run(src, dst, ringtrain.Sum, 1.0, segment_bounds(length, n), True)
        want = [rank_data(i, (length,), np.float32, 10 + k) for i in range(n)]
        assert_equal(dst, expected(ringtrain.Sum, want, np.float32), f"allreduce {length}")
    comm.Free()


main(body)
