"""Per-thread CPU time by role, read from /proc, against threads that burn known CPU."""

import os
import threading
import time

import pytest

from ringtrain.bench import thread_cpu

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/schedstat"), reason="needs Linux's scheduler statistics"
)


def _burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_each_thread_s_cpu_goes_to_its_role():
    before = thread_cpu.cpu_seconds()
    assert before[os.getpid()][1] >= 0
    sleeper_ready, sleeper_done = threading.Event(), threading.Event()

    def sleeper():
        _burn(0.2)
        sleeper_ready.set()
        sleeper_done.wait(10)

    second = threading.Thread(target=sleeper)
    second.start()
    sleeper_ready.wait(10)
    _burn(0.1)
    used = thread_cpu.by_role(before, thread_cpu.cpu_seconds())
    sleeper_done.set()
    second.join()
    assert set(used) == set(thread_cpu.ROLES)
    # The second thread counts as "other"; the main thread also ran this test's own code.
    assert used["other"] == pytest.approx(0.2, abs=0.02)
    assert used["main"] == pytest.approx(0.1, abs=0.03)
    assert used["tensorflow"] == 0.0


def test_roles_follow_tensorflow_s_thread_names_and_the_main_thread_id():
    assert thread_cpu.role_of(os.getpid() + 1, "tf_Compute") == "tensorflow"
    assert thread_cpu.role_of(os.getpid(), "python3") == "main"
    assert thread_cpu.role_of(os.getpid() + 1, "python3") == "other"


def test_nothing_is_reported_without_proc():
    assert thread_cpu.by_role({}, {}) == {}
