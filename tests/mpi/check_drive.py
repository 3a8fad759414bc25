"""Blocking calls take the engine's turns in the caller's thread, and hand them back.

Each rank records which thread made every transport call (the transport's method is
wrapped, MPI is not).
"""

import threading
import time

import numpy as np
from common import assert_equal, expected, main, rank_data, same_bits_everywhere

import ringtrain
from ringtrain import runtime

LENGTHS = [0, 1, 7, 1000, 262_147]


def record_threads(engine):
    """Return the list of threads that run the engine's transport calls, filled in order.

    Every allreduce of this check takes one ``allreduce_new`` call of the engine's
    transport (the seam), in the order the responses run.
    """
    ran = []
    transport = engine.transport
    allreduce_new = transport.allreduce_new

    def recording(*args):
        ran.append(threading.current_thread().name)
        return allreduce_new(*args)

    transport.allreduce_new = recording
    return ran


def check(got, shape, salt, what):
    n = ringtrain.size()
    want = expected(ringtrain.Sum, [rank_data(k, shape, np.float32, salt) for k in range(n)], "f4")
    assert_equal(got, want, what)


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    ran = record_threads(runtime.current().engine)

    # Blocking calls, every rank on time: the caller runs them itself.
    names, threads = [], []
    for round_ in range(8):
        for length in LENGTHS:
            name, salt = f"b{round_}.{length}", round_ * 100 + length
            got = ringtrain.allreduce(
                rank_data(r, (length,), np.float32, salt), name=name, op=ringtrain.Sum
            )
            check(got, (length,), salt, name)
            same_bits_everywhere(got, name)
            names.append(name)
            threads.append(ran[-1])
    assert len(ran) == len(names), f"{len(ran)} transport calls for {len(names)} allreduces"
    by_caller = threads.count("MainThread")
    print(f"rank {r}: {by_caller} of {len(names)} blocking calls ran in the caller", flush=True)
    if n == 1:  # a single rank leaves its turns to the engine thread
        assert by_caller == 0, f"{by_caller} of {len(names)} ran in the caller at one rank"
    else:
        # Ranks that outnumber the cores wait for descheduled peers, and give up turns more.
        least = len(names) // 2 + 1 if n == 2 else 1
        assert by_caller >= least, f"only {by_caller} of {len(names)} ran in the caller"

    # A peer that comes late: the waiting caller stops taking turns and the engine thread
    # completes the call.
    if r == 0:
        time.sleep(0.3)
    got = ringtrain.allreduce(rank_data(r, (33,), np.float32, 7), name="late", op=ringtrain.Sum)
    check(got, (33,), 7, "late")
    if r != 0 and n > 1:
        assert ran[-1] == "ringtrain-engine", f"'late' ran in {ran[-1]}"

    # Several threads block at once, with a group and an async call beside them: one takes
    # the turns, the others wait; every result is right.
    errors = []

    def worker(t):
        try:
            for i in range(10):
                salt = 1000 + 10 * t + i
                name = f"w{t}.{i}"
                shape = (LENGTHS[(t + i) % len(LENGTHS)],)
                data = rank_data(r, shape, np.float32, salt)
                if i % 3 == 0:
                    handle = ringtrain.allreduce_async(data, name=name, op=ringtrain.Sum)
                    got = ringtrain.synchronize(handle)
                elif i % 3 == 1:
                    got = ringtrain.grouped_allreduce([data, data], name=name, op=ringtrain.Sum)
                    check(got[1], shape, salt, f"{name}[1]")
                    got = got[0]
                else:
                    got = ringtrain.allreduce(data, name=name, op=ringtrain.Sum)
                check(got, shape, salt, name)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {t}: {err!r}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a worker thread hangs"
    assert not errors, errors
    ringtrain.shutdown()
    print(f"rank {r}: OK", flush=True)


if __name__ == "__main__":
    main(body)
