"""Read-only allreduce results that the ranks of a host share: right values, never overwritten.

Every result is checked against NumPy when it arrives and again at the end, after many more
calls, while the script still holds it (or only a slice of it): a place in the result area
that is reused while some rank holds a result there would show as a changed value.
"""

import os

import numpy as np
from common import DTYPES, OPS, assert_equal, expected, main, rank_data, same_bits_everywhere

import ringtrain

SHAPES = [(0,), (1,), (7,), (3, 5), (10007,)]


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    area = int(os.environ.get("RINGTRAIN_SHARED_RESULT_BYTES", 16 << 20))
    sharing = n > 1 and area > 0  # every rank is on this one host
    held = []  # (what, result or a slice of it, expected value)

    def keep(what, got, want):
        assert_equal(got, want, what)
        same_bits_everywhere(got, what)
        held.append((what, got, want))

    # The first call's place is free: plain float32 does take a shared result there.
    f32 = ringtrain.allreduce(
        rank_data(r, (1000,), np.float32, 6), op=ringtrain.Sum, name="f32", read_only=True
    )
    assert f32.flags.writeable != (sharing and area >= f32.nbytes), "f32: read-only when shared"
    keep(
        "f32",
        f32,
        expected(
            ringtrain.Sum, [rank_data(i, (1000,), np.float32, 6) for i in range(n)], np.float32
        ),
    )

    # The next place is free too. A group asked read-only: its fused results are read-only
    # views of one shared result (0-d, empty, 1-D and 2-D members); hold one to the end.
    shapes = [(), (0,), (1,), (7,), (3, 5), (2, 0)]
    group = [rank_data(r, s, np.float32, 30 + k) for k, s in enumerate(shapes)]
    got = ringtrain.grouped_allreduce(group, op=ringtrain.Sum, name="grouped", read_only=True)
    for k, (shape, result) in enumerate(zip(shapes, got, strict=True)):
        want = expected(
            ringtrain.Sum, [rank_data(i, shape, np.float32, 30 + k) for i in range(n)], np.float32
        )
        assert result.shape == shape, f"grouped.{k}: shape {result.shape}"
        assert result.flags.writeable != sharing, f"grouped.{k}: read-only when shared"
        if k == 4:
            keep(f"grouped.{k}", result, want)
        else:
            assert_equal(result, want, f"grouped.{k}")
    if sharing:  # views of one buffer: the members lie in one array
        assert got[3].base is got[4].base, "grouped: the members share one result"

    # 3.2 MB fits the shared-memory regions (4 MiB unless set), but where every rank has a
    # core, ranks read each other's buffers in place; 6 MB does not fit them. Either way the
    # result still goes to the area.
    for what, shape in (("3.2 MB", (800_003,)), ("6 MB", (1_500_007,))):
        got = ringtrain.allreduce(
            rank_data(r, shape, np.float32, 7), op=ringtrain.Sum, name=what, read_only=True
        )
        assert got.flags.writeable != (sharing and area >= got.nbytes), f"{what}: read-only?"
        everyone = [rank_data(i, shape, np.float32, 7) for i in range(n)]
        keep(what, got, expected(ringtrain.Sum, everyone, np.float32))

    for dtype in DTYPES:
        for op in OPS:
            for shape in SHAPES:
                what = f"{np.dtype(dtype)} {op.name} {shape}"
                mine = rank_data(r, shape, dtype, salt=5)
                got = ringtrain.allreduce(mine, op=op, name=what, read_only=True)
                keep(
                    what,
                    got,
                    expected(op, [rank_data(i, shape, dtype, 5) for i in range(n)], dtype),
                )
                if np.dtype(dtype).kind in "iu" and op == ringtrain.Average:
                    assert got.flags.writeable, f"{what}: integer Average must come back writable"

    # Submitted together, small tensors share one fusion buffer and one place; hold only a
    # slice of one of them, and of another only a reshaped view.
    handles = [
        ringtrain.allreduce_async(
            rank_data(r, (300 + k,), np.float32, 10 + k),
            name=f"group.{k}",
            op=ringtrain.Sum,
            read_only=True,
        )
        for k in range(6)
    ]
    for k, handle in enumerate(handles):
        got = ringtrain.synchronize(handle)
        want = expected(
            ringtrain.Sum,
            [rank_data(i, (300 + k,), np.float32, 10 + k) for i in range(n)],
            np.float32,
        )
        assert_equal(got, want, f"group.{k}")
        if k == 0:
            held.append(("slice of group.0", got[100:200], want[100:200]))
        elif k == 1:
            held.append(("view of group.1", got.reshape(1, -1), want.reshape(1, -1)))

    # Ranks that disagree: rank 0 takes a read-only result, the others a writable one. The
    # call goes the writable way everywhere.
    mixed = ringtrain.allreduce(
        rank_data(r, (999,), np.float32, 20), op=ringtrain.Max, name="mixed", read_only=(r == 0)
    )
    assert mixed.flags.writeable, "mixed: some rank wants to write, so nobody shares"
    keep(
        "mixed",
        mixed,
        expected(
            ringtrain.Max, [rank_data(i, (999,), np.float32, 20) for i in range(n)], np.float32
        ),
    )

    # out= wins over read_only.
    out = np.empty(500, np.float32)
    got = ringtrain.allreduce(
        rank_data(r, (500,), np.float32, 21), op=ringtrain.Sum, out=out, read_only=True
    )
    assert got is out
    keep(
        "out=",
        got,
        expected(
            ringtrain.Sum, [rank_data(i, (500,), np.float32, 21) for i in range(n)], np.float32
        ),
    )

    # Many more results than the area holds, each dropped at once, then all that are held
    # checked again: a busy place is skipped (the call falls back), never overwritten.
    for k in range(40):
        shape = (1 + 7919 * k % 70001,)
        got = ringtrain.allreduce(
            rank_data(r, shape, np.float32, 100 + k),
            op=ringtrain.Sum,
            name=f"churn.{k}",
            read_only=True,
        )
        want = expected(
            ringtrain.Sum, [rank_data(i, shape, np.float32, 100 + k) for i in range(n)], np.float32
        )
        assert_equal(got, want, f"churn.{k}")
        if k % 10 == 0:
            held.append((f"churn.{k}", got, want))
    for what, got, want in held:
        assert_equal(got, want, f"{what}, held to the end")
    ringtrain.shutdown()
    print(f"rank {r}: {len(held)} results intact", flush=True)


if __name__ == "__main__":
    main(body)
