"""Unnamed calls pair by call site and count: a drift fails, naming each rank's call site.

Run with ``RINGTRAIN_UNNAMED_DRIFT_SECONDS`` low (the pytest wrapper sets 1). Also checks
integer Average, which truncates toward zero as Horovod does.
"""

import time
from pathlib import Path

import numpy as np
from common import assert_equal, main

import ringtrain

_SOURCE = Path(__file__).read_text().splitlines()
_FILE = Path(__file__).name


def line_of(marker):
    """Return the line number of the one line of this file that ends with ``marker``."""
    (line,) = [i + 1 for i, text in enumerate(_SOURCE) if text.endswith(f"# {marker}")]
    return line


def one_rank_leaves_a_loop_early(r, n):
    """Rank 0 runs 5 steps and the others 3, then all go on to the next unnamed call."""
    errors = []
    for step in range(5 if r == 0 else 3):
        try:
            got = ringtrain.allreduce(np.full(3, r + step, np.int64), op=ringtrain.Sum)  # loop
        except ringtrain.MismatchError as err:
            errors.append(str(err))
            break
        assert_equal(got, np.full(3, n * step + n * (n - 1) // 2, np.int64), f"step {step}")
    try:
        ringtrain.allreduce(np.ones(2), op=ringtrain.Sum)  # next
    except ringtrain.MismatchError as err:
        errors.append(str(err))

    loop = f"allreduce #3 at {_FILE}:{line_of('loop')}"
    after = f"allreduce #0 at {_FILE}:{line_of('next')}"
    # Rank 0 fails in the loop, and then its late call of the line the others had reached;
    # the others fail at that line.
    assert len(errors) == (2 if r == 0 else 1), f"rank {r} got errors {errors}"
    drift = errors[0]
    assert "unnamed collectives drifted apart" in drift, drift
    assert f"rank 0 at {loop}" in drift, drift
    for other in range(1, n):
        assert f"rank {other} at {after}" in drift, drift
    if r == 0:
        assert "submitted it after the drift check of unnamed calls" in errors[1], errors[1]

    # Named calls go on as before, and so do unnamed ones from other lines.
    got = ringtrain.allreduce(np.array([r], np.int32), op=ringtrain.Sum, name="after.drift")
    assert_equal(got, np.array([n * (n - 1) // 2], np.int32), "named call after the drift")
    for step in range(3):
        got = ringtrain.allgather(np.full((r + 1, 2), step, np.float32))
        assert_equal(got, np.full((n * (n + 1) // 2, 2), step, np.float32), "unnamed after")


def ranks_at_different_speeds(r, n):
    """Async unnamed calls from one line pair right though ranks submit them at their pace.

    The last rank pauses longer than the drift time between calls: waiting is no drift.
    """
    handles = []
    for step in range(6):
        if r == n - 1 and step in (2, 4):
            time.sleep(1.5)
        data = np.arange(4, dtype=np.float64) * (r + 1) + step
        handles.append(ringtrain.allreduce_async(data, op=ringtrain.Sum))
        handles.append(ringtrain.grouped_allreduce_async([data, data[:1]], op=ringtrain.Max))
    total = n * (n + 1) / 2
    for step in range(6):
        got = ringtrain.synchronize(handles[2 * step])
        assert_equal(got, np.arange(4, dtype=np.float64) * total + n * step, f"async sum {step}")
        top, first = ringtrain.synchronize(handles[2 * step + 1])
        want = np.arange(4, dtype=np.float64) * n + step
        assert_equal(top, want, f"async group max {step}")
        assert_equal(first, want[:1], f"async group max {step}, member 1")
    ringtrain.barrier()


def integer_average_truncates(r, n):
    """Integer Average rounds toward zero, as Horovod (C's integer division), not down."""
    for dtype in (np.int8, np.int32, np.int64):
        for length in (0, 1, 7):
            data = [np.random.default_rng(k).integers(-30, 30, length) for k in range(n)]
            mine = data[r].astype(dtype)
            total = np.sum(data, axis=0)
            want = np.trunc(total / n).astype(dtype)
            got = ringtrain.allreduce(mine, op=ringtrain.Average, name=f"avg.{dtype.__name__}")
            assert_equal(got, want, f"integer Average {dtype.__name__}, {length} long")
    # Sums that are negative and do not divide, where flooring would give one less.
    sums = np.array([-7, -1, -n - 1, -2 * n + 1, 5, -n, 0], np.int64)
    mine = sums // n + (r < sums % n)  # the ranks' shares add up to ``sums``
    want = np.trunc(sums / n).astype(np.int64)
    if n > 1:
        assert (want != sums // n).any(), "the case must tell truncation from flooring"
    got = ringtrain.allreduce(mine, op=ringtrain.Average, name="avg.negative")
    assert_equal(got, want, "integer Average of negative sums")
    rows = np.tile(mine[:, None], (1, 2)).astype(np.int32)
    share = np.array_split(np.arange(len(sums)), n)[r]
    got = ringtrain.reducescatter(rows, op=ringtrain.Average, name="avg.scatter")
    assert_equal(got, np.tile(want[share, None], (1, 2)).astype(np.int32), "reducescatter")


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    integer_average_truncates(r, n)
    ranks_at_different_speeds(r, n)
    if n > 1:
        one_rank_leaves_a_loop_early(r, n)
    ringtrain.shutdown()


main(body)
