"""Process sets: collectives over subsets of the ranks, against NumPy, and their errors.

Even and odd ranks form two sets registered at init(); a third set is added and removed
while running. Every collective runs over this rank's set with rank-distinct data and is
compared with NumPy's answer over that set's ranks only; calls over the whole job
interleave with them, unnamed, so each set must keep its own call counters.
"""

import ml_dtypes
import numpy as np
from common import assert_equal, expect_error, expected, main, rank_data

import ringtrain
from ringtrain import ProcessSet


def check_registry(sets, mine, r, n):
    assert ringtrain.global_process_set.process_set_id == 0
    assert ringtrain.global_process_set.ranks == list(range(n))
    assert ringtrain.global_process_set.size() == n
    assert ringtrain.global_process_set.rank() == r
    assert ringtrain.process_set_by_id(0) is ringtrain.global_process_set
    expect_error(
        ValueError, "no process set has id 9; registered: [0, 1", ringtrain.process_set_by_id, 9
    )
    for i, s in enumerate(sets):
        assert ringtrain.process_set_by_id(i + 1) is s
        assert s.process_set_id == i + 1, s
        assert s.size() == len(s.ranks), s
        assert s.included() == (s is mine), (s, r)
        assert s.rank() == (s.ranks.index(r) if s is mine else None), (s, r)


def check_collectives(mine, r, n):
    members = mine.ranks
    for dtype in (np.int32, np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        for length in (0, 1, 17, 300_001):
            for op in (ringtrain.Sum, ringtrain.Average, ringtrain.Max):
                what = f"set {members} allreduce {np.dtype(dtype)} x{length} {op.name}"
                data = [rank_data(i, (length,), dtype, salt=length) for i in members]
                got = ringtrain.allreduce(data[members.index(r)], op=op, process_set=mine)
                assert_equal(got, expected(op, data, dtype), what)
    # Asynchronous, into out=, while an unnamed allreduce of the whole job is in flight.
    data = [rank_data(i, (1000,), np.float32, salt=5) for i in members]
    everyone = [rank_data(i, (7,), np.float64, salt=6) for i in range(n)]
    out = np.empty(1000, np.float32)
    in_set = ringtrain.allreduce_async(data[members.index(r)], process_set=mine, out=out)
    whole = ringtrain.allreduce_async(everyone[r], op=ringtrain.Sum)
    assert ringtrain.synchronize(in_set) is out
    assert_equal(out, expected(ringtrain.Average, data, np.float32), "set allreduce out=")
    assert_equal(ringtrain.synchronize(whole), expected(ringtrain.Sum, everyone, np.float64), "job")

    group = [rank_data(i, (3, 4), np.float64, salt=7) for i in members]
    got = ringtrain.grouped_allreduce(
        [group[members.index(r)], 2 * group[members.index(r)]], op=ringtrain.Sum, process_set=mine
    )
    assert_equal(got[0], expected(ringtrain.Sum, group, np.float64), "set grouped 0")
    assert_equal(got[1], 2 * expected(ringtrain.Sum, group, np.float64), "set grouped 1")

    # Allgather: job rank i gives i % 3 rows (some none); results in the set's rank order.
    got = ringtrain.allgather(rank_data(r, (r % 3, 2), np.int64), process_set=mine)
    want = np.concatenate([rank_data(i, (i % 3, 2), np.int64) for i in members])
    assert_equal(got, want, "set allgather")

    # Broadcast from each member: root_rank is a rank of the whole job.
    for root in members:
        got = ringtrain.broadcast(rank_data(r, (5,), np.float32), root, process_set=mine)
        assert_equal(got, rank_data(root, (5,), np.float32), f"set broadcast from {root}")
        obj = ringtrain.broadcast_object({"from": r}, root_rank=root, process_set=mine)
        assert obj == {"from": root}, obj
    assert ringtrain.allgather_object(r * 10, process_set=mine) == [i * 10 for i in members]

    # Alltoall: member k sends (k + j) % 3 rows to member j.
    k, m = members.index(r), len(members)
    splits = [(k + j) % 3 for j in range(m)]
    rows = rank_data(r, (sum(splits), 2), np.float32, salt=8)
    got = ringtrain.alltoall(rows, splits=splits, process_set=mine)
    pieces = []
    for kk, i in enumerate(members):
        theirs = [(kk + j) % 3 for j in range(m)]
        start = sum(theirs[:k])
        pieces.append(rank_data(i, (sum(theirs), 2), np.float32, salt=8)[start : start + theirs[k]])
    assert_equal(got, np.concatenate(pieces), "set alltoall")

    # Reducescatter: this member's share of 2m + 1 rows, the first members one more.
    full = [rank_data(i, (2 * m + 1, 3), np.float64, salt=9) for i in members]
    total = expected(ringtrain.Sum, full, np.float64)
    first = k * 2 + min(k, 1)
    got = ringtrain.reducescatter(full[k], op=ringtrain.Sum, process_set=mine)
    assert_equal(got, total[first : first + 2 + (k < 1)], "set reducescatter")
    ringtrain.barrier(process_set=mine)
    ringtrain.barrier()

    # The odd ranks make more unnamed calls in their set than the even ranks in theirs; the
    # next unnamed call of the whole job must still get the same name on every rank.
    for _ in range(3 if mine.ranks[0] % 2 else 1):
        ringtrain.allreduce(np.ones(2), process_set=mine)
    got = ringtrain.allreduce(np.full(2, r, np.int64), op=ringtrain.Sum)
    assert_equal(got, np.full(2, n * (n - 1) // 2, np.int64), "unnamed, after uneven set calls")


def check_errors(sets, mine, r, n):
    expect_error(ValueError, "distinct ranks, at least one", ProcessSet, [])
    expect_error(ValueError, "distinct ranks", ProcessSet, [0, 0])
    expect_error(TypeError, "ranks must be ints, got [0.5]", ProcessSet, [0.5])
    expect_error(TypeError, "takes a list of ranks, got 3", ProcessSet, 3)
    expect_error(TypeError, "ranks must be ints, got [True]", ProcessSet, [True])
    assert ProcessSet(np.arange(2)[::-1]).ranks == [0, 1]
    unregistered = ProcessSet([0])
    expect_error(
        ValueError, "is not registered", ringtrain.allreduce, np.ones(2), process_set=unregistered
    )
    expect_error(
        TypeError,
        "must be a ProcessSet, got list",
        ringtrain.allreduce,
        np.ones(2),
        process_set=[0],
    )
    expect_error(
        ValueError, "is not a registered process set", ringtrain.remove_process_set, unregistered
    )
    outsider = [r0 for r0 in range(n) if r0 not in mine.ranks]
    expect_error(
        ValueError, f"root_rank {n} is not in", ringtrain.broadcast, np.ones(1), n, process_set=mine
    )
    for other in sets:
        if other is not mine:
            expect_error(
                ValueError,
                f"rank {r} is not in {other!r}",
                ringtrain.allreduce,
                np.ones(2),
                process_set=other,
            )
    if outsider:
        root = outsider[0]
        expect_error(
            ValueError,
            f"root_rank {root} is not in",
            ringtrain.broadcast,
            np.ones(1),
            root,
            process_set=mine,
        )
    # Members that disagree on a tensor get MismatchError; the set's engine goes on.
    if len(mine.ranks) > 1:
        shape = (2 + mine.rank(),)
        expect_error(
            ringtrain.MismatchError,
            "shape differs",
            ringtrain.allreduce,
            np.ones(shape),
            name="differs",
            process_set=mine,
        )
        assert_equal(
            ringtrain.allreduce(np.ones(3), op=ringtrain.Sum, process_set=mine),
            np.full(3, float(len(mine.ranks))),
            "after mismatch",
        )


def check_add_and_remove(sets, r, n):
    expect_error(ValueError, "is already registered", ringtrain.add_process_set, sets[0])
    expect_error(
        ValueError,
        f"ranks {sets[0].ranks} is already registered",
        ringtrain.add_process_set,
        list(sets[0].ranks),
    )
    expect_error(ValueError, f"ranks [{n}] are outside [0, {n})", ringtrain.add_process_set, [0, n])
    if n > 1:
        parts = ", ".join(f"rank {i}: [{i}]" for i in range(n))
        expect_error(
            ValueError,
            f"ranks add different process sets ({parts})",
            ringtrain.add_process_set,
            [r],
        )
    if n == 1:  # the only set of one rank is taken: remove it first
        assert ringtrain.remove_process_set(sets[0]) is True
    ends = ringtrain.add_process_set(sorted({max(n - 2, 0), n - 1}))  # the last two ranks
    assert isinstance(ends, ProcessSet) and ends.process_set_id == len(sets) + 1, ends
    if ends.included():
        data = [rank_data(i, (33,), np.float64, salt=11) for i in ends.ranks]
        got = ringtrain.allreduce(data[ends.rank()], op=ringtrain.Sum, process_set=ends)
        assert_equal(got, expected(ringtrain.Sum, data, np.float64), "added set")
    assert ringtrain.remove_process_set(ringtrain.global_process_set) is False
    assert ringtrain.remove_process_set(ends) is True
    assert ends.process_set_id is None and ends.size() is None and ends.included() is None
    expect_error(ValueError, "is not registered", ringtrain.allreduce, np.ones(2), process_set=ends)
    # A set with the same ranks may be added again after removal.
    again = ringtrain.add_process_set(ends.ranks)
    assert again.process_set_id == len(sets) + 2, again
    got = ringtrain.allgather_object(r, process_set=again) if again.included() else None
    assert got in (None, again.ranks), got


def body():
    n = _world_size()
    r = _world_rank()
    groups = [list(range(0, n, 2)), list(range(1, n, 2))] if n > 1 else [[0]]
    sets = [ProcessSet(g) for g in groups]
    ringtrain.init(process_sets=sets)
    mine = next(s for s in sets if r in s.ranks)
    ringtrain.init()  # a second call is a no-op, but cannot take sets
    expect_error(ValueError, "use add_process_set()", ringtrain.init, process_sets=[[0]])
    check_registry(sets, mine, r, n)
    check_collectives(mine, r, n)
    check_errors(sets, mine, r, n)
    check_add_and_remove(sets, r, n)
    print(f"rank {r}: process sets OK", flush=True)
    ringtrain.shutdown()
    assert all(s.process_set_id is None for s in sets), sets
    # A second init starts with no sets but the whole job's, and counts ids from 1 again.
    ringtrain.init(process_sets="dynamic")  # Horovod's word for adding sets later
    late = ringtrain.add_process_set(list(range(n)))
    assert late.process_set_id == 1, late
    got = ringtrain.allreduce(np.full(4, r, np.int64), op=ringtrain.Sum, process_set=late)
    assert_equal(got, np.full(4, n * (n - 1) // 2, np.int64), "after re-init")
    ringtrain.shutdown()


def _world_size():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def _world_rank():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


main(body)
