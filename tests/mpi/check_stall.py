"""Tensors that some ranks never submit fail with StallError there, and the engine goes on.

Argument: the stall shutdown time in seconds. Ranks other than the last submit 'lonely' (one
tensor) and 'glonely' (a group); the last rank submits 'other' instead; ranks 0 and 1 stall
the same way in a process set of their own. Every such handle fails within the shutdown time
plus a margin, and then collectives over the job and the set give NumPy's answers. A rank's
late submission of a name it missed fails at once (its late one); the next round pairs.
"""

import sys
import time

import numpy as np
from common import assert_equal, expected, main, rank_data

import ringtrain

MARGIN = 4.0  # rank 0 checks for stalls once a second; the rest is slack for a loaded host


def expect_stall(handle, needles, within, what):
    """Fail unless ``handle`` fails with StallError naming ``needles`` within ``within`` s."""
    start = time.monotonic()
    try:
        ringtrain.synchronize(handle)
    except ringtrain.StallError as err:
        took = time.monotonic() - start
        print(f"rank {ringtrain.rank()}: StallError after {took:.1f} s: {err}", flush=True)
        for needle in needles:
            assert needle in str(err), f"{what}: {needle!r} not in {err}"
        assert took <= within, f"{what}: StallError after {took:.1f} s, expected {within} s"
    else:
        raise AssertionError(f"{what}: synchronize returned; expected StallError")


def check_collectives_work(pair, r, n, salt):
    """Run collectives over the job and over ``pair`` and compare them with NumPy."""
    data = [rank_data(i, (1001,), np.float32, salt=salt) for i in range(n)]
    got = ringtrain.allreduce(data[r], op=ringtrain.Sum, name=f"after.{salt}")
    assert_equal(got, expected(ringtrain.Sum, data, np.float32), f"allreduce {salt}")
    root = n - 1
    got = ringtrain.broadcast(rank_data(r, (5, 3), np.int64, salt=salt), root)
    assert_equal(got, rank_data(root, (5, 3), np.int64, salt=salt), f"broadcast {salt}")
    grouped = [rank_data(i, (4,), np.float64, salt=salt) for i in range(n)]
    got = ringtrain.grouped_allreduce([grouped[r], 3 * grouped[r]], op=ringtrain.Sum)
    assert_equal(got[1], 3 * expected(ringtrain.Sum, grouped, np.float64), f"grouped {salt}")
    if r < 2:
        pairs = [rank_data(i, (17,), np.float64, salt=salt) for i in range(2)]
        got = ringtrain.allreduce(pairs[r], op=ringtrain.Max, process_set=pair)
        assert_equal(got, expected(ringtrain.Max, pairs, np.float64), f"set allreduce {salt}")


def body():
    shutdown = float(sys.argv[1])
    pair = ringtrain.ProcessSet([0, 1])
    ringtrain.init(stall_check_seconds=1.0, stall_shutdown_seconds=shutdown, process_sets=[pair])
    r, n = ringtrain.rank(), ringtrain.size()
    last, others = n - 1, list(range(n - 1))

    # Round 1: each stalled name fails where it was submitted, within the shutdown time.
    x = rank_data(r, (6,), np.float32)
    stalls = []
    if r != last:
        why = [f"for ranks [{last}], which have not submitted it", f"(ranks {others} have)"]
        stalls.append((ringtrain.allreduce_async(x, name="lonely"), ["'lonely'", *why]))
        group = ringtrain.grouped_allreduce_async([x, x[:2]], name="glonely")
        stalls.append((group, ["'glonely'", *why]))
    else:
        why = [f"for ranks {others}, which have not submitted it", f"(ranks [{last}] have)"]
        stalls.append((ringtrain.allreduce_async(x, name="other"), ["'other'", *why]))
    if r < 2:  # within the set, ranks are the set's: 0 and 1
        name, why = ("set-lonely", "for ranks [1]") if r == 0 else ("set-other", "for ranks [0]")
        stalls.append((ringtrain.allreduce_async(x, name=name, process_set=pair), [name, why]))
    for handle, needles in stalls:
        needles.append(f"stall shutdown after {shutdown:g} s")
        expect_stall(handle, needles, shutdown + MARGIN, "round 1")
    check_collectives_work(pair, r, n, salt=1)

    # Each rank's late submission of a name it missed fails at once, naming this rank.
    late = []
    if r == last:
        late += [ringtrain.allreduce_async(x, name="lonely")]
        late += [ringtrain.grouped_allreduce_async([x, x[:2]], name="glonely")]
    else:
        late += [ringtrain.allreduce_async(x, name="other")]
    if r < 2:
        name = "set-other" if r == 0 else "set-lonely"
        late += [ringtrain.allreduce_async(x, name=name, process_set=pair)]
    needles = [f"rank {r} submitted it after", "this late submission fails too"]  # set rank = r
    for handle in late:
        expect_stall(handle, needles, MARGIN, "late")
    check_collectives_work(pair, r, n, salt=2)

    # The names are free again: a new round of each pairs on every rank.
    data = [rank_data(i, (9,), np.float64, salt=3) for i in range(n)]
    for name in ("lonely", "other"):
        got = ringtrain.allreduce(data[r], op=ringtrain.Sum, name=name)
        assert_equal(got, expected(ringtrain.Sum, data, np.float64), f"new round of {name}")
    got = ringtrain.grouped_allreduce([data[r], data[r][:2]], op=ringtrain.Sum, name="glonely")
    assert_equal(got[1], expected(ringtrain.Sum, data, np.float64)[:2], "new round of glonely")
    if r < 2:
        for name in ("set-lonely", "set-other"):
            got = ringtrain.allreduce(data[r], op=ringtrain.Sum, name=name, process_set=pair)
            assert_equal(got, expected(ringtrain.Sum, data[:2], np.float64), f"set {name}")
    print(f"rank {r}: carried on", flush=True)
    ringtrain.shutdown()


main(body)
