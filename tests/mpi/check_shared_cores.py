"""Ranks that share a core still finish: allreduces between the job's own MPI barriers.

Arguments: how the ranks sit on the cores, then the float32 element counts to allreduce
(``COUNTS`` if none: 0, 1, uneven, 1 MiB and 16 MiB).
``default``: as ``init()`` binds them (RINGTRAIN_BIND_CORES decides). ``paired``: after
``init()``, every rank pins itself to CPU ``rank % cpus``, so that ranks share cores as the
ranks of two jobs, or of two hosts on one machine, do.

Between calls each rank leaves its engine idle a moment, then waits in ``MPI_Barrier``,
which Open MPI waits for by polling without sleeping: the case where an idle engine that
woke every millisecond let the kernel starve the rank beside a polling one.
"""

import os
import sys
import time

import numpy as np
from common import assert_equal, expected, main, rank_data
from mpi4py import MPI

import ringtrain

world = MPI.COMM_WORLD
COUNTS = [0, 1, 1000003, 1 << 18, 1 << 22]


def body():
    placement, counts = sys.argv[1], [int(c) for c in sys.argv[2:]] or COUNTS
    ringtrain.init()
    rank, size = ringtrain.rank(), ringtrain.size()
    if placement == "paired":
        cpus = sorted(os.sched_getaffinity(0))
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), {cpus[rank % len(cpus)]})
    for round_ in range(2):
        for count in counts:
            time.sleep(0.01)  # the engine goes idle
            world.Barrier()
            data = rank_data(rank, (count,), np.float32, salt=round_)
            want = expected(ringtrain.Sum, [rank_data(r, (count,), np.float32, round_)
                                            for r in range(size)], np.float32)  # fmt: skip
            got = ringtrain.allreduce(data, op=ringtrain.Sum, name=f"shared.{count}")
            assert_equal(got, want, f"allreduce of {count} floats, round {round_}")
    world.Barrier()
    print(f"rank {rank} on CPUs {sorted(os.sched_getaffinity(0))}: every allreduce matched")
    ringtrain.shutdown()


main(body)
