"""The engine: out-of-order async submission, fusion of many tensors, groups, join."""

import numpy as np
from common import assert_equal, expected, main, rank_data, same_bits_everywhere

import ringtrain


def body():
    ringtrain.init(fusion_threshold=64 * 1024)
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
        same_bits_everywhere(got, name)

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
