"""Adasum allreduce against NumPy's tree of pairwise adaptive sums, and its errors.

At 1, 2 and 4 ranks every rank reduces its own data and the result must match NumPy's
Adasum of all ranks' data, bitwise the same on every rank. At 3 ranks the whole job is
refused, and a process set of two ranks works.
"""

import ml_dtypes
import numpy as np
from common import adasum_reference as reference
from common import assert_equal, expect_error, main, rank_data, same_bits_everywhere

import ringtrain

FLOATS = (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)


def check_against_numpy(r, n):
    adasum = ringtrain.Adasum
    for dtype in FLOATS:
        for length in (0, 1, 17, 300_001):
            what = f"Adasum {np.dtype(dtype)} x{length}"
            data = [rank_data(i, (length,), dtype, salt=length) for i in range(n)]
            got = ringtrain.allreduce(data[r], op=adasum, name=what)
            assert_equal(got, reference(data).astype(dtype), what)
            same_bits_everywhere(got, what)
    # The same vector everywhere stays itself; orthogonal vectors add up.
    same = rank_data(0, (9,), np.float64)
    assert_equal(ringtrain.allreduce(same, op=adasum), same, "Adasum of equal vectors")
    basis = np.zeros(n * 2)
    basis[2 * r : 2 * r + 2] = r + 1.0
    want = np.repeat(np.arange(1.0, n + 1), 2)
    assert_equal(ringtrain.allreduce(basis, op=adasum), want, "Adasum of orthogonal vectors")
    # A zero gradient on rank 0 leaves the others' combination as it is.
    data = [np.zeros(5) if i == 0 else rank_data(i, (5,), np.float64) for i in range(n)]
    assert_equal(ringtrain.allreduce(data[r], op=adasum), reference(data), "a zero vector")

    # Each tensor of a group, and of calls fused together, has its own dot products.
    group = [[rank_data(i, (4, 3), np.float32, salt=s) for s in (1, 2)] for i in range(n)]
    got = ringtrain.grouped_allreduce(group[r], op=adasum)
    for k in range(2):
        want = reference([g[k] for g in group]).reshape(4, 3).astype(np.float32)
        assert_equal(got[k], want, f"grouped Adasum member {k}")
    many = [[rank_data(i, (7 + k,), np.float32, salt=20 + k) for k in range(5)] for i in range(n)]
    handles = [
        ringtrain.allreduce_async(many[r][k], op=adasum, name=f"burst.{k}") for k in range(5)
    ]
    for k, handle in enumerate(handles):
        want = reference([m[k] for m in many]).astype(np.float32)
        assert_equal(ringtrain.synchronize(handle), want, f"burst {k}")

    # Scale factors apply before and after; out= receives the result.
    data = [rank_data(i, (6,), np.float64, salt=30) for i in range(n)]
    out = np.empty(6)
    got = ringtrain.allreduce(
        data[r], op=adasum, prescale_factor=2.0, postscale_factor=0.25, out=out
    )
    assert got is out
    assert_equal(out, reference([2 * d for d in data]) * 0.25, "Adasum with scale factors")


def check_errors(r, n):
    expect_error(
        TypeError,
        "Adasum reduces floating-point tensors; got int32",
        ringtrain.allreduce,
        np.ones(3, np.int32),
        op=ringtrain.Adasum,
    )
    expect_error(
        ValueError,
        "not Adasum",
        ringtrain.reducescatter,
        np.ones((n, 2)),
        op=ringtrain.Adasum,
    )
    if n == 1:
        return
    # A rank that has joined cannot contribute to an Adasum: every other rank gets an error.
    if r == 0:
        ringtrain.join()
        return
    expect_error(
        ringtrain.MismatchError,
        "Adasum allreduce of tensor 'while joined' cannot run while ranks [0] have joined",
        ringtrain.allreduce,
        np.ones(4),
        op=ringtrain.Adasum,
        name="while joined",
    )
    ringtrain.join()


def check_refused_world(r, n):
    expect_error(
        ValueError,
        f"Adasum needs a power-of-two number of ranks; this call has {n}",
        ringtrain.allreduce,
        np.ones(2),
        op=ringtrain.Adasum,
    )
    pair_set = ringtrain.add_process_set([0, 1])
    if pair_set.included():
        data = [rank_data(i, (11,), np.float32, salt=40) for i in (0, 1)]
        got = ringtrain.allreduce(data[r], op=ringtrain.Adasum, process_set=pair_set)
        assert_equal(got, reference(data).astype(np.float32), "Adasum over a process set")


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    if n & (n - 1):
        check_refused_world(r, n)
    else:
        check_against_numpy(r, n)
        check_errors(r, n)
    print(f"rank {r}: Adasum OK", flush=True)
    ringtrain.shutdown()


main(body)
