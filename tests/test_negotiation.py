"""The coordinator, fusion planner and stall inspector, driven directly (no MPI)."""

import math
import pickle
import sys

import pytest

from ringtrain import call_site
from ringtrain.engine import fusion, messages
from ringtrain.engine.messages import Meta
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.stall import StallInspector


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _coordinator(size, threshold=1 << 20, capacity=16, warn=60.0, shutdown=None, drift=0.0):
    clock = _Clock()
    stall = StallInspector(warn, shutdown)
    return Coordinator(size, threshold, capacity, stall, drift, clock=clock), clock


def _ar(name, shape=(4,), dtype="float32", op=1, **kw):
    return Meta(name=name, kind=messages.ALLREDUCE, dtype=dtype, shape=shape, op=op, **kw)


def test_ready_only_when_every_rank_submitted_in_any_order():
    coord, _ = _coordinator(3)
    coord.add(0, [_ar("a"), _ar("b")])
    coord.add(2, [_ar("b")])
    assert coord.responses() == []
    coord.add(1, [_ar("b"), _ar("a")])
    coord.add(2, [_ar("a")])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and sorted(response.names) == ["a", "b"]
    assert not coord.pending()


def test_awaited_names_the_waiting_tensors_and_the_ranks_they_wait_for():
    coord, _ = _coordinator(4)
    assert coord.awaited() == ([], [])
    coord.add(0, [_ar("a"), _ar("b")])
    coord.add(2, [_ar("a")])
    coord.add(3, [_ar("b")])
    assert coord.awaited() == (["a", "b"], [1, 2, 3])
    coord.add(1, [_ar("a")])
    coord.add(3, [_ar("a")])  # "a" is ready: it waits for no one
    assert coord.awaited() == (["b"], [1, 2])
    join = Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    coord.add(1, [join])  # a joined rank is waited for no longer
    assert coord.awaited() == (["b"], [2])


def test_decided_says_whether_responses_has_anything():
    """``responses`` returns at once where ``decided`` is False: the two must agree."""
    coord, _ = _coordinator(2)
    join = Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    steps = [
        (0, [_ar("a")]),  # one rank of two: nothing to run
        (1, [_ar("a")]),  # ready
        (0, [_ar("b", shape=(2,))]),
        (1, [_ar("b", shape=(3,))]),  # ready, as a mismatch
        (0, [join]),  # a join evicts every cache id: "a" has one
        (1, [join]),  # every rank joined
        (1, [messages.SHUTDOWN_REQUEST]),
    ]
    expected = [False, True, False, True, True, True, True]
    assert not coord.decided() and coord.responses() == []
    for (rank, entries), decided in zip(steps, expected, strict=True):
        coord.add(rank, entries)
        assert coord.decided() is decided
        assert bool(coord.responses()) is decided
        if entries != [messages.SHUTDOWN_REQUEST]:  # a shutdown stays decided: the engine ends
            assert not coord.decided()  # responses() took it all


def test_fusion_respects_threshold_and_key():
    metas = [_ar(n, shape=(256,)) for n in "abcd"]  # 1 KiB each
    metas.append(_ar("e", shape=(256,), dtype="float64"))
    metas.append(_ar("f", shape=(256,), op=4))
    plan = fusion.plan(metas, threshold=2048)
    assert [[m.name for m in f] for f in plan] == [["a", "b"], ["c", "d"], ["e"], ["f"]]
    assert [[m.name for m in f] for f in fusion.plan(metas, threshold=0)] == [[n] for n in "abcdef"]


def test_tensors_fuse_only_with_the_same_wire_compression():
    metas = [_ar("a"), _ar("b", compression="float16"), _ar("c"), _ar("d", compression="float16")]
    metas.append(_ar("e", compression="bfloat16"))
    plan = fusion.plan(metas, threshold=1 << 20)
    assert [[m.name for m in f] for f in plan] == [["a", "c"], ["b", "d"], ["e"]]


def test_float16_counts_as_float32_in_the_buffer():
    assert fusion.nbytes_in_buffer(_ar("h", shape=(10,), dtype="float16")) == 40
    assert fusion.nbytes_in_buffer(_ar("b", shape=(3, 2), dtype="bfloat16")) == 24


@pytest.mark.parametrize(
    ("field", "other", "shown"),
    [
        ("shape", {"shape": (5,)}, "rank 0: (4,), rank 1: (5,)"),
        ("dtype", {"dtype": "float64"}, "rank 0: float32, rank 1: float64"),
        ("op", {"op": 4}, "rank 0: Sum, rank 1: Max"),
        ("prescale", {"prescale": 2.0}, "rank 0: 1.0, rank 1: 2.0"),
        ("postscale", {"postscale": 0.5}, "rank 0: 1.0, rank 1: 0.5"),
        ("compression", {"compression": "float16"}, "rank 0: none (float32), rank 1: float16"),
    ],
)
def test_mismatch_names_tensor_field_and_values(field, other, shown):
    coord, _ = _coordinator(2)
    coord.add(0, [_ar("w")])
    coord.add(1, [_ar("w", **other)])
    (response,) = coord.responses()
    assert response.error == f"tensor 'w': {field} differs across ranks ({shown})"
    coord.add(0, [_ar("next")])
    coord.add(1, [_ar("next")])
    (after,) = coord.responses()
    assert after.error is None and after.names == ["next"]


def test_broadcast_root_and_kind_mismatch():
    coord, _ = _coordinator(2)
    b = Meta(name="x", kind=messages.BROADCAST, dtype="int32", shape=(2,), root=0)
    coord.add(0, [b])
    coord.add(1, [Meta(name="x", kind=messages.BROADCAST, dtype="int32", shape=(2,), root=1)])
    assert "root differs across ranks (rank 0: 0, rank 1: 1)" in coord.responses()[0].error
    coord.add(0, [b])
    coord.add(1, [_ar("x", dtype="int32", shape=(2,))])
    assert "operation differs across ranks (rank 0: broadcast, rank 1: allreduce)" in (
        coord.responses()[0].error
    )


def test_allgather_first_dimension_may_differ_but_not_the_rest():
    coord, _ = _coordinator(2)
    coord.add(0, [Meta(name="g", kind=messages.ALLGATHER, dtype="int8", shape=(0, 3))])
    coord.add(1, [Meta(name="g", kind=messages.ALLGATHER, dtype="int8", shape=(5, 3))])
    (response,) = coord.responses()
    assert response.error is None
    assert [m.shape for m in response.per_rank[0]] == [(0, 3), (5, 3)]
    coord.add(0, [Meta(name="h", kind=messages.ALLGATHER, dtype="int8", shape=(1, 3))])
    coord.add(1, [Meta(name="h", kind=messages.ALLGATHER, dtype="int8", shape=(1, 4))])
    assert "trailing_shape differs" in coord.responses()[0].error


def _cached(coord, name, meta_of=_ar, size=2):
    """Negotiate ``name`` whole on every rank of ``size``; return the cache id it gets."""
    for rank in range(size):
        coord.add(rank, [meta_of(name)])
    (response,) = coord.responses()
    return response.cache_ids[name]


def test_an_evicted_ids_slot_takes_a_new_id_only_once_freed():
    coord = Coordinator(2, 1 << 20, 16, StallInspector(60.0, None), slots=2)
    first, second = _cached(coord, "a"), _cached(coord, "b")
    assert {first % 2, second % 2} == {0, 1}  # every live id has a slot of its own
    coord.add(0, [messages.Suspect("a")])
    (evicted,) = coord.responses()
    assert evicted.cache_ids == {"a": first}
    coord.add(0, [_ar("c")])
    coord.add(1, [_ar("c")])
    (uncached,) = coord.responses()  # "a"'s slot may still be offered, stale, in a round
    assert uncached.names == ["c"] and uncached.cache_ids == {}
    coord.free([first % 2])  # every rank has run the eviction
    third = _cached(coord, "d")
    assert third % 2 == first % 2 and third > second  # ids are never given twice
    assert not coord.decided()  # counted rounds never come here


def test_a_meta_sent_whole_while_cached_evicts_the_id_and_is_checked():
    coord, _ = _coordinator(2)
    ident = _cached(coord, "a")
    coord.add(1, [_ar("a", shape=(9,))])  # rank 1 changed its mind; rank 0 counted its "a"
    (evicted,) = coord.responses()
    assert evicted.kind == messages.EVICTED and evicted.cache_ids == {"a": ident}
    assert coord.responses() == []
    coord.add(0, [_ar("a")])  # rank 0 sends its counted one whole, as the eviction asks
    assert "shape differs across ranks (rank 0: (4,), rank 1: (9,))" in coord.responses()[0].error


def test_ids_go_only_to_kinds_every_rank_agrees_on_whole_and_up_to_the_capacity():
    coord, _ = _coordinator(2, capacity=2)
    gathered = Meta(name="g", kind=messages.ALLGATHER, dtype="int32", shape=(3,))
    coord.add(0, [gathered])
    coord.add(1, [gathered._replace(shape=(5,))])
    assert coord.responses()[0].cache_ids == {}  # an allgather's ranks differ in rows
    assert _cached(coord, "a") != _cached(coord, "b")
    coord.add(0, [_ar("c")])
    coord.add(1, [_ar("c")])
    assert coord.responses()[0].cache_ids == {}  # full


def test_cache_capacity_zero_assigns_no_ids():
    coord, _ = _coordinator(1, capacity=0)
    coord.add(0, [_ar("a")])
    assert coord.responses()[0].cache_ids == {}  # no ids to tell: nothing is sent


def _group(name, *shapes, **fields):
    total = sum(math.prod(s) for s in shapes)
    return _ar(name, shape=(total,), group=shapes, **fields)


def test_a_group_is_negotiated_and_fused_as_one_unit():
    coord, _ = _coordinator(2)
    coord.add(0, [_group("g", (2,), (3, 4)), _ar("a", shape=(5,))])
    coord.add(1, [_ar("a", shape=(5,))])
    (response,) = coord.responses()
    assert response.names == ["a"]
    coord.add(1, [_group("g", (2,), (3, 4))])
    (response,) = coord.responses()
    assert response.names == ["g"] and response.error is None
    assert fusion.nbytes_in_buffer(_group("g", (2,), (3, 4))) == 56


@pytest.mark.parametrize(
    ("theirs", "shown"),
    [
        (
            _group("g", (2,), (3, 5)),
            "tensor 'g.1' (member 1 of group 'g'): shape differs across "
            "ranks (rank 0: (3, 4), rank 1: (3, 5))",
        ),
        (_group("g", (2,), (3, 4), (1,)), "rank 0: a group of 2, rank 1: a group of 3"),
        (_ar("g", shape=(14,)), "rank 0: a group of 2, rank 1: a single tensor"),
    ],
)
def test_group_mismatch_names_the_member_or_the_sizes(theirs, shown):
    coord, _ = _coordinator(2)
    coord.add(0, [_group("g", (2,), (3, 4))])
    coord.add(1, [theirs])
    (response,) = coord.responses()
    assert shown in response.error


def test_join_lets_others_proceed_and_completes_when_all_joined():
    coord, _ = _coordinator(3)
    join = Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    coord.add(1, [join])
    coord.add(0, [_ar("a")])
    coord.add(2, [_ar("a")])
    (response,) = coord.responses()
    assert response.names == ["a"] and response.joined == (1,)
    a2a = Meta(name="t", kind=messages.ALLTOALL, dtype="int8", shape=(3,), splits=(1, 1, 1))
    coord.add(0, [a2a])
    coord.add(2, [a2a])
    assert "cannot run while ranks [1] have joined" in coord.responses()[0].error
    coord.add(2, [join])
    coord.add(0, [join])
    (done,) = coord.responses()
    assert done.kind == messages.JOIN and done.last_joined == 0


def test_shutdown_from_any_rank_stops_everyone():
    coord, _ = _coordinator(2)
    coord.add(1, [messages.SHUTDOWN_REQUEST])
    (stop,) = coord.responses()
    assert stop.kind == messages.STOP
    assert stop.error == "rank 1 shut ringtrain down (shutdown() or its exit)"


def test_stall_warns_once_naming_missing_ranks_then_fails():
    coord, clock = _coordinator(3, warn=5.0, shutdown=20.0)
    coord.add(0, [_ar("slow")])
    coord.add(2, [_ar("slow")])
    assert coord.check_stalls() == ([], [])
    clock.now = 6.0
    warnings, fatal = coord.check_stalls()
    assert fatal == [] and len(warnings) == 1
    assert "'slow' has waited 6.0 s for ranks [1], which have not submitted it" in warnings[0]
    assert "(ranks [0, 2] have)" in warnings[0]
    clock.now = 7.0
    assert coord.check_stalls() == ([], [])
    clock.now = 21.0
    _, (failed,) = coord.check_stalls()
    assert failed.kind == messages.STALLED and failed.names == ["slow"]
    assert failed.ranks == (0, 2)
    assert failed.error.startswith("stall shutdown after 20 s (RINGTRAIN_STALL_SHUTDOWN_SECONDS)")
    assert "'slow' has waited 21.0 s for ranks [1]" in failed.error
    assert "(ranks [0, 2] have)" in failed.error


def test_stall_shutdown_fails_only_the_stalled_name_and_forgets_it():
    coord, clock = _coordinator(3, warn=0.0, shutdown=10.0)
    coord.add(0, [_ar("stuck")])
    coord.add(1, [_ar("stuck")])
    clock.now = 8.0
    coord.add(0, [_ar("young", shape=(5,))])
    coord.add(1, [_ar("young", shape=(5,))])
    clock.now = 11.0
    warnings, (failed,) = coord.check_stalls()
    assert warnings == [] and failed.names == ["stuck"] and failed.ranks == (0, 1)
    # Younger names wait on; the engine goes on with what every rank submits.
    assert coord.pending() and coord.check_stalls() == ([], [])
    coord.add(2, [_ar("young", shape=(5,))])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.names == ["young"]
    assert not coord.pending()
    # The failed round's submitters owe nothing: their next submissions start a new round.
    coord.add(0, [_ar("stuck", shape=(7,))])
    coord.add(1, [_ar("stuck", shape=(7,))])
    assert coord.responses() == []
    clock.now = 20.0
    assert coord.check_stalls() == ([], [])  # its stall clock started afresh, at 11 s
    # Rank 2's first submission is its late one for the failed round; its next one pairs.
    coord.add(2, [_ar("stuck")])
    (late,) = coord.responses()
    assert late.kind == messages.STALLED and late.ranks == (2,)
    coord.add(2, [_ar("stuck", shape=(7,))])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.metas == []


def test_a_late_submission_of_a_stalled_name_fails_on_its_rank_only():
    coord, clock = _coordinator(4, warn=0.0, shutdown=10.0)
    coord.add(0, [_ar("late")])
    coord.add(2, [_ar("late")])
    clock.now = 10.0
    _, (failed,) = coord.check_stalls()
    assert failed.ranks == (0, 2) and "for ranks [1, 3]" in failed.error
    # The survivors' next round starts before rank 1's late submission of the failed one.
    clock.now = 12.0
    coord.add(0, [_ar("late")])
    coord.add(2, [_ar("late")])
    coord.add(1, [_ar("late")])
    assert coord.decided()
    (late,) = coord.responses()
    assert late.kind == messages.STALLED and late.names == ["late"] and late.ranks == (1,)
    assert late.error.startswith("tensor 'late': rank 1 submitted it after the stall shutdown")
    assert "on ranks [0, 2], which had waited 10.0 s for it" in late.error
    # Rank 1's next submission, and rank 3's after its own late one, pair with the new round.
    coord.add(3, [_ar("late")])
    (late,) = coord.responses()
    assert late.ranks == (3,)
    coord.add(1, [_ar("late")])
    coord.add(3, [_ar("late")])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.names == ["late"]
    assert not coord.pending() and coord.responses() == []


def test_a_suspected_cached_name_is_evicted_then_stalls_and_fails_late_as_any():
    coord, clock = _coordinator(2, warn=0.0, shutdown=5.0)
    ident = _cached(coord, "c")
    coord.add(0, [messages.Suspect("c")])  # rank 0's counted "c" has waited
    (evicted,) = coord.responses()
    assert evicted.kind == messages.EVICTED and evicted.cache_ids == {"c": ident}
    coord.add(0, [_ar("c")])  # sent whole again
    clock.now = 5.0
    _, (failed,) = coord.check_stalls()
    assert failed.ranks == (0,)
    coord.add(1, [_ar("c")])
    (late,) = coord.responses()
    assert late.kind == messages.STALLED and late.ranks == (1,)
    coord.add(0, [_ar("c")])
    coord.add(1, [_ar("c")])
    assert coord.responses()[0].kind == messages.ALLREDUCE


def test_withdrawing_a_counted_round_evicts_the_id_and_confirms_to_that_rank():
    coord, _ = _coordinator(3)
    ident = _cached(coord, "a", size=3)
    coord.add(2, [messages.Withdrawal("a", counted=True)])
    evicted, withdrawn = coord.responses()
    assert evicted.kind == messages.EVICTED and evicted.cache_ids == {"a": ident}
    assert withdrawn.kind == messages.WITHDRAWN and withdrawn.withdrawn_by == 2
    coord.add(0, [_ar("a")])  # the others send theirs whole; rank 2's next pairs with them
    coord.add(1, [_ar("a")])
    assert coord.awaited() == (["a"], [2])
    coord.add(2, [_ar("a")])
    assert coord.responses()[0].names == ["a"]


def test_a_join_evicts_every_id_and_none_is_given_until_the_join_completes():
    coord, _ = _coordinator(2)
    ident = _cached(coord, "a")
    join = Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    coord.add(1, [join])
    (evicted,) = coord.responses()
    assert evicted.cache_ids == {"a": ident}
    coord.add(0, [_ar("b")])
    assert coord.responses()[0].cache_ids == {}
    coord.add(0, [join])
    assert coord.responses()[0].kind == messages.JOIN
    assert _cached(coord, "c") is not None


def test_joined_ranks_are_not_missing_and_owe_no_late_submission():
    coord, clock = _coordinator(3, warn=0.0, shutdown=5.0)
    join = Meta(messages.JOIN_NAME, messages.JOIN, "", ())
    coord.add(2, [join])
    coord.add(0, [_ar("j")])
    clock.now = 6.0
    _, (failed,) = coord.check_stalls()
    assert failed.ranks == (0,) and "for ranks [1]," in failed.error
    # Rank 1 joins instead of submitting it late: it owes nothing once the join is done.
    coord.add(1, [join])
    coord.add(0, [join])
    (done,) = coord.responses()
    assert done.kind == messages.JOIN
    coord.add(0, [_ar("j")])
    coord.add(1, [_ar("j")])
    coord.add(2, [_ar("j")])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.names == ["j"]


def test_responses_survive_the_wire_with_every_field():
    """What rank 0 sends (pickled ``to_wire`` tuples) comes back as equal responses."""
    meta = Meta("w", messages.ALLGATHER, "float32", (3, 2))
    full = messages.Response(
        messages.ALLGATHER,
        ["w"],
        [meta],
        per_rank=[[meta, None]],
        joined=(1,),
        error="tensor 'w': dtype differs",
        cache_ids={"w": 4},
        last_joined=1,
        withdrawn_by=1,
        ranks=(0, 1),
    )
    steady = messages.Response(messages.ALLREDUCE, ["a", "b"])
    sent = pickle.dumps(messages.to_wire([full, steady]), protocol=pickle.HIGHEST_PROTOCOL)
    assert messages.from_wire(pickle.loads(sent)) == [full, steady]


def test_a_withdrawn_submission_is_forgotten_and_confirmed_to_its_rank_only():
    coord, clock = _coordinator(3, warn=5.0)
    coord.add(0, [_ar("orphan"), _ar("shared")])
    coord.add(1, [_ar("shared")])
    coord.add(0, [messages.Withdrawal("orphan"), messages.Withdrawal("never sent")])
    assert coord.decided()
    (response,) = coord.responses()
    assert response.kind == messages.WITHDRAWN and response.names == ["orphan"]
    assert response.withdrawn_by == 0 and "withdrawn" in response.error
    # A name that others also submitted keeps their submissions, and its stall clock.
    coord.add(1, [messages.Withdrawal("shared")])
    (response,) = coord.responses()
    assert response.names == ["shared"] and response.withdrawn_by == 1
    clock.now = 10.0
    warnings, _ = coord.check_stalls()
    assert len(warnings) == 1 and "'shared'" in warnings[0] and "orphan" not in warnings[0]
    # Once every rank has it, a late withdrawal changes nothing: the response runs.
    coord.add(1, [_ar("shared")])
    coord.add(2, [_ar("shared")])
    coord.add(2, [messages.Withdrawal("shared")])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.names == ["shared"]
    assert not coord.pending() and coord.responses() == []
    assert pickle.loads(pickle.dumps(messages.Withdrawal("x"))) == messages.Withdrawal("x")


# -- unnamed calls: their names, and the drift check ----------------------------------


def _unnamed(site, count, kind=messages.ALLREDUCE, **kw):
    return _ar(messages.unnamed_name(kind, site, count), **kw)


def test_unnamed_names_carry_the_call_site_and_count_and_user_names_do_not():
    name = messages.unnamed_name("allgather", "train.py:42", 3)
    assert messages.unnamed_call(name) == "allgather #3 at train.py:42"
    assert messages.unnamed_call(f"{name}.lengths") == "allgather #3 at train.py:42, part lengths"
    graph = messages.unnamed_name("allreduce", "step (tf.function)", 0)
    assert messages.unnamed_call(f"{graph}.1") == "allreduce #0 at step (tf.function), part 1"
    assert messages.unnamed_call("grad.0") is None
    assert messages.unnamed_call(messages.JOIN_NAME) is None
    # Another line, or another count, is another name: they can never pair.
    assert name != messages.unnamed_name("allgather", "train.py:43", 3)
    assert name != messages.unnamed_name("allgather", "train.py:42", 4)


def test_the_user_call_site_is_the_first_frame_outside_ringtrain():
    line = sys._getframe().f_lineno + 1
    assert call_site.user_call_site() == f"test_negotiation.py:{line}"


def test_drift_fails_every_rank_at_its_own_call_sites_once_nothing_came_for_a_while():
    """One rank left a loop early: it waits at the next line, the others still in the loop."""
    coord, clock = _coordinator(3, drift=5.0)
    for count in range(3):
        for rank in range(3):
            coord.add(rank, [_unnamed("loop.py:10", count)])
        (response,) = coord.responses()
        assert response.names == [messages.unnamed_name("allreduce", "loop.py:10", count)]
    coord.add(0, [_unnamed("loop.py:10", 3)])
    coord.add(2, [_unnamed("loop.py:10", 3)])
    coord.add(1, [_unnamed("loop.py:12", 0)])
    assert coord.responses() == []
    clock.now = 4.9
    assert coord.check_drift() == []
    clock.now = 5.0
    failed = coord.check_drift()
    assert [(r.kind, r.ranks) for r in failed] == [
        (messages.DRIFTED, (0, 2)),
        (messages.DRIFTED, (1,)),
    ]
    error = failed[0].error
    assert error == failed[1].error
    assert "rank 0 at allreduce #3 at loop.py:10" in error
    assert "rank 1 at allreduce #0 at loop.py:12" in error
    assert "rank 2 at allreduce #3 at loop.py:10" in error
    assert "RINGTRAIN_UNNAMED_DRIFT_SECONDS" in error
    assert not coord.pending() and coord.check_drift() == []


def test_after_a_drift_late_submissions_fail_and_later_calls_pair():
    coord, clock = _coordinator(2, drift=5.0)
    coord.add(0, [_unnamed("loop.py:10", 3)])
    coord.add(1, [_unnamed("loop.py:12", 0)])
    clock.now = 6.0
    assert len(coord.check_drift()) == 2
    # Named calls go on as ever.
    coord.add(0, [_ar("named")])
    coord.add(1, [_ar("named")])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.names == ["named"]
    # Rank 0 goes on to the line rank 1 had reached: that call belonged to the failed round.
    coord.add(0, [_unnamed("loop.py:12", 0)])
    (late,) = coord.responses()
    assert late.kind == messages.DRIFTED and late.ranks == (0,)
    assert "rank 0 submitted it after the drift check of unnamed calls" in late.error
    # Both ranks' next calls from a line pair as usual.
    coord.add(0, [_unnamed("loop.py:12", 1)])
    coord.add(1, [_unnamed("loop.py:12", 1)])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE
    assert not coord.pending()


def test_no_drift_while_a_rank_that_lags_has_nothing_unmatched():
    """Async calls from ranks at different speeds: the slow rank's calls all pair at once."""
    coord, clock = _coordinator(2, drift=1.0)
    coord.add(0, [_unnamed("fast.py:5", k) for k in range(4)])
    for k in range(3):
        clock.now += 10.0
        assert coord.check_drift() == []
        coord.add(1, [_unnamed("fast.py:5", k)])
        (response,) = coord.responses()
        assert response.names == [messages.unnamed_name("allreduce", "fast.py:5", k)]
    clock.now += 10.0
    assert coord.check_drift() == []
    coord.add(1, [_unnamed("fast.py:5", 3)])
    assert coord.responses() and not coord.pending()


def test_no_drift_while_a_submission_came_in_lately_or_with_the_check_off():
    coord, clock = _coordinator(2, drift=5.0)
    coord.add(0, [_unnamed("a.py:1", 0)])
    clock.now = 4.0
    coord.add(1, [_unnamed("a.py:2", 0)])  # another thread's call, say: the wait starts again
    clock.now = 8.0
    assert coord.check_drift() == []
    clock.now = 9.0
    assert len(coord.check_drift()) == 2
    off, clock = _coordinator(2, drift=0.0)
    off.add(0, [_unnamed("a.py:1", 0)])
    off.add(1, [_unnamed("a.py:2", 0)])
    clock.now = 1e6
    assert off.check_drift() == [] and off.pending()


def test_drift_leaves_named_calls_alone_and_needs_every_rank_at_an_unnamed_one():
    coord, clock = _coordinator(2, drift=1.0)
    coord.add(0, [_unnamed("a.py:1", 0)])
    coord.add(1, [_ar("named")])  # rank 1 may still make the unnamed call later
    clock.now = 100.0
    assert coord.check_drift() == []
    coord.add(1, [_unnamed("a.py:9", 0)])
    clock.now = 200.0
    failed = coord.check_drift()
    assert sorted(n for r in failed for n in r.names) == sorted(
        [
            messages.unnamed_name("allreduce", "a.py:1", 0),
            messages.unnamed_name("allreduce", "a.py:9", 0),
        ]
    )
    coord.add(0, [_ar("named")])  # the named call was left waiting, and pairs now
    (response,) = coord.responses()
    assert response.names == ["named"]


def test_drift_counts_only_the_ranks_that_have_not_joined():
    join = Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    coord, clock = _coordinator(3, drift=1.0)
    coord.add(2, [join])
    coord.add(0, [_unnamed("a.py:1", 0)])
    coord.add(1, [_unnamed("a.py:2", 0)])
    clock.now = 2.0
    failed = coord.check_drift()
    assert [r.ranks for r in failed] == [(0,), (1,)]
    assert "rank 2" not in failed[0].error
    # Rank 1 owes its late call from a.py:1; rank 2, which has joined, owes none.
    coord.add(1, [_unnamed("a.py:1", 0)])
    (late,) = coord.responses()
    assert late.kind == messages.DRIFTED and late.ranks == (1,)
    coord.add(0, [_unnamed("a.py:1", 0)])
    coord.add(1, [_unnamed("a.py:1", 0)])
    (response,) = coord.responses()
    assert response.kind == messages.ALLREDUCE and response.joined == (2,)
