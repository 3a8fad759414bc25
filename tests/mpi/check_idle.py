"""An idle job's engines sleep: each thread wakes at most about once a second.

Every rank runs a few allreduces (so that the engine has run and cached them), checks them
against NumPy, then submits nothing for ``seconds`` (argv[1]) while it counts its engine
thread's voluntary context switches in ``/proc``: each wake-up from a sleep is one. Prints
each rank's wake-ups a second; fails above ``MOST_PER_SECOND``.
"""

import sys
import time

import numpy as np
from common import assert_equal, expected, main, rank_data

import ringtrain
from ringtrain import runtime

# A heartbeat a second, and a little room for a wake-up that a submission or the last
# collective's tail left.
MOST_PER_SECOND = 1.5


def _switches(thread_id):
    with open(f"/proc/self/task/{thread_id}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for thread {thread_id}")


def body():
    seconds = float(sys.argv[1])
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    for step in range(3):
        for length in (0, 1, 1001):
            inputs = [rank_data(k, (length,), np.float32, 7 * step + length) for k in range(n)]
            got = ringtrain.allreduce(inputs[r], name=f"idle.{length}", op=ringtrain.Sum)
            want = expected(ringtrain.Sum, inputs, np.float32)
            assert_equal(got, want, f"allreduce of {length} before the idle time")
    time.sleep(1.0)  # the engine's spin after the last call, and its last heartbeat
    thread_id = runtime.current().engine.thread_id
    before = _switches(thread_id)
    time.sleep(seconds)
    rate = (_switches(thread_id) - before) / seconds
    print(f"rank {r}: the engine thread woke {rate:.2f} times a second while idle", flush=True)
    if rate > MOST_PER_SECOND:
        raise AssertionError(f"rank {r}: the idle engine woke {rate:.2f} times a second")
    ringtrain.shutdown()


if __name__ == "__main__":
    main(body)
