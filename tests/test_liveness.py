"""The engine's heartbeat bookkeeping (``ringtrain.engine.liveness``), with a fake clock."""

from ringtrain.engine.liveness import Liveness, Reports
from ringtrain.transport.progress import LostNotice


class Clock:
    """A clock that moves only when told to."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        """Return the time it was set to."""
        return self.now


def test_a_rank_silent_past_the_timeout_is_named_with_how_long():
    clock = Clock()
    liveness = Liveness(5.0, 4, clock)
    clock.now += 4.0
    liveness.heard(1)
    clock.now += 2.0  # rank 1 heard 2 s ago, ranks 2 and 3 six seconds ago
    assert liveness.silent(range(1, 4)) == [(2, 6.0), (3, 6.0)]
    assert liveness.silent([1]) == []


def test_a_completed_collective_counts_as_hearing_from_everyone():
    clock = Clock()
    liveness = Liveness(5.0, 3, clock)
    clock.now += 60.0  # a long transfer: nobody beat meanwhile
    liveness.heard_all()
    clock.now += 1.0
    assert liveness.silent(range(3)) == []


def test_heartbeats_fall_due_every_quarter_of_the_timeout_and_at_most_every_second():
    clock = Clock()
    short = Liveness(2.0, 2, clock)
    assert short.beat_every == 0.5 and not short.beat_due()
    clock.now += 0.5
    assert short.beat_due()
    assert not short.beat_due()  # taken: the next one is half a second away
    clock.now += 0.49
    assert not short.beat_due()
    clock.now += 0.01
    assert short.beat_due()
    assert Liveness(300.0, 2, clock).beat_every == 1.0


def test_a_message_after_the_last_collective_counts_and_so_does_the_collective():
    clock = Clock()
    liveness = Liveness(5.0, 3, clock)
    clock.now += 3.0
    liveness.heard_all()
    clock.now += 3.0
    liveness.heard(2)
    clock.now += 2.5  # rank 1: 5.5 s since the collective; rank 2: 2.5 s since its message
    assert liveness.silent([1, 2]) == [(1, 5.5)]


def test_a_timeout_of_zero_turns_the_check_and_the_heartbeats_off():
    clock = Clock()
    off = Liveness(0.0, 2, clock)
    clock.now += 1e6
    assert off.silent([0, 1]) == [] and not off.beat_due()


def test_a_rank_that_answers_is_not_lost_and_leads_to_those_it_waited_for():
    """Rank 3 waited for 2, which waited for 1, the frozen one; 0 waited for 3 and for 1."""
    reports = Reports()
    assert reports.first() is None
    told = LostNotice(0, (3, 1), False, "rank 0 was told")
    wrong = LostNotice(3, (2,), True, "rank 3 waited for rank 2")
    reports.add([told, wrong])
    assert reports.first() is wrong  # the first that found ranks lost
    assert reports.unanswered(wrong.waited_for) == [2]  # rank 2 has not answered yet
    reports.add([LostNotice(2, (1,), False, "rank 2 was told")])
    assert reports.answered(2) and not reports.answered(1)
    assert reports.unanswered(wrong.waited_for) == [1]
    assert reports.unanswered([0, 2, 3]) == [1]  # the waits run in a circle: no one else
    reports.add([LostNotice(1, (), False, "")])  # had rank 1 answered too, no one is lost
    assert reports.unanswered(wrong.waited_for) == []


def test_the_reports_settle_once_every_rank_has_given_up_or_is_lost():
    """Four ranks: rank 1 froze; rank 0 found it lost, ranks 2 and 3 give up in turn."""
    reports = Reports()
    others = [1, 2, 3]  # as rank 0 sees them
    assert not reports.settled(others)  # no one has said anything
    reports.add([LostNotice(0, (1,), True, "rank 0 waited for rank 1")])
    assert not reports.settled(others)  # rank 1 is lost, but 2 and 3 have not given up
    reports.add([LostNotice(2, (0,), False, "rank 2 was told")])
    assert not reports.settled(others)
    reports.add([LostNotice(3, (0,), False, "rank 3 was told")])
    assert reports.settled(others)
    # Named only by ranks that were told, a silent rank is not known lost: keep waiting.
    told = Reports()
    told.add([LostNotice(2, (1,), False, "rank 2 was told"), LostNotice(3, (1,), False, "")])
    assert not told.settled([1, 2, 3])
