"""The Waiter's reports of lost peers: relayed notices end sleeping waits, lingering is bounded."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from ringtrain.errors import CollectiveTimeoutError
from ringtrain.topology import Topology
from ringtrain.transport.progress import MIN_SPINS, SHORT_SLEEPS, SPINS, LostNotice, Waiter

# Rank 1 of a three-rank communicator whose ranks are 5, 6 and 7 of the job.
_HOSTS = ("hostA", "hostA", "hostB")
_WORLD = (5, 6, 7)


def _waiter(timeout=0.0):
    """Return the Waiter of rank 1 of the communicator above."""
    topology = Topology(1, 3, 1, 2, 0, 2, (0, 0, 2), _HOSTS, _WORLD)
    return Waiter(timeout, topology)


def _alone_waiter():
    """Return the Waiter of rank 2 of the communicator above, alone on hostB."""
    return Waiter(5.0, Topology(2, 3, 0, 1, 1, 2, (0, 0, 2), _HOSTS, _WORLD))


def _notice():
    return LostNotice(2, (0,), True, "rank 2 on hostB waited 3 s for rank 0")


def test_a_notice_ends_a_sleeping_wait_with_this_ranks_own_error():
    waiter = _waiter()  # no timeout: only the notice can end the wait
    polls = []
    waiter.listen(lambda: _notice() if len(polls) > 3 else polls.append(None))
    began = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as caught:
        waiter.until(lambda: False, [2], "a ring of 12 bytes")
    assert time.monotonic() - began < 5
    assert str(caught.value) == (
        "rank 1 on hostA gave up: rank 2 on hostB reported rank 0 on hostA frozen, dead or "
        "unreachable (rank 2 on hostB waited 3 s for rank 0); this rank was waiting for "
        "rank 2 on hostB during a ring of 12 bytes"
    )
    assert caught.value.peers == ((7, "hostB"),)  # whom this rank waited for: not blamed
    assert caught.value.reported_by == (7, "hostB")


def test_a_wait_that_completes_never_asks_for_notices():
    waiter = _waiter(timeout=5.0)
    waiter.listen(lambda: pytest.fail("a wait that completes while spinning asked"))
    waiter.until(lambda: True, [0], "a broadcast of 0 bytes")


def _ready_at(poll, polls):
    """Return a ready() that counts its calls in ``polls`` and is true from call ``poll`` on."""

    def ready():
        polls.append(None)
        return len(polls) >= poll

    return ready


def test_long_adapting_waits_halve_the_polls_of_the_next_down_to_a_floor():
    waiter = _alone_waiter()
    assert waiter.spins == SPINS
    expected = SPINS
    while expected > MIN_SPINS:
        polls = []
        ready = _ready_at(expected + SHORT_SLEEPS + 2, polls)
        waiter.until(ready, [0], "a ring of 4 bytes", adapt=True)
        assert len(polls) == expected + SHORT_SLEEPS + 2  # it polled ``expected`` times first
        expected = max(MIN_SPINS, expected // 2)
        assert waiter.spins == expected
    waiter.until(_ready_at(MIN_SPINS + 10, []), [0], "a ring of 4 bytes", adapt=True)
    assert waiter.spins == MIN_SPINS
    polls = []
    waiter.until(_ready_at(SPINS + SHORT_SLEEPS + 2, polls), [0], "a ring of 4 bytes")
    assert len(polls) == SPINS + SHORT_SLEEPS + 2  # other waits poll SPINS times
    assert waiter.spins == MIN_SPINS  # and leave the adapting waits' polls alone


def test_an_adapting_wait_that_ends_soon_after_its_polls_doubles_them():
    waiter = _alone_waiter()
    waiter.spins = MIN_SPINS
    waiter.until(_ready_at(MIN_SPINS + SHORT_SLEEPS + 1, []), [0], "a ring of 4 bytes", True)
    assert waiter.spins == 2 * MIN_SPINS
    waiter.until(_ready_at(2 * MIN_SPINS, []), [0], "a ring of 4 bytes", True)  # while polling
    assert waiter.spins == 2 * MIN_SPINS
    waiter.spins = SPINS
    waiter.until(_ready_at(SPINS + 1, []), [0], "a ring of 4 bytes", True)
    assert waiter.spins == SPINS


def test_a_rank_that_shares_its_host_polls_every_wait_in_full():
    waiter = _waiter(timeout=5.0)  # rank 1, beside rank 0 on hostA
    polls = []
    waiter.until(_ready_at(SPINS + SHORT_SLEEPS + 2, polls), [2], "a ring of 4 bytes", True)
    assert len(polls) == SPINS + SHORT_SLEEPS + 2
    assert waiter.spins == SPINS


def test_a_rank_in_no_collective_says_so():
    error = _waiter().relayed(_notice(), [], "in no collective")
    assert str(error).endswith("; this rank was in no collective")
    assert error.peers == ()


def test_a_notice_that_comes_as_the_wait_times_out_wins():
    waiter = _waiter(timeout=0.05)
    waiter.listen(lambda: _notice() if time.monotonic() >= began + 0.05 else None)
    began = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as caught:
        waiter.until(lambda: False, [2], "a ring of 12 bytes")
    assert caught.value.reported_by == (7, "hostB")  # not "waited 0 s for rank 2"


def test_the_notice_names_the_ranks_of_the_communicator_and_carries_the_error():
    waiter = _waiter(timeout=3.0)
    found = waiter.timed_out([0, 2], "a ring of 0 bytes", 3.2)
    notice = waiter.notice(found)
    assert notice.reporter == 1 and notice.waited_for == (0, 2) and notice.found
    assert found.peers == ((5, "hostA"), (7, "hostB"))  # the job's ranks, for the launcher
    assert notice.reason == str(found) and found.reported_by is None


def test_a_rank_that_was_told_says_whom_it_waited_for_but_found_no_one_lost():
    waiter = _waiter()
    told = waiter.relayed(_notice(), [2], "a ring of 12 bytes")
    assert waiter.notice(told) == (1, (2,), False, str(told))


def test_a_report_taken_back_names_who_answered_and_who_never_did():
    waiter = _waiter()
    assert waiter.taken_back([2], [0]) == (
        "rank 1 on hostA: rank 2 on hostB answered after all (gave up in turn and said so), "
        "so it is not lost; rank 0 on hostA, waited for in turn, never answered"
    )
    assert waiter.taken_back([0], []).endswith("; every rank waited for in turn answered")


@pytest.mark.parametrize("pending", [False, True])
def test_linger_takes_its_time_and_listens_whether_or_not_the_requests_complete(pending):
    comm = MPI.COMM_SELF
    buffer = np.zeros(1)
    requests = [comm.Irecv(buffer, 0, tag=9)]  # no send matches it: it never completes
    if not pending:
        requests[0].Cancel()
    waiter, listened = _waiter(), []
    waiter.listen(lambda: listened.append(None))
    began = time.monotonic()
    waiter.linger(requests, 0.2)
    assert listened
    assert 0.2 <= time.monotonic() - began < 5
    if pending:
        requests[0].Cancel()
    requests[0].Wait()
