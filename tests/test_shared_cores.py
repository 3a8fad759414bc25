"""Ranks that share cores, as other jobs' ranks or other hosts' on one machine, still finish.

Each job allreduces 0, 1, an uneven count, 1 MiB and 16 MiB of float32 against NumPy,
between MPI barriers of its own (``tests/mpi/check_shared_cores.py``).
"""

import threading

import pytest
from mpi_launch import check

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("np", [3, 4])
def test_ranks_that_outnumber_the_cores_finish_with_binding_on(np):
    result = check("check_shared_cores.py", np, "default", env=_BIND, timeout=180)
    assert result.stdout.count("every allreduce matched") == np


@pytest.mark.parametrize("np", [3, 4])
def test_ranks_pinned_two_to_a_core_each_in_a_session_of_its_own_finish(np):
    # A session each: the kernel schedules each rank in a group of its own, as it does the
    # ranks of two jobs, or of two network-namespace hosts, started apart.
    result = check(
        "check_shared_cores.py", np, "paired", env=_BIND, timeout=180,
        prefix=("setsid", "--wait"),
    )  # fmt: skip
    assert result.stdout.count("every allreduce matched") == np


def test_two_jobs_of_two_ranks_on_one_host_at_once_both_finish():
    # Each job binds its ranks to its own shares of the cores, which the other job's hold too.
    results, errors = [], []

    def job():
        try:
            results.append(check("check_shared_cores.py", 2, "default", env=_BIND,
                                 timeout=180))  # fmt: skip
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    jobs = [threading.Thread(target=job) for _ in range(2)]
    for thread in jobs:
        thread.start()
    for thread in jobs:
        thread.join()
    assert not errors, errors
    assert [r.stdout.count("every allreduce matched") for r in results] == [2, 2]


_BIND = {"RINGTRAIN_BIND_CORES": "1"}


def test_an_idle_job_wakes_each_engine_about_once_a_second():
    # -np 4 on 2 cores, 4 s with nothing submitted: each engine thread's wake-ups, from /proc.
    result = check("check_idle.py", 4, "4", timeout=120)
    assert result.stdout.count("the engine thread woke") == 4, result.stdout
