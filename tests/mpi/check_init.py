"""init() on a list of ranks, on a user's communicator, and the topology it reports."""

import numpy as np
from common import assert_equal, main
from mpi4py import MPI

import ringtrain


def body():
    world = MPI.COMM_WORLD
    r, n = world.Get_rank(), world.Get_size()

    # A list of world ranks: the first n - 1 ranks (all of them when n == 1).
    members = list(range(max(1, n - 1)))
    if r in members:
        ringtrain.init(comm=members)
        assert ringtrain.size() == len(members) and ringtrain.rank() == members.index(r)
        got = ringtrain.allreduce(np.array([r + 1.0]), op=ringtrain.Sum, name="subset")
        assert_equal(got, np.array([sum(m + 1.0 for m in members)]), "allreduce on a subset")
        ringtrain.shutdown()
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
    halves.Free()

    try:
        ringtrain.init(comm=[n + 5])
    except ValueError as err:
        assert f"got ranks [{n + 5}]; expected distinct ranks in [0, {n})" in str(err), err
    else:
        raise AssertionError("init() with an out-of-range rank did not raise")


main(body)
