"""The engine's turn-taking (``ringtrain.engine.turns``) with a plain-Python turn, no MPI.

The turn here completes queued handles one per turn and records which thread ran it, and
whether another thread was inside a turn at the same time.
"""

import threading
import time
import types

import pytest

from ringtrain.engine import turns as turns_module
from ringtrain.engine.handle import Handle, complete_all
from ringtrain.engine.turns import LONE_SPIN_SECONDS, SPIN_SECONDS, Turns
from ringtrain.topology import Topology


class Work:
    """A stand-in engine: handles queued by callers, one completed per turn."""

    def __init__(self, size, fail_on=None, spin=SPIN_SECONDS, idle=1.0):
        self.queue = []
        self.turns_taken = 0
        self.lock = threading.Lock()
        self.inside = threading.Lock()
        self.overlaps = 0
        self.ran_by = {}
        self.stopped = False
        self.aborts = []
        self.fail_on = fail_on
        self.turns = Turns(
            self.turn, lambda: self.stopped, lambda: bool(self.queue), lambda: False,
            self.abort, 0.001, size, spin, idle,
        )  # fmt: skip

    def turn(self):
        """Complete the next queued handle; return whether there was one."""
        self.turns_taken += 1
        if not self.inside.acquire(blocking=False):
            self.overlaps += 1  # another thread is inside a turn: the invariant broke
            return False
        try:
            with self.lock:
                handle = self.queue.pop(0) if self.queue else None
            if handle is None:
                return False
            if handle.name == self.fail_on:
                raise RuntimeError("a turn fails")
            time.sleep(0.0002)  # a turn takes a while, so that threads would meet inside
            self.ran_by[handle.name] = threading.current_thread().name
            complete_all([handle], [handle.name])
            return True
        finally:
            self.inside.release()

    def submit(self, name, wake=True):
        """Queue a handle named ``name``; wake the engine thread if ``wake``."""
        handle = Handle(name)
        with self.lock:
            self.queue.append(handle)
        if wake:
            self.turns.wake()
        return handle

    def abort(self, err, where):
        """Record a failed turn and stop, as the engine's abort would end the job."""
        self.aborts.append((repr(err), where))
        self.stopped = True

    def stop(self):
        """Stop the engine thread and wait for it."""
        self.stopped = True
        self.turns.join()


def test_one_thread_at_a_time_runs_turns_and_every_wait_returns_its_result():
    work = Work(size=2)
    work.turns.start()
    results, errors = {}, []

    def caller(t):
        try:
            for i in range(50):
                name = f"{t}.{i}"
                results[name] = work.turns.wait(work.submit(name, wake=i % 2 == 0))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(t,), name=f"caller{t}") for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    work.stop()
    assert not errors and not any(t.is_alive() for t in threads)
    assert results == {f"{t}.{i}": f"{t}.{i}" for t in range(4) for i in range(50)}
    assert work.overlaps == 0, "two threads were inside a turn at once"
    runners = set(work.ran_by.values())
    assert runners & {"caller0", "caller1", "caller2", "caller3"}, "no caller took a turn"


def test_a_caller_submitting_without_a_wake_up_runs_its_own_turn():
    work = Work(size=2)
    work.turns.start()
    time.sleep(0.05)  # the engine thread sleeps now
    assert work.turns.wait(work.submit("mine", wake=False)) == "mine"
    work.stop()
    assert work.ran_by["mine"] == "MainThread"


def test_a_single_rank_leaves_its_turns_to_the_engine_thread():
    work = Work(size=1)
    work.turns.start()
    for i in range(20):
        assert work.turns.wait(work.submit(f"h{i}", wake=i % 2 == 0)) == f"h{i}"
    work.stop()
    assert set(work.ran_by.values()) == {"ringtrain-engine"}


@pytest.mark.parametrize("size", [1, 2])
def test_a_failed_turn_is_handed_to_abort_naming_the_thread(size):
    work = Work(size=size, fail_on="bad")
    work.turns.start()
    time.sleep(0.05)
    handle = work.submit("bad", wake=False)
    waiter = threading.Thread(target=work.turns.wait, args=(handle,), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10
    while not work.aborts and time.monotonic() < deadline:
        time.sleep(0.01)
    work.stop()
    assert len(work.aborts) == 1
    err, where = work.aborts[0]
    assert "a turn fails" in err
    if size == 1:
        assert where == "its own thread"
    else:
        assert where in ("its own thread", f"thread {waiter.name!r}, which waits for its call")


def test_a_rank_alone_on_its_host_spins_less_between_turns():
    def alone(size, local_size):
        hosts = tuple(range(size))
        topology = Topology(0, size, 0, local_size, 0, size, hosts, ("h",) * size, hosts)
        return topology.alone_on_host

    assert alone(2, 1) and alone(3, 1) and LONE_SPIN_SECONDS < SPIN_SECONDS
    assert not (alone(1, 1) or alone(4, 2) or alone(2, 2))


class SteppingClock:
    """A ``perf_counter`` that moves on 10 us each time it is read."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        """Return the time, 10 us on from the last read."""
        self.now += 1e-5
        return self.now


@pytest.mark.parametrize("spin", [SPIN_SECONDS, LONE_SPIN_SECONDS])
def test_the_engine_thread_spins_for_its_spin_time_after_progress_then_sleeps(monkeypatch, spin):
    # The clock moves 10 us a read, and the thread reads it once a turn while it spins: so
    # it yields spin / 10 us times after it starts, and as many after a turn that progressed.
    yields = []
    monkeypatch.setattr(turns_module, "time", SteppingClock())
    counting = types.SimpleNamespace(sched_yield=lambda: yields.append(1))
    monkeypatch.setattr(turns_module, "os", counting)
    work = Work(size=2, spin=spin)
    expected = round(spin / 1e-5)
    work.turns.start()
    _settle(yields, expected - 2)  # it spins, then sleeps
    started = len(yields)
    assert work.submit("one").wait() == "one"  # woken, it runs the turn
    _settle(yields, started + expected - 2)
    work.stop()
    assert abs(started - expected) <= 2, (started, expected)
    assert abs(len(yields) - started - expected) <= 2, (len(yields) - started, expected)


def _settle(yields, least):
    """Return once ``yields`` holds ``least`` or more and has stopped growing (10 s at most)."""
    deadline = time.monotonic() + 10
    while len(yields) < least and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the last few yields of the spin, if any


def test_an_idle_engine_thread_sleeps_until_woken_or_its_idle_time_is_up():
    # Nothing in flight: after its spin, the thread takes no turn for ``idle_seconds`` unless
    # a submission wakes it. An idle thread that woke every cycle (1 ms) let the kernel starve
    # a rank sharing its core with another host's rank polling in MPI (docs/troubleshooting.md).
    work = Work(size=2, idle=5.0)
    work.turns.start()
    time.sleep(0.1)  # its spin (2 ms) is long over
    idle_from = work.turns_taken
    time.sleep(0.3)
    assert work.turns_taken - idle_from <= 1, "the idle engine thread kept taking turns"
    started = time.monotonic()
    assert work.submit("wake").wait() == "wake"  # a submission wakes it at once
    assert time.monotonic() - started < 1.0
    work.stop()
