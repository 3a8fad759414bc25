"""Gives each rank on a host its own share of the cores that the launcher left it.

Ranks started without binding (``mpirun --bind-to none``, ``ringtrain-run``) may each run on
every core of the host, so their threads (TensorFlow's pools, the engine) migrate between
cores and preempt each other's. At ``init()`` the ranks of a host that hold the same CPU set
divide its physical cores among themselves in local-rank order, and each pins its threads to
its share; threads started later inherit it, and ``shutdown()`` gives them their CPUs back. A
rank that the launcher has bound keeps its own set, and so do ranks that share a set of fewer
cores than there are of them.

"A host" here is one kernel (``machine_id``), not one hostname: ranks of several hosts that
run on one machine (network namespaces, containers) see the same cores, and dividing them by
hostname put ranks of different hosts on the same core, where the kernel let one starve the
other (docs/troubleshooting.md, ranks that share cores).
"""

import os
import warnings
from typing import NamedTuple

_TOPOLOGY = "/sys/devices/system/cpu/cpu{}/topology/{}"


def _read_topology(cpu, name):
    try:
        with open(_TOPOLOGY.format(cpu, name), encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def parse_cpu_list(text) -> set[int]:
    """Return the CPUs of a Linux CPU list such as ``"0-3,8"`` (empty for None or "")."""
    cpus = set()
    for part in (text or "").split(","):
        if part.strip():
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def physical_cores(cpus, read=_read_topology) -> list[tuple[int, ...]]:
    """Return the CPUs of ``cpus`` grouped by physical core, ordered by package, then first CPU.

    ``read(cpu, name)`` returns the text of the CPU's sysfs topology file ``name``, or None;
    a CPU whose topology cannot be read counts as a core of its own.
    """
    cpus = set(cpus)
    cores = {}
    for cpu in sorted(cpus):
        siblings = (parse_cpu_list(read(cpu, "thread_siblings_list")) & cpus) | {cpu}
        package = read(cpu, "physical_package_id")
        cores[(int(package) if package else 0, min(siblings))] = tuple(sorted(siblings))
    return [cores[key] for key in sorted(cores)]


def divide(cores, count) -> list[list]:
    """Split ``cores`` into ``count`` runs of consecutive cores, sizes differing by one at most."""
    base, extra = divmod(len(cores), count)
    runs, start = [], 0
    for k in range(count):
        stop = start + base + (k < extra)
        runs.append(list(cores[start:stop]))
        start = stop
    return runs


def shares(masks, read=_read_topology) -> list[frozenset | None]:
    """Return the CPUs each local rank pins to, from every local rank's CPU set, in rank order.

    Ranks that hold the same set divide its physical cores (``divide``); None for a rank that
    keeps its set: one alone with it, or one of more ranks than the set has cores.
    """
    groups = {}
    for rank, mask in enumerate(masks):
        groups.setdefault(frozenset(mask), []).append(rank)
    result = [None] * len(masks)
    for mask, ranks in groups.items():
        cores = physical_cores(mask, read)
        if len(ranks) < 2 or len(cores) < len(ranks):
            continue
        for rank, run in zip(ranks, divide(cores, len(ranks)), strict=True):
            result[rank] = frozenset(cpu for core in run for cpu in core)
    return result


def current() -> frozenset | None:
    """Return the CPUs this thread may run on, or None where the OS does not say."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def pin_process(cpus, holding=None, keep=frozenset()) -> frozenset:
    """Pin every thread of this process that may run on ``holding`` to ``cpus``.

    ``holding`` defaults to where this thread may run. Threads pinned elsewhere (by their
    owner), and those whose ids are in ``keep``, stay where they are; returns the ids of the
    threads left alone. Where the system refuses, this warns and leaves the threads not yet
    pinned where they were.
    """
    before = current() if holding is None else holding
    left = set()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if tid in keep or frozenset(os.sched_getaffinity(tid)) != before:
                left.add(tid)
            else:
                os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
        except OSError as err:
            warnings.warn(
                f"ringtrain: cannot pin thread {tid} to CPUs {sorted(cpus)}: {err}; the rest of "
                "this rank's threads stay where they were (RINGTRAIN_BIND_CORES=0 skips this)",
                stacklevel=2,
            )
            break
    return frozenset(left)


class Binding(NamedTuple):
    """How ``bind_ranks`` pinned this rank: its share, the set before, the threads it left."""

    share: frozenset
    before: frozenset
    left: frozenset


_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def machine_id(path=_BOOT_ID) -> str | None:
    """Return the id of the kernel this process runs on, or None where it cannot be read.

    Linux draws a boot id at each boot and shows the same one in every network and UTS
    namespace and container on the machine: processes that share it share its cores.
    """
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def bind_ranks(comm, topology, wanted: bool) -> Binding | None:
    """Pin this rank to its share of the machine's cores if ``wanted``; return how, or None.

    Collective over ``comm``, whose hosts ``topology`` gives (every rank takes part, wanted
    or not). The ranks on one machine (``machine_id``; by hostname where it cannot be read)
    that want it divide a set, in rank order; the others keep theirs, and get None.
    """
    mask = current() if wanted else None
    machine = machine_id() or f"host {topology.host}"
    dividing = machine_mates(comm.allgather((machine, mask)), comm.Get_rank())
    if dividing is None:
        return None
    share, left = _pin_share_of(*dividing)
    return None if share is None else Binding(share, mask, left)


def machine_mates(everyone, rank) -> tuple[list, int] | None:
    """Return the CPU sets that ``rank``'s machine divides, and its place among them.

    ``everyone[r]`` is rank r's (machine, CPU set), the set None where the rank does not
    want binding; the sets are those of the ranks on ``rank``'s machine that want it, in
    rank order. None where ``rank`` does not want it.
    """
    machine, mask = everyone[rank]
    if mask is None:
        return None
    wanting = [r for r, (place, m) in enumerate(everyone) if place == machine and m is not None]
    return [everyone[r][1] for r in wanting], wanting.index(rank)


def unbind(binding: Binding | None) -> None:
    """Undo ``bind_ranks``: threads on the share get back the set before (None: no-op).

    Threads it left alone, and those that their owners have pinned elsewhere since, stay.
    """
    if binding is not None:
        pin_process(binding.before, holding=binding.share, keep=binding.left)


def pin_share(index: int, count: int) -> frozenset | None:
    """Pin this process to share ``index`` of ``count`` processes that hold the same CPU set.

    For processes started together without MPI (the benchmark's other contenders); returns
    the share, or None where the process keeps its set (see ``shares``).
    """
    mask = current()
    if mask is None:
        return None
    return _pin_share_of([mask] * count, index)[0]


def _pin_share_of(masks, index):
    """Pin this process to its share of ``shares(masks)``, number ``index``.

    Returns the share (None: none) and the ids of the threads that ``pin_process`` left.
    """
    share = shares(masks)[index]
    if share is None:
        return None, frozenset()
    return share, pin_process(share)
