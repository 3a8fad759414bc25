"""Agreement rounds: every rank's ready slots ANDed, rank 0's batch count in word 0 (no MPI)."""

import numpy as np
import pytest

from ringtrain.engine.rounds import Rounds, slot_count
from ringtrain.errors import RingtrainError


class _Group:
    """The AND of ``size`` ranks' vectors, complete once every rank has started the round."""

    def __init__(self, size):
        self.size = size
        self.given: list[list] = [[] for _ in range(size)]  # per rank, its vectors in order

    def start_for(self, rank):
        def start(vector):
            self.given[rank].append(vector.copy())
            return _Pending(self, len(self.given[rank]) - 1)

        return start


class _Pending:
    def __init__(self, group, number):
        self._group = group
        self._number = number

    def test(self):
        given = self._group.given
        if any(len(vectors) <= self._number for vectors in given):
            return None
        result = given[0][self._number].copy()
        for vectors in given[1:]:
            result &= vectors[self._number]
        return result


def _ranks(size, slots=128):
    group = _Group(size)
    return [Rounds(slots, group.start_for(r), r == 0) for r in range(size)]


def test_slots_come_in_whole_words_of_64():
    assert [slot_count(c) for c in (0, 1, 64, 65, 1024)] == [0, 64, 64, 128, 1024]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_a_round_agrees_on_the_slots_every_rank_has_ready_and_carries_rank_0s_count(size):
    rng = np.random.default_rng(size)
    ranks = _ranks(size)
    ready = [set(rng.choice(128, size=40, replace=False).tolist()) for _ in range(size)]
    common = set.intersection(*ready)
    for rounds, slots in zip(ranks, ready, strict=True):
        for slot in slots:
            rounds.ready(slot)
        assert rounds.wants_round(0)
    for rank, rounds in enumerate(ranks):
        assert not rounds.poll()  # the ranks after it have not started the round yet
        rounds.start(batches_sent=7 if rank == 0 else 99)
    for rounds in ranks:
        assert rounds.poll() and rounds.completed == rounds.started == 1
        assert rounds.result == (sorted(common), 7)  # word 0 is rank 0's alone


def test_a_rank_with_nothing_ready_starts_no_round_until_a_batch_names_one():
    (rounds,) = _ranks(1)
    assert not rounds.wants_round(0)
    assert rounds.wants_round(1)  # a batch of rank 0 tagged with round 1 came
    rounds.start()
    assert not rounds.wants_round(1) and rounds.poll()
    assert rounds.result == ([], 0)


def test_ready_slots_that_did_not_change_start_no_new_round_until_retried():
    first, second = _ranks(2)
    first.ready(5)
    second.ready(70)
    for rounds in (first, second):
        rounds.start()
    for rounds in (first, second):
        assert rounds.poll() and rounds.result[0] == []
        rounds.result = None
        assert not rounds.wants_round(0)  # the same slots again would agree on nothing
    second.ready(5)  # a new submission: a round at once
    assert second.wants_round(0)


def test_a_slot_is_offered_while_a_round_that_carries_it_may_still_agree_it():
    first, second = _ranks(2)
    first.ready(3)
    first.ready(64)
    first.start()
    assert first.offered(3) and first.offered(64) and not first.offered(4)
    first.unready(3)  # withdrawn here: the round in flight still carries it
    assert first.offered(3)
    second.ready(64)
    second.start()
    assert first.poll() and first.result[0] == [64]
    assert first.offered(64) and not first.offered(3)  # agreed, not run yet
    first.result = None
    assert not first.offered(64)
    assert first.has_ready()  # until the engine runs it and takes it out
    first.unready(64)
    assert not first.has_ready()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_fingerprints_of_the_last_round_and_to_and_or_to_show_a_difference(size):
    ranks = _ranks(size)
    for rank, rounds in enumerate(ranks):
        rounds.start(fingerprint=0xF0F0 if rank < size - 1 else 0xF0F0)
    for rounds in ranks:
        assert rounds.poll() and rounds.fingerprints == (0xF0F0, 0xF0F0)
        rounds.result = None
    for rank, rounds in enumerate(ranks):
        rounds.start(fingerprint=0xF0F0 if rank < size - 1 else 0x0FF0)  # the last differs
    for rounds in ranks:
        assert rounds.poll() and rounds.fingerprints == (0x00F0, 0xFFF0)  # AND, OR


def test_rank_0_refuses_a_round_whose_word_0_is_not_its_own():
    group = _Group(2)
    first, second = (Rounds(64, group.start_for(r), r == 0) for r in range(2))
    first.start(batches_sent=5)
    second.start()
    group.given[1][0][0] = np.uint64(3)  # rank 1's word 0, overwritten in flight (not all ones)
    with pytest.raises(RingtrainError, match="word 0 came back as 1, not the 5 batches"):
        first.poll()
