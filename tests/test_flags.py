"""Progress flags: counts land one per cache line, and a wait returns once a count is reached."""

import threading
import time

import numba
import numpy as np
import pytest

from ringtrain.errors import CollectiveTimeoutError
from ringtrain.topology import Topology
from ringtrain.transport import flags
from ringtrain.transport.progress import Waiter


def _waiter(timeout=0.0, size=1):
    """Return a Waiter of rank 0 among ``size`` ranks, each on its own host."""
    names = tuple(f"host{q}" for q in range(size))
    topology = Topology(0, size, 0, 1, 0, size, tuple(range(size)), names, tuple(range(size)))
    return Waiter(timeout, topology)


def test_each_flag_has_its_own_cache_line():
    words = np.zeros(flags.flag_words(3), np.uint64)
    assert words.nbytes == 3 * 64
    flags.publish(words, 1, 7)
    assert [flags.observe(words, i) for i in range(3)] == [0, 7, 0]
    assert np.flatnonzero(words).tolist() == [flags.STRIDE]


def test_the_fenced_forms_store_and_load_the_same_words():
    # Used where the processor may reorder memory accesses; their values must agree here too.
    words = np.zeros(flags.flag_words(2), np.uint64)
    flags.store(words, 1, np.uint64(2**40 + 5))
    assert int(flags.load(words, 1)) == 2**40 + 5 == flags.observe(words, 1)


def test_wait_until_returns_once_another_thread_publishes_enough():
    words = np.zeros(flags.flag_words(1), np.uint64)
    flags.wait_until(words, 0, 0, _waiter())  # already there
    done = threading.Event()

    def waiter():
        flags.wait_until(words, 0, 3, _waiter())
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    flags.publish(words, 0, 2)
    assert not done.wait(0.2), "returned before the count reached its target"
    flags.publish(words, 0, 3)
    assert done.wait(10), "did not return once the count reached its target"
    thread.join()


@numba.njit
def _note_counts(words, out, start):
    """At step k, note flag 0 once it has reached k + 1 (a compiled loop for follow)."""
    for step in range(start, len(out)):
        if not flags.reached(words, 0, step + 1):
            return flags.waiting(step, 0, step + 1)
        out[step] = flags.load(words, 0)
    return flags.through(len(out))


def test_follow_waits_in_python_and_resumes_a_compiled_loop_where_it_stopped():
    words = np.zeros(flags.flag_words(1), np.uint64)
    out = np.zeros(5, np.int64)
    flags.publish(words, 0, 2)  # the first two steps may run at once
    outcomes = []
    # A daemon thread, so that a loop that never finishes fails the test instead of hanging it.
    follower = threading.Thread(
        target=lambda: outcomes.append(flags.follow(_note_counts, words, _waiter(), out)),
        daemon=True,
    )
    follower.start()
    for count in range(3, 6):
        time.sleep(0.05)
        flags.publish(words, 0, count)
    follower.join(10)
    assert outcomes == [(flags.DONE, 0, 0, 0)], "follow did not finish the loop"
    # Each step ran once, and only after its count was published.
    assert all(out[k] >= k + 1 for k in range(5)), out
    assert out.tolist() == sorted(out.tolist()), out


def test_a_flag_that_never_moves_fails_the_wait_naming_its_rank_and_host():
    words = np.zeros(flags.flag_words(6), np.uint64)
    began = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"waited 0 s for rank 1 on host1") as caught:
        flags.wait_until(words, 4, 1, _waiter(timeout=0.3, size=3))  # flag 4: rank 1's
    assert 0.3 <= time.monotonic() - began < 5
    assert caught.value.peers == ((1, "host1"),)
