"""init() divides the host's cores among ranks started unbound, shutdown() gives them back.

Bound ranks are left alone by both.
Run under ``mpirun --bind-to none``, so every rank starts with the same CPU set. The physical
cores are read from sysfs here, independently of ringtrain.affinity.
"""

import os
import threading

import numpy as np
from common import assert_equal, main
from mpi4py import MPI

import ringtrain

world = MPI.COMM_WORLD


def siblings(cpu):
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            text = f.read()
    except OSError:
        return {cpu}
    cpus = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cores_of(cpus):
    return {frozenset(siblings(c) & cpus) for c in cpus}


def masks_of_threads(*threads):
    return [frozenset(os.sched_getaffinity(t.native_id)) for t in threads]


def reset(cpus):
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def check_an_allreduce(tag):
    r, n = world.Get_rank(), world.Get_size()
    got = ringtrain.allreduce(np.arange(5.0) * (r + 1), op=ringtrain.Sum, name=tag)
    assert_equal(got, np.arange(5.0) * (n * (n + 1) // 2), f"allreduce after {tag}")


def engine_thread():
    return next(t for t in threading.enumerate() if t.name == "ringtrain-engine")


def body():
    start = frozenset(os.sched_getaffinity(0))
    everyone = world.allgather(start)
    assert all(m == start for m in everyone), f"started bound: {everyone}"
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_size = local.Get_size()
    local.Free()
    # A thread started before init, and one its owner pinned to one CPU.
    stop = threading.Event()
    early = threading.Thread(target=stop.wait)
    pinned = threading.Thread(target=stop.wait)
    early.start()
    pinned.start()
    one = frozenset([min(start)])
    os.sched_setaffinity(pinned.native_id, one)

    # Off: nothing moves.
    ringtrain.init(bind_cores=False)
    mine = frozenset(os.sched_getaffinity(0))
    assert mine == start, f"bind_cores=False moved this rank to {sorted(mine)}"
    assert masks_of_threads(early, engine_thread()) == [start, start]
    check_an_allreduce("off")
    ringtrain.shutdown()

    # On (the default): a share of whole cores each, together every core, none twice.
    ringtrain.init()
    mine = frozenset(os.sched_getaffinity(0))
    shares = world.allgather(mine)
    if local_size > 1 and len(cores_of(start)) >= local_size:
        assert frozenset().union(*shares) == start, f"shares {shares} leave out some of {start}"
        assert sum(map(len, shares)) == len(start), f"shares {shares} overlap"
        assert all(cores_of(s) <= cores_of(start) for s in shares), f"{shares} split a core"
        counts = [len(cores_of(s)) for s in shares]
        assert max(counts) - min(counts) <= 1, f"uneven shares {shares}"
    else:
        assert mine == start, f"{local_size} ranks on {sorted(start)} moved to {sorted(mine)}"
    assert masks_of_threads(early, engine_thread()) == [mine, mine]
    assert masks_of_threads(pinned) == [one], "a thread pinned by its owner was moved"
    late = threading.Thread(target=stop.wait)  # as TensorFlow starts its pools after init
    late.start()
    check_an_allreduce("on")
    ringtrain.shutdown()
    # shutdown() gives every thread the CPUs it had (or would have had) before init.
    now = [frozenset(os.sched_getaffinity(0)), *masks_of_threads(early, late, pinned)]
    assert now == [start, start, start, one], f"after shutdown: {now}; expected {start}, {one}"

    # Bound before init (as a launcher binds): each rank keeps its own CPU.
    cpus = sorted(start)
    own = frozenset([cpus[world.Get_rank() % len(cpus)]])
    reset(own)
    ringtrain.init()
    mine = frozenset(os.sched_getaffinity(0))
    assert mine == own, f"a rank bound to {sorted(own)} moved to {sorted(mine)}"
    check_an_allreduce("bound")
    ringtrain.shutdown()
    mine = frozenset(os.sched_getaffinity(0))
    assert mine == own, f"shutdown moved a rank bound to {sorted(own)} to {sorted(mine)}"
    reset(start)
    stop.set()


main(body)
