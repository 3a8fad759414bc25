"""CPU time of this process's threads by role, from Linux's /proc: where a step's CPU goes.

On a machine whose cores are all busy, a training step costs what its threads' CPU costs,
and CPU time drifts far less than throughput does from one run to the next.
"""

import os

ROLES = ("tensorflow", "main", "other")
_TASKS = "/proc/self/task"


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """Return per thread id of this process its name and CPU seconds so far.

    The time is the scheduler's own count, in nanoseconds (``schedstat``), not the 10 ms
    ticks of ``stat``. Empty without /proc or without scheduler statistics in the kernel.
    """
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return {}
    threads = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            with open(f"{_TASKS}/{tid}/schedstat", encoding="utf-8") as f:
                on_cpu_ns = int(f.read().split()[0])
        except FileNotFoundError:
            if not os.path.exists(f"{_TASKS}/{tid}"):
                continue  # the thread ended meanwhile
            return {}  # a kernel without scheduler statistics
        except OSError:
            continue  # the thread ended meanwhile
        threads[int(tid)] = (name, on_cpu_ns / 1e9)
    return threads


def role_of(tid: int, name: str) -> str:
    """Return the role of thread ``tid`` named ``name``: one of ``ROLES``.

    TensorFlow names its threads ``tf_...``; the main thread's id is the process id; the
    others are ringtrain's engine thread, MPI's and Python's own.
    """
    if name.startswith("tf_"):
        return "tensorflow"
    return "main" if tid == os.getpid() else "other"


def by_role(before: dict, after: dict) -> dict[str, float]:
    """Return the CPU seconds each role used between two ``cpu_seconds`` readings.

    Where ``cpu_seconds`` has nothing to read (both readings empty) the result is empty too.
    """
    if not after:
        return {}
    used = dict.fromkeys(ROLES, 0.0)
    for tid, (name, seconds) in after.items():
        used[role_of(tid, name)] += seconds - before.get(tid, (name, 0.0))[1]
    return used
