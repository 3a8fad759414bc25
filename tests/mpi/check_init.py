"""init() on a list of ranks, on a user's communicator, and the topology it reports.

The runtime that init() makes runs on a communicator of its own, which shutdown() frees, and
a later init() makes a new one.
"""

import numpy as np
from common import assert_equal, expect_error, main
from mpi4py import MPI

import ringtrain
from ringtrain import runtime


def check_a_second_init_is_a_no_op():
    first = runtime.current()
    ringtrain.init(cycle_time_ms=7.0)
    assert runtime.current() is first, "a second init() made a new runtime"
    assert first.settings.cycle_time_ms != 7.0, "a second init() read settings"


def check_shutdown_frees_the_runtime(owned, process_set):
    """Shut down; the runtime's communicator and ``process_set`` are freed and forgotten."""
    ringtrain.shutdown()
    assert owned.comm == MPI.COMM_NULL, "shutdown() left the runtime's communicator alive"
    assert process_set.process_set_id is None and process_set.engine is None, process_set
    assert ringtrain.global_process_set.engine is None
    expect_error(ringtrain.NotInitializedError, "call ringtrain.init() first", runtime.current)
    expect_error(ringtrain.NotInitializedError, "call ringtrain.init() first", ringtrain.rank)
    ringtrain.shutdown()  # a second shutdown does nothing


def body():
    world = MPI.COMM_WORLD
    r, n = world.Get_rank(), world.Get_size()

    # A list of world ranks: the first n - 1 ranks (all of them when n == 1).
    members = list(range(max(1, n - 1)))
    if r in members:
        for round_ in range(2):  # a second init() after shutdown() starts afresh
            ringtrain.init(comm=members)
            assert ringtrain.size() == len(members) and ringtrain.rank() == members.index(r)
            check_a_second_init_is_a_no_op()
            owned = runtime.current()
            assert owned.topology.size == len(members) and owned.topology.rank == members.index(r)
            # A set of this runtime's rank 0 alone: split off the runtime's communicator.
            alone = ringtrain.add_process_set([0])
            got = ringtrain.allreduce(np.array([r + 1.0]), op=ringtrain.Sum)
            want = np.array([sum(m + 1.0 for m in members)])
            assert_equal(got, want, f"unnamed allreduce on a subset, round {round_}")
            if ringtrain.rank() == 0:
                got = ringtrain.allreduce(np.array([3.0]), op=ringtrain.Sum, process_set=alone)
                assert_equal(got, np.array([3.0]), "allreduce over a set of one")
            check_shutdown_frees_the_runtime(owned, alone)
    else:
        try:
            ringtrain.init(comm=members)
        except ValueError as err:
            assert f"world rank {r}, which is not in the ranks given to init()" in str(err), err
        else:
            raise AssertionError("init() with a list that excludes this rank did not raise")
    world.Barrier()

    # A user's communicator: even and odd world ranks reduce separately.
    halves = world.Split(color=r % 2, key=r)
    ringtrain.init(comm=halves, cycle_time_ms=0.5)
    owned = runtime.current()
    # The runtime's own duplicate: the same ranks in the same order, another context.
    assert MPI.Comm.Compare(owned.comm, halves) == MPI.CONGRUENT
    mine = [i for i in range(n) if i % 2 == r % 2]
    assert ringtrain.size() == len(mine)
    got = ringtrain.allreduce(np.array([float(r)]), op=ringtrain.Sum, name="halves")
    assert_equal(got, np.array([float(sum(mine))]), "allreduce on a split communicator")
    # The user's own traffic on the same communicator does not collide with ringtrain's.
    assert halves.allreduce(1) == len(mine)
    # One host: everybody is local, and there is one host across.
    assert ringtrain.local_size() == len(mine) and ringtrain.local_rank() == ringtrain.rank()
    assert ringtrain.cross_size() == 1 and ringtrain.cross_rank() == 0
    ringtrain.shutdown()
    assert owned.comm == MPI.COMM_NULL, "shutdown() left the runtime's duplicate alive"
    assert halves.allreduce(1) == len(mine), "shutdown() freed the user's communicator"
    halves.Free()

    try:
        ringtrain.init(comm=[n + 5])
    except ValueError as err:
        assert f"got ranks [{n + 5}]; expected distinct ranks in [0, {n})" in str(err), err
    else:
        raise AssertionError("init() with an out-of-range rank did not raise")


main(body)
