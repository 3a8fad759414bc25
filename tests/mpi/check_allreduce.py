"""Allreduce of every dtype and op on rank-distinct data, checked against NumPy."""

import os

import numpy as np
from common import DTYPES, OPS, assert_equal, expected, main, rank_data, same_bits_everywhere

import ringtrain
from ringtrain import runtime

SHAPES = [(0,), (1,), (7,), (3, 5), (10007,)]


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    # Where every rank is on one host, the flat ring takes calls up to the setting through
    # shared memory; the hierarchical allreduce is on where the setting asks for it.
    capabilities = runtime.current().engine.transport.capabilities
    wanted = os.environ.get("RINGTRAIN_HIERARCHICAL_ALLREDUCE")
    if wanted is not None:
        assert capabilities.hierarchical == (wanted == "1"), f"hierarchical: {capabilities}"
    shared_on = os.environ.get("RINGTRAIN_SHARED_MEMORY_BYTES") != "0"
    one_host = ringtrain.local_size() == n
    uses_shared = capabilities.shared_bytes > 0
    expected_shared = shared_on and not capabilities.hierarchical and one_host and n > 1
    assert uses_shared == expected_shared, f"shared memory in use: {uses_shared}"
    for dtype in DTYPES:
        for op in OPS:
            for shape in SHAPES:
                mine = rank_data(r, shape, dtype)
                got = ringtrain.allreduce(mine, op=op, name=f"{np.dtype(dtype)}.{op.name}.{shape}")
                want = expected(op, [rank_data(i, shape, dtype) for i in range(n)], dtype)
                assert_equal(got, want, f"{np.dtype(dtype)} {op.name} {shape}")
                same_bits_everywhere(got, f"{np.dtype(dtype)} {op.name} {shape}")

    # A tensor large enough for many ring chunks, with pre- and post-scaling.
    big = rank_data(r, (3_000_017,), np.float32, salt=1)
    got = ringtrain.allreduce(big, op=ringtrain.Sum, prescale_factor=0.5, postscale_factor=3.0)
    want = expected(
        ringtrain.Sum, [rank_data(i, big.shape, np.float32, 1) for i in range(n)], np.float32
    ) * np.float32(1.5)
    assert_equal(got, want, "scaled large float32")
    same_bits_everywhere(got, "scaled large float32")

    # float16 with a prescale goes through the widening fusion path.
    half = rank_data(r, (1001,), np.float16, salt=2)
    got = ringtrain.allreduce(half, op=ringtrain.Average, prescale_factor=2.0)
    want = expected(
        ringtrain.Average, [rank_data(i, (1001,), np.float16, 2) * 2 for i in range(n)], np.float16
    )
    assert_equal(got, want, "float16 average prescaled")

    # out= receives the result; a non-contiguous input is accepted.
    out = np.empty((4, 3), np.float64)
    base = rank_data(r, (4, 6), np.float64, salt=3)
    result = ringtrain.allreduce(base[:, ::2], op=ringtrain.Max, out=out)
    assert result is out
    assert_equal(
        out,
        expected(
            ringtrain.Max,
            [rank_data(i, (4, 6), np.float64, 3)[:, ::2] for i in range(n)],
            np.float64,
        ),
        "out= Max",
    )

    # Zeros signed by rank: Min and Max keep one of two equal values, so the sign that every
    # rank ends with depends on the order of the operands, which must be the same everywhere.
    zeros = np.full(9, -0.0 if r % 2 else 0.0, np.float32)
    for op in (ringtrain.Min, ringtrain.Max):
        got = ringtrain.allreduce(zeros, op=op, name=f"signed zeros {op.name}")
        assert_equal(got, np.zeros(9, np.float32), f"signed zeros {op.name}")
        same_bits_everywhere(got, f"signed zeros {op.name}")

    # The older average flag, and the default op (Average).
    ints = rank_data(r, (9,), np.int32, salt=4)
    allints = [rank_data(i, (9,), np.int32, 4) for i in range(n)]
    assert_equal(
        ringtrain.allreduce(ints, average=False),
        expected(ringtrain.Sum, allints, np.int32),
        "average=False",
    )
    assert_equal(
        ringtrain.allreduce(ints), expected(ringtrain.Average, allints, np.int32), "default op"
    )
    ringtrain.shutdown()


main(body)
