"""Every error path raises a clear error on every rank, and the engine goes on working."""

import numpy as np
from common import assert_equal, main

import ringtrain


def expect(error, pattern, call):
    """Run ``call``; fail unless it raises ``error`` whose message contains ``pattern``."""
    try:
        call()
    except error as err:
        assert pattern in str(err), f"{error.__name__} said {err!s}; expected {pattern!r}"
        return
    raise AssertionError(f"expected {error.__name__} containing {pattern!r}; nothing raised")


def body():
    expect(ringtrain.NotInitializedError, "call ringtrain.init() first", ringtrain.rank)
    expect(
        ringtrain.NotInitializedError,
        "call ringtrain.init() first",
        lambda: ringtrain.allreduce(np.ones(2)),
    )
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()

    if n > 1:
        # Every rank sees the mismatch, named, with per-rank values.
        expect(
            ringtrain.MismatchError,
            "tensor 'shape': shape differs across ranks (rank 0: (3,)",
            lambda: ringtrain.allreduce(np.ones(3 + (r == n - 1)), name="shape"),
        )
        expect(
            ringtrain.MismatchError,
            "dtype differs across ranks (rank 0: float32",
            lambda: ringtrain.allreduce(np.ones(3, np.float64 if r else np.float32), name="dtype"),
        )
        expect(
            ringtrain.MismatchError,
            "op differs across ranks (rank 0: Sum, rank 1: Max",
            lambda: ringtrain.allreduce(
                np.ones(2), name="op", op=ringtrain.Max if r else ringtrain.Sum
            ),
        )
        expect(
            ringtrain.MismatchError,
            "root differs across ranks (rank 0: 0, rank 1: 1",
            lambda: ringtrain.broadcast(np.ones(2), min(r, 1), name="root"),
        )
        expect(
            ringtrain.MismatchError,
            "prescale differs across ranks",
            lambda: ringtrain.allreduce(np.ones(2), name="pre", prescale_factor=1.0 + r),
        )
        expect(
            ringtrain.MismatchError,
            "operation differs across ranks",
            lambda: ringtrain.synchronize(
                ringtrain.allgather_async(np.ones(2), name="kind")
                if r
                else ringtrain.allreduce_async(np.ones(2), name="kind")
            ),
        )
        shapes = ", ".join(f"rank {i}: ({2 + (i == n - 1)},)" for i in range(n))
        expect(
            ringtrain.MismatchError,
            f"tensor 'grp.1' (member 1 of group 'grp'): shape differs across ranks ({shapes})",
            lambda: ringtrain.grouped_allreduce(
                [np.ones(1), np.ones(2 + (r == n - 1))], name="grp"
            ),
        )
        expect(
            ringtrain.MismatchError,
            "rank 0: a group of 2, rank 1: a single tensor",
            lambda: ringtrain.synchronize(
                ringtrain.allreduce_async(np.ones(3), name="grp2")
                if r
                else ringtrain.grouped_allreduce_async([np.ones(1), np.ones(2)], name="grp2")
            ),
        )
        expect(
            ringtrain.MismatchError,
            "trailing_shape differs",
            lambda: ringtrain.allgather(np.ones((1, 2 + r)), name="trail"),
        )

    # The engine keeps working after errors.
    assert_equal(
        ringtrain.allreduce(np.ones(5), op=ringtrain.Sum, name="fine"),
        np.full(5, float(n)),
        "after mismatches",
    )

    # A group needs tensors, all of one dtype and all on the host or all on the device.
    expect(ValueError, "needs at least one tensor", lambda: ringtrain.grouped_allreduce([]))
    expect(
        TypeError,
        "tensor 1 is a float64 host array, but tensor 0 is float32 on the host",
        lambda: ringtrain.grouped_allreduce([np.ones(2, np.float32), np.ones(2)]),
    )

    # A name in flight cannot be submitted again.
    h = ringtrain.allreduce_async(np.ones(2), name="twice")
    expect(
        ringtrain.DuplicateNameError,
        "'twice' was submitted again",
        lambda: ringtrain.allreduce_async(np.ones(2), name="twice"),
    )
    ringtrain.synchronize(h)

    # Local argument checks name the bad value.
    expect(
        TypeError, "unsupported dtype complex128", lambda: ringtrain.allreduce(np.ones(2, complex))
    )
    expect(ValueError, "unknown reduction op 17", lambda: ringtrain.allreduce(np.ones(2), op=17))
    expect(
        ValueError,
        "prescale_factor must be 1.0 for integer dtype int32, got 2.0",
        lambda: ringtrain.allreduce(np.ones(2, np.int32), prescale_factor=2),
    )
    expect(
        ValueError, f"root_rank {n} is outside [0, {n})", lambda: ringtrain.broadcast(np.ones(2), n)
    )
    expect(ValueError, "must be", lambda: ringtrain.alltoall(np.ones(3), splits=[3] + [1] * n))
    expect(ValueError, "at least one dimension", lambda: ringtrain.allgather(np.float32(1)))
    expect(
        ValueError,
        "out has shape (3,) and dtype float64; expected shape (2,)",
        lambda: ringtrain.allreduce(np.ones(2), out=np.empty(3)),
    )
    ringtrain.shutdown()
    expect(ringtrain.NotInitializedError, "call ringtrain.init() first", ringtrain.size)


main(body)
