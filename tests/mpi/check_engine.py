"""The engine: out-of-order async submission, fusion of many tensors, groups, join."""

import numpy as np
from common import assert_equal, expected, main, rank_data, same_bits_everywhere
from mpi4py import MPI

import ringtrain


def assert_aligned(array, what):
    """Results start on a 64-byte boundary, so TensorFlow can take them without a copy."""
    if array.size and array.ctypes.data % 64:
        raise AssertionError(
            f"{what}: result data at {array.ctypes.data:#x} is not 64-byte aligned"
        )


def body():
    # Ranks that set other cache capacities take rank 0's (64: fewer ids than the names
    # below, so that some stay uncached): every rank's agreement rounds must match.
    capacity = 64 if MPI.COMM_WORLD.Get_rank() == 0 else 4096
    ringtrain.init(fusion_threshold=64 * 1024, cache_capacity=capacity)
    r, n = ringtrain.rank(), ringtrain.size()

    # Ranks submit the same names in different orders (reversed on odd ranks); sizes differ
    # per name so that fusion buckets several of them, with mixed dtypes.
    specs = [(i, f"t{i}", (i * 37 + 1,), np.float32 if i % 3 else np.float64) for i in range(60)]
    order = specs if r % 2 == 0 else specs[::-1]
    handles = {
        name: ringtrain.allreduce_async(rank_data(r, shape, dt, i), name=name, op=ringtrain.Sum)
        for i, name, shape, dt in order
    }
    for i, name, shape, dt in specs:
        got = ringtrain.synchronize(handles[name])
        want = expected(ringtrain.Sum, [rank_data(k, shape, dt, i) for k in range(n)], dt)
        assert_equal(got, want, f"async {name}")
        assert_aligned(got, f"async {name}")
        same_bits_everywhere(got, name)

    # Results of 1 MiB and more come from a pool that reuses memory no one holds any more:
    # a result still held is never handed out again, nor written to.
    def big(salt):
        return rank_data(r, (300_001,), np.float32, salt)

    held = ringtrain.allreduce(big(90), name="big", op=ringtrain.Sum)
    kept = held.copy()
    for salt in (91, 92, 93):
        got = ringtrain.allreduce(big(salt), name="big", op=ringtrain.Sum)
        want = expected(
            ringtrain.Sum,
            [rank_data(k, (300_001,), np.float32, salt) for k in range(n)],
            np.float32,
        )
        assert_equal(got, want, f"pooled result {salt}")
        assert_aligned(got, f"pooled result {salt}")
        assert not np.shares_memory(got, held), "a held result's memory was handed out again"
        del got
    assert np.array_equal(held, kept), "a held result was overwritten"

    # poll() turns True once done.
    h = ringtrain.allreduce_async(np.ones(3, np.int64), name="polled", op=ringtrain.Sum)
    ringtrain.synchronize(h)
    assert ringtrain.poll(h)

    # A group is reduced together and returned in order.
    group = [rank_data(r, (k + 1, 2), np.float32, 10 + k) for k in range(5)]
    got = ringtrain.grouped_allreduce(group, op=ringtrain.Average, name="grp")
    for k, g in enumerate(got):
        want = expected(
            ringtrain.Average,
            [rank_data(i, (k + 1, 2), np.float32, 10 + k) for i in range(n)],
            np.float32,
        )
        assert_equal(g, want, f"group member {k}")

    # A group of lengths 0, 1 and uneven: float16 (widened in the fusion buffer), ints, and
    # async groups in flight together with a single tensor.
    shapes = [(0,), (1,), (3, 5), (10007,), (2, 0)]
    for dtype in (np.float16, np.int32):
        mine = [rank_data(r, s, dtype, 20 + k) for k, s in enumerate(shapes)]
        handle = ringtrain.grouped_allreduce_async(mine, op=ringtrain.Sum, name=f"mixed.{dtype}")
        lone = ringtrain.allreduce_async(np.full(3, r, np.int64), op=ringtrain.Sum, name="lone")
        got = ringtrain.synchronize(handle)
        assert len(got) == len(shapes), f"{len(got)} results for {len(shapes)} tensors"
        for k, (g, s) in enumerate(zip(got, shapes, strict=True)):
            want = expected(
                ringtrain.Sum, [rank_data(i, s, dtype, 20 + k) for i in range(n)], dtype
            )
            assert_equal(g, want, f"{np.dtype(dtype)} group member {k} {s}")
            assert_aligned(g, f"{np.dtype(dtype)} group member {k} {s}")
            same_bits_everywhere(g, f"{np.dtype(dtype)} group member {k}")
        assert_equal(
            ringtrain.synchronize(lone), np.full(3, sum(range(n)), np.int64), "beside a group"
        )

    # Join: rank i has i + 1 batches; the others go on reducing with the ranks left.
    batches = r + 1
    for step in range(n):
        if step >= batches:
            break
        x = np.full(4, float(r + 1), np.float32)
        got = ringtrain.allreduce(x, name=f"epoch.{step}", op=ringtrain.Average)
        active = [i for i in range(n) if i + 1 > step]
        assert_equal(
            got, np.full(4, np.mean([i + 1.0 for i in active]), np.float32), f"join step {step}"
        )
        s = ringtrain.allreduce(np.array([r + 1], np.int64), name=f"esum.{step}", op=ringtrain.Min)
        assert_equal(s, np.array([min(i + 1 for i in active)], np.int64), f"join min {step}")
        pair = ringtrain.grouped_allreduce(
            [np.full(2, r + 1.0), np.full((1, 3), r + 1.0)], name=f"egrp.{step}", op=ringtrain.Max
        )
        most = max(i + 1.0 for i in active)
        assert_equal(pair[0], np.full(2, most), f"join group {step}")
        assert_equal(pair[1], np.full((1, 3), most), f"join group {step}")
    last = ringtrain.join()
    assert last == n - 1, f"join returned {last}, expected the last rank to join, {n - 1}"

    # After join completes, collectives work again; a second join cycle also works.
    assert_equal(
        ringtrain.allreduce(np.array([1], np.int32), name="after", op=ringtrain.Sum),
        np.array([n], np.int32),
        "after join",
    )
    assert ringtrain.join() in range(n)

    # Re-initialise after shutdown.
    ringtrain.shutdown()
    assert not ringtrain.is_initialized()
    ringtrain.init()
    assert_equal(
        ringtrain.allreduce(np.array([2.0]), op=ringtrain.Sum), np.array([2.0 * n]), "after re-init"
    )
    ringtrain.shutdown()


main(body)
