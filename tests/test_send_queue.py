"""The message transport's send queue, and a two-rank exchange's pieces and timed rate."""

import numpy as np
from mpi4py import MPI

from ringtrain.transport import messages
from ringtrain.transport.messages import _arrival_rate, _SendQueue, pair_piece_elements

_TAG = 21
_TIMED = messages._TIMED_SEND_BYTES // 4  # float32 elements of the smallest timed send


class _Clock:
    """A clock that moves only when told, so that the rate's arithmetic can be checked."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _receive_all(comm, queue, buffers):
    """Post a receive for each of ``buffers`` sent to this rank, and move ``queue`` to its end."""
    got = [np.empty_like(b) for b in buffers]
    receives = [comm.Irecv(g, 0, _TAG) for g in got]
    while not queue.progress():
        pass
    MPI.Request.Waitall(receives)
    return got


def test_sends_in_flight_together_count_the_time_they_share_once():
    comm, clock = MPI.COMM_SELF, _Clock()
    queue = _SendQueue(comm, 0, _TAG, depth=4, clock=clock)
    buffers = [np.full(_TIMED, i, np.float32) for i in range(4)]
    for number, buffer in enumerate(buffers, 1):
        assert queue.send(buffer) == number
    clock.now = 2.0  # all four in flight until now: 2 s of the link, not 8
    got = _receive_all(comm, queue, buffers)
    for sent, received in zip(buffers, got, strict=True):
        np.testing.assert_array_equal(received, sent)
    assert queue.completed == queue.queued == 4
    assert queue.rate() == 4 * buffers[0].nbytes / 2.0


def test_sends_one_at_a_time_count_each_and_no_time_between():
    comm, clock = MPI.COMM_SELF, _Clock()
    queue = _SendQueue(comm, 0, _TAG, depth=1, clock=clock)
    first, second = np.arange(_TIMED, dtype=np.float32), np.ones(_TIMED + 3, np.float32)
    queue.send(first)
    queue.send(second)  # waits behind the first
    got = np.empty_like(first)
    receive = comm.Irecv(got, 0, _TAG)
    clock.now = 1.0
    while queue.completed < 1:
        queue.progress()  # the first ends at 1 s, and the second starts then
    receive.Wait()
    clock.now = 4.0
    _receive_all(comm, queue, [second])
    clock.now = 10.0  # idle until a third send starts: not counted
    third = np.zeros(_TIMED, np.float32)
    queue.send(third)
    clock.now = 10.5
    _receive_all(comm, queue, [third])
    np.testing.assert_array_equal(got, first)
    sent = first.nbytes + second.nbytes + third.nbytes
    assert queue.rate() == sent / (1.0 + 3.0 + 0.5)


def test_small_sends_are_not_timed():
    comm, clock = MPI.COMM_SELF, _Clock()
    queue = _SendQueue(comm, 0, _TAG, depth=2, clock=clock)
    small = np.arange(_TIMED - 1, dtype=np.float32)
    queue.send(small)
    clock.now = 1.0
    _receive_all(comm, queue, [small])
    assert queue.rate() is None


def test_an_exchange_of_up_to_2_mib_goes_in_32_kib_pieces():
    mib = 1 << 18  # float32 elements of 1 MiB
    piece = 8192
    assert pair_piece_elements(mib, 2 * mib, 4) == piece  # 2 MiB: 64 pieces
    assert pair_piece_elements(mib, 1, 4) == piece
    assert pair_piece_elements(mib, 0, 4) == piece
    assert pair_piece_elements(mib, mib, 2) == 2 * piece  # 16-bit values: 2 MiB
    assert pair_piece_elements(1024, mib, 4) == 1024  # a smaller chunk setting wins
    # Past 2 MiB, the ring's rule: a Python step per piece costs more than it saves.
    assert pair_piece_elements(mib, 2 * mib + 1, 4) == messages.piece_elements(mib, 2 * mib + 1, 4)
    assert pair_piece_elements(mib, 8 * mib, 4) == mib


def test_an_exchange_times_what_arrived_after_its_first_piece():
    least = messages._TIMED_SEND_BYTES
    assert _arrival_rate(least, 2_000_000) == least / 2e-3
    assert _arrival_rate(least - 1, 2_000_000) is None  # too few bytes: latency rules them
    assert _arrival_rate(least, 0) is None  # one burst noticed at once: no time to divide
