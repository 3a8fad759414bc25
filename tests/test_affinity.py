"""How a host's cores are divided among its ranks: CPU lists, physical cores, shares."""

import contextlib
import os

import pytest

from ringtrain import affinity


def topology(packages, cores_per_package, threads_per_core):
    """Return a sysfs reader for a machine numbered as Linux numbers Intel's.

    CPUs 0..P*C-1 are the first thread of every core, package after package; the next block
    holds every core's second thread, and so on.
    """
    cores = packages * cores_per_package
    files = {}
    for thread in range(threads_per_core):
        for core in range(cores):
            cpu = thread * cores + core
            siblings = [t * cores + core for t in range(threads_per_core)]
            files[cpu] = {
                "physical_package_id": str(core // cores_per_package),
                "thread_siblings_list": ",".join(map(str, siblings)),
            }
    return lambda cpu, name: files.get(cpu, {}).get(name)


def unreadable(cpu, name):
    return None


@pytest.mark.parametrize(
    ("text", "cpus"),
    [(None, set()), ("", set()), ("5", {5}), ("0-3,8", {0, 1, 2, 3, 8}), ("2-2, 6-7", {2, 6, 7})],
)
def test_cpu_lists(text, cpus):
    assert affinity.parse_cpu_list(text) == cpus


def test_hyperthread_siblings_make_one_core_and_packages_come_in_order():
    read = topology(packages=2, cores_per_package=2, threads_per_core=2)
    assert affinity.physical_cores(range(8), read) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # A set that holds one thread of a core holds a core of one CPU.
    assert affinity.physical_cores({0, 1, 4}, read) == [(0, 4), (1,)]
    assert affinity.physical_cores(set(), read) == []


def test_a_cpu_without_topology_is_a_core_of_its_own():
    assert affinity.physical_cores({3, 1, 2}, unreadable) == [(1,), (2,), (3,)]


@pytest.mark.parametrize("cores", range(10))
@pytest.mark.parametrize("count", range(1, 6))
def test_divide_keeps_order_and_sizes_differ_by_one_at_most(cores, count):
    runs = affinity.divide(list(range(cores)), count)
    assert len(runs) == count
    assert [c for run in runs for c in run] == list(range(cores))
    sizes = [len(run) for run in runs]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_two_ranks_take_a_package_each_and_never_split_a_core():
    read = topology(packages=2, cores_per_package=2, threads_per_core=2)
    everything = set(range(8))
    assert affinity.shares([everything, everything], read) == [{0, 1, 4, 5}, {2, 3, 6, 7}]


def test_uneven_shares_go_to_the_first_ranks():
    cpus = set(range(4))
    assert affinity.shares([cpus] * 3, unreadable) == [{0, 1}, {2}, {3}]


def test_ranks_keep_their_set_when_alone_bound_or_outnumbering_the_cores():
    assert affinity.shares([{0, 1}], unreadable) == [None]
    assert affinity.shares([], unreadable) == []
    # Bound by the launcher: every rank holds a set of its own.
    assert affinity.shares([{0}, {1}, {2}], unreadable) == [None, None, None]
    # More ranks than cores: dividing would leave some rank without one.
    assert affinity.shares([{0, 1}] * 3, unreadable) == [None, None, None]
    read = topology(packages=1, cores_per_package=1, threads_per_core=2)
    assert affinity.shares([{0, 1}] * 2, read) == [None, None]  # two threads, one core


def test_ranks_that_share_a_set_divide_it_and_only_it():
    # A launcher that bound ranks 0 and 2 to one package and 1 and 3 to the other.
    read = topology(packages=2, cores_per_package=2, threads_per_core=1)
    first, second = {0, 1}, {2, 3}
    assert affinity.shares([first, second, first, second], read) == [{0}, {2}, {1}, {3}]


def test_a_refused_pin_warns_and_leaves_the_threads_where_they_were(monkeypatch):
    def refuse(tid, cpus):
        raise PermissionError(1, "Operation not permitted")

    before = affinity.current()
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    with pytest.warns(UserWarning, match=r"cannot pin thread \d+ to CPUs \[0\]: .*not permitted"):
        affinity.pin_process(frozenset([0]))
    assert affinity.current() == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_unbind_gives_back_the_cpus_of_threads_on_the_share_and_only_those():
    import threading

    start = affinity.current()
    share = frozenset([min(start)])
    stop = threading.Event()
    owner_pinned = threading.Thread(target=stop.wait)
    owner_pinned.start()
    os.sched_setaffinity(owner_pinned.native_id, share)  # by its owner, before the binding
    try:
        binding = affinity.Binding(share, start, affinity.pin_process(share))
        assert affinity.current() == share
        late = threading.Thread(target=stop.wait)  # inherits the share
        late.start()
        affinity.unbind(binding)
        masks = [frozenset(os.sched_getaffinity(t.native_id)) for t in (owner_pinned, late)]
        assert [affinity.current(), *masks] == [start, share, start]
        affinity.unbind(None)  # a rank that was never pinned: nothing to do
        assert affinity.current() == start
    finally:
        stop.set()
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
                os.sched_setaffinity(int(tid), start)


def test_the_ranks_of_one_machine_divide_its_cores_whatever_their_hostnames():
    # Four ranks, two per hostname, all on one kernel (network-namespace hosts): they
    # divide the machine's set together, so no two of them are given the same core.
    cpus = frozenset({0, 1})
    everyone = [("boot-a", cpus)] * 4
    assert affinity.machine_mates(everyone, 2) == ([cpus] * 4, 2)
    assert affinity.shares([cpus] * 4, unreadable) == [None] * 4  # more ranks than cores
    # Two machines: each divides its own.
    everyone = [("boot-a", cpus), ("boot-b", cpus), ("boot-a", cpus), ("boot-b", cpus)]
    assert affinity.machine_mates(everyone, 3) == ([cpus, cpus], 1)
    assert affinity.machine_mates(everyone, 0) == ([cpus, cpus], 0)


def test_ranks_that_do_not_want_binding_neither_get_nor_hold_a_share():
    cpus = frozenset(range(4))
    everyone = [("m", cpus), ("m", None), ("m", cpus)]
    assert affinity.machine_mates(everyone, 1) is None
    assert affinity.machine_mates(everyone, 2) == ([cpus, cpus], 1)


def test_the_machine_id_is_the_kernels_boot_id_and_none_where_unreadable(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("0f5e\n")
    assert affinity.machine_id(boot) == "0f5e"
    assert affinity.machine_id(tmp_path / "missing") is None
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert affinity.machine_id() == affinity.machine_id()
