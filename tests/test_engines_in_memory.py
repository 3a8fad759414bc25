"""Negotiation across 1-4 ranks' engines in one process, on in-memory channels (no mpirun).

Each rank's engine is ringtrain's own; only the wire is in memory (``tests/in_memory.py``).
Each rank has its own data, and every result is compared with NumPy's.
"""

import threading
import time

import numpy as np
import pytest
from in_memory import MemoryChannel, on_every_rank, shut_down, start_engines

from ringtrain.engine import liveness, messages
from ringtrain.errors import (
    CollectiveTimeoutError,
    EngineStoppedError,
    MismatchError,
    RingtrainError,
    StallError,
)
from ringtrain.ops import ReduceOp

SIZES = [1, 2, 3, 4]
LENGTHS = [0, 1, 7, 1000]


def _allreduce_meta(name, array, op=ReduceOp.Sum):
    return messages.Meta(name, messages.ALLREDUCE, array.dtype.name, array.shape, op=int(op))


def _run(engine, meta, array):
    return engine.wait(engine.submit(meta, array).handle)


def _data(rank, length, dtype=np.float32):
    rng = np.random.default_rng(100 + rank)
    return rng.standard_normal(length).astype(dtype)


def _warm(fabric, engines, names, cached, length=3, op=ReduceOp.Sum):
    """Run each of ``names`` twice on every rank if ``cached``: whole, then counted by id.

    As allreduces of ``length`` float32 by ``op``: the metas that the test goes on with.
    """
    if not cached:
        return
    ones = np.ones(length, np.float32)
    expected = ones if op == ReduceOp.Average else ones * len(engines)

    def work(rank, engine):
        for name in names:
            np.testing.assert_array_equal(
                _run(engine, _allreduce_meta(name, ones, op), ones), expected
            )

    assert on_every_rank(engines, work) == [None] * len(engines)
    whole = len([entries for _, entries in fabric.submitted if entries])
    assert on_every_rank(engines, work) == [None] * len(engines)
    assert len([entries for _, entries in fabric.submitted if entries]) == whole  # counted


CACHED = pytest.mark.parametrize("cached", [False, True], ids=["whole", "cached"])


@pytest.fixture
def started():
    """Start engines with ``started(size, **settings)``; shut them down after."""
    made = []

    def start(size, **settings):
        fabric, engines = start_engines(size, **settings)
        made.append(engines)
        return fabric, engines

    yield start
    for engines in made:
        shut_down(engines)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    "op", [ReduceOp.Sum, ReduceOp.Average, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product]
)
def test_allreduce_equals_numpy_on_every_rank(started, size, op):
    _, engines = started(size)
    reduce = {
        ReduceOp.Sum: np.sum,
        ReduceOp.Average: np.mean,
        ReduceOp.Min: np.min,
        ReduceOp.Max: np.max,
        ReduceOp.Product: np.prod,
    }[op]

    def work(rank, engine):
        return [
            _run(engine, _allreduce_meta(f"t{n}", _data(rank, n), op), _data(rank, n))
            for n in LENGTHS
        ]

    outcomes = on_every_rank(engines, work)
    for n, *results in zip(LENGTHS, *outcomes, strict=True):
        expected = reduce(np.stack([_data(r, n) for r in range(size)]), axis=0)
        for result in results:
            np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(result, results[0])  # the same bits on every rank


@pytest.mark.parametrize("size", SIZES)
def test_tensors_submitted_in_a_different_order_on_each_rank_all_complete(started, size):
    """Ranks hand over a step's tensors in their own orders; later steps skip rank 0."""
    fabric, engines = started(size, fusion_threshold=4096)
    lengths = [(7 * i) % 50 for i in range(40)]

    def step(rank, engine):
        order = np.random.default_rng(rank).permutation(len(lengths))
        requests = {
            i: engine.submit(_allreduce_meta(f"g{i}", _data(rank + i, n)), _data(rank + i, n))
            for i, n in ((i, lengths[i]) for i in order)
        }
        return {i: engine.wait(request.handle) for i, request in requests.items()}

    for repeat in range(3):
        outcomes = on_every_rank(engines, step)
        for i, n in enumerate(lengths):
            expected = sum(_data(r + i, n) for r in range(size))
            for results in outcomes:
                np.testing.assert_allclose(results[i], expected, rtol=1e-5, atol=1e-6)
        sent_whole = [entries for _, entries in fabric.submitted if entries]  # not heartbeats
        if repeat == 0:
            first = len(sent_whole)
            assert first >= size - 1  # every other rank sent its metas whole
        else:  # the repeats are counted up the tree: nothing more reaches rank 0
            assert len(sent_whole) == first, sent_whole[first:]


@pytest.mark.parametrize("size", SIZES)
def test_a_fused_step_of_mixed_shapes_outs_and_groups_equals_numpy(started, size):
    """One fused response: 0-d, empty, 1-D and 2-D tensors, ``out=`` buffers, and groups."""
    _, engines = started(size)
    shapes = [(), (0,), (1,), (7,), (3, 5), (1000,), (2, 0), (4, 1)]

    def tensor(rank, i):
        return _data(rank + i, int(np.prod(shapes[i]))).reshape(shapes[i])

    fused = []  # the names of each allreduce response that rank 0 ran
    run = engines[0]._executor.run
    engines[0]._executor.run = lambda response, requests: (
        fused.append(response.names) if response.kind == messages.ALLREDUCE else None,
        run(response, requests),
    )[1]

    def hand_over(rank, engine):
        requests = []
        for i, shape in enumerate(shapes):
            array = tensor(rank, i)
            out = np.empty(shape, np.float32) if i % 2 else None
            requests.append((engine.submit(_allreduce_meta(f"m{i}", array), array, out), out))
        group = [tensor(rank, i) for i in (3, 0, 4)]
        meta = messages.Meta(
            "grouped", messages.ALLREDUCE, "float32", (sum(a.size for a in group),),
            group=tuple(a.shape for a in group),
        )  # fmt: skip
        lone = [tensor(rank, 5)]
        lone_meta = meta._replace(name="group of one", shape=(1000,), group=((1000,),))
        return requests, [engine.submit(meta, group), engine.submit(lone_meta, lone)]

    def wait(rank, engine):
        # The turns are held while the step is handed over, so that one turn sends all of
        # it and the coordinator fuses it into one response.
        with engine._turns._lock:
            requests, groups = hand_over(rank, engine)
        results = [engine.wait(r.handle) for r, _ in requests]
        for (_, out), result in zip(requests, results, strict=True):
            assert out is None or result is out  # written where the caller asked
        return results, [engine.wait(g.handle) for g in groups]

    for _ in range(3):  # whole, then cached: the same fused layout each time
        outcomes = on_every_rank(engines, wait)
        assert len(fused[-1]) == len(shapes) + 2, fused  # the whole step in one response
        for results, (grouped, of_one) in outcomes:
            for i, result in enumerate(results):
                expected = sum(tensor(r, i) for r in range(size))
                assert result.shape == shapes[i]
                np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
            for result, i in zip(grouped, (3, 0, 4), strict=True):
                assert result.shape == shapes[i]
                np.testing.assert_allclose(result, sum(tensor(r, i) for r in range(size)))
            assert len(of_one) == 1
            np.testing.assert_allclose(of_one[0], sum(tensor(r, 5) for r in range(size)))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_allgather_broadcast_alltoall_and_reducescatter_equal_numpy(started, size):
    _, engines = started(size)

    def work(rank, engine):
        rows = np.arange(rank + 1, dtype=np.int64) * 10 + rank  # uneven: rank + 1 rows
        gathered = _run(
            engine, messages.Meta("gather", messages.ALLGATHER, "int64", rows.shape), rows
        )
        sent = _data(rank, 5)
        meta = messages.Meta("bcast", messages.BROADCAST, "float32", (5,), root=size - 1)
        broadcast = _run(engine, meta, sent)
        splits = tuple(range(size))  # rank r gets r rows from every rank
        out = np.full(sum(splits), rank, np.int32)
        meta = messages.Meta("a2a", messages.ALLTOALL, "int32", out.shape, splits=splits)
        exchanged = _run(engine, meta, out)
        matrix = _data(rank, size * 3).reshape(size, 3)
        meta = messages.Meta("rs", messages.REDUCESCATTER, "float32", matrix.shape)
        scattered = _run(engine, meta, matrix)
        return gathered, broadcast, exchanged, scattered

    outcomes = on_every_rank(engines, work)
    matrices = sum(_data(r, size * 3).reshape(size, 3) for r in range(size))
    for rank, (gathered, broadcast, exchanged, scattered) in enumerate(outcomes):
        expected = np.concatenate([np.arange(r + 1) * 10 + r for r in range(size)])
        np.testing.assert_array_equal(gathered, expected)
        np.testing.assert_array_equal(broadcast, _data(size - 1, 5))
        np.testing.assert_array_equal(exchanged, np.repeat(np.arange(size), rank))
        np.testing.assert_allclose(scattered, matrices[rank : rank + 1], rtol=1e-5)


@CACHED
def test_shapes_that_differ_fail_on_every_rank_naming_each_ranks_shape(started, cached):
    fabric, engines = started(3)
    _warm(fabric, engines, ["w"], cached)  # then rank 1 changes its shape, the others count theirs

    def work(rank, engine):
        array = np.ones(4 if rank == 1 else 3, np.float32)
        return _run(engine, _allreduce_meta("w", array), array)

    outcomes = on_every_rank(engines, work)
    for err in outcomes:
        assert isinstance(err, MismatchError), err
        assert "shape differs across ranks (rank 0: (3,), rank 1: (4,), rank 2: (3,))" in str(err)


@CACHED
@pytest.mark.parametrize("size", [2, 3, 4])
def test_a_stalled_tensor_fails_where_submitted_and_the_late_submission_fails_too(
    started, size, cached
):
    """Counted submissions that wait are sent whole after ``SUSPECT_SECONDS``, then stall."""
    fabric, engines = started(size, stall_check_seconds=0.0, stall_shutdown_seconds=0.5)
    _warm(fabric, engines, ["x"], cached)
    x = np.ones(3, np.float32)
    last = size - 1

    def work(rank, engine):
        if rank == last:
            return None  # never submits "x" in this round
        return _run(engine, _allreduce_meta("x", x), x)

    outcomes = on_every_rank(engines, work)
    for err in outcomes[:last]:
        assert isinstance(err, StallError), err
        assert "'x'" in str(err) and f"[{last}]" in str(err), err
    late = f"rank {last} submitted it after the stall shutdown"
    with pytest.raises(StallError, match=late):
        _run(engines[last], _allreduce_meta("x", x), x)
    # The name starts afresh: the next round completes on every rank.
    outcomes = on_every_rank(engines, lambda r, e: _run(e, _allreduce_meta("x", x), x))
    for result in outcomes:
        np.testing.assert_array_equal(result, size * x)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_unnamed_calls_that_drift_apart_fail_naming_each_ranks_call(started, size):
    _, engines = started(size, unnamed_drift_seconds=0.3)
    x = np.ones(2, np.float32)

    def work(rank, engine):
        name = messages.unnamed_name(messages.ALLREDUCE, f"train.py:{10 + rank % 2}", 0)
        return _run(engine, _allreduce_meta(name, x), x)

    outcomes = on_every_rank(engines, work)
    for err in outcomes:
        assert isinstance(err, MismatchError), err
        for rank in range(size):
            assert f"rank {rank} at allreduce #0 at train.py:{10 + rank % 2}" in str(err), err


@CACHED
def test_a_withdrawn_submission_frees_its_name_and_the_others_still_run(started, cached):
    fabric, engines = started(2)
    _warm(fabric, engines, ["a", "b"], cached, length=2)
    a, b = np.full(2, 1.0, np.float32), np.full(2, 2.0, np.float32)
    withdrawn = threading.Event()

    def work(rank, engine):
        request_a = engine.submit(_allreduce_meta("a", a), a)
        if rank == 0:
            request_b = engine.submit(_allreduce_meta("b", b), b)
            time.sleep(0.2)  # "b" reaches the coordinator, which waits for rank 1's
            engine.withdraw([request_b.handle])
            with pytest.raises(RingtrainError, match="'b' was withdrawn"):
                engine.wait(request_b.handle)
            withdrawn.set()
        result_a = engine.wait(request_a.handle)
        assert withdrawn.wait(10.0)  # rank 1 submits "b" once rank 0's first is withdrawn
        return result_a, _run(engine, _allreduce_meta("b", b), b)

    for result_a, result_b in on_every_rank(engines, work):
        np.testing.assert_array_equal(result_a, 2 * a)
        np.testing.assert_array_equal(result_b, 2 * b)


@CACHED
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_that_joined_contribute_nothing_and_learn_who_joined_last(started, size, cached):
    fabric, engines = started(size)
    _warm(fabric, engines, ["s0", "s1", "s2"], cached, length=4, op=ReduceOp.Average)
    join = messages.Meta(messages.JOIN_NAME, messages.JOIN, "uint8", ())

    def work(rank, engine):
        results = []
        if rank == 0:
            for step in range(3):
                x = _data(step, 4)
                results.append(_run(engine, _allreduce_meta(f"s{step}", x, ReduceOp.Average), x))
        return results, _run(engine, join, None)

    outcomes = on_every_rank(engines, work)
    for step, result in enumerate(outcomes[0][0]):
        np.testing.assert_allclose(result, _data(step, 4), rtol=1e-6)  # rank 0's own
    assert [last for _, last in outcomes] == [0] * size


def test_a_shutdown_by_one_rank_fails_what_the_others_wait_for(started):
    _, engines = started(2)
    y = np.ones(2, np.float32)
    request = engines[0].submit(_allreduce_meta("y", y), y)
    engines[1].shutdown()
    with pytest.raises(EngineStoppedError, match="rank 1 shut ringtrain down"):
        engines[0].wait(request.handle)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_no_message_is_left_unreceived_after_shutdown_not_even_a_heartbeat(monkeypatch, size):
    # Under MPI a message left on a freed channel reaches the next engine's, which gets the
    # same context id, and hung it (tests/mpi/check_engines_in_turn.py). Here a heartbeat is
    # due at every check, and the other ranks send their last messages late, so that rank 0
    # waits for them long enough to beat in the wait, if it beats after the STOP at all.
    monkeypatch.setattr(liveness, "_LONGEST_BEAT", 1e-3)
    finish = MemoryChannel.finish

    def late_finish(channel, *args):
        if channel.rank:
            time.sleep(0.02)
        finish(channel, *args)

    monkeypatch.setattr(MemoryChannel, "finish", late_finish)
    fabric, engines = start_engines(size)

    def work(rank, engine):
        for step in range(3):
            x = _data(rank * 10 + step, 5)
            want = sum(_data(r * 10 + step, 5) for r in range(size))
            np.testing.assert_allclose(_run(engine, _allreduce_meta("x", x), x), want, 1e-6)
            time.sleep(2e-3)

    assert on_every_rank(engines, work) == [None] * size
    assert shut_down(engines) == [None] * size
    assert fabric.unreceived() == {}


def test_switching_settings_needs_rank_0_of_an_autotuned_engine(started):
    _, engines = started(2)
    values = {"fusion_threshold": 1 << 20}
    with pytest.raises(ValueError, match="rank 0 of an engine started with autotune.*rank 1"):
        engines[1].switch_settings(values)
    with pytest.raises(ValueError, match="with autotune off"):
        engines[0].switch_settings(values)


@CACHED
def test_a_rank_cut_off_is_named_by_every_rank_left_and_the_job_ends(started, cached):
    fabric, engines = started(3, collective_timeout=1.0)
    _warm(fabric, engines, ["x"], cached, length=2)
    fabric.cut(2)
    x = np.ones(2, np.float32)

    def work(rank, engine):
        if rank < 2:
            return _run(engine, _allreduce_meta("x", x), x)
        return None

    outcomes = on_every_rank(engines, work, timeout=30.0)
    for err in outcomes[:2]:
        assert isinstance(err, CollectiveTimeoutError), err
        assert "rank 2 on memory2" in str(err), err
    end = time.monotonic() + 10.0
    while {r for r, _ in fabric.aborted} != {0, 1} and time.monotonic() < end:
        time.sleep(0.05)
    assert {r for r, _ in fabric.aborted} == {0, 1}, fabric.aborted


def test_counted_submissions_that_wait_long_for_a_slow_rank_still_complete_then_cache_again(
    started,
):
    """Past the suspect time they go to rank 0 whole; the name is cached again after."""
    fabric, engines = started(3, collective_timeout=2.0)  # suspects after 1 s
    _warm(fabric, engines, ["late"], True)
    ones = np.ones(3, np.float32)

    def whole():
        return len([entries for _, entries in fabric.submitted if entries])

    def work(rank, engine):
        if rank == 2:
            time.sleep(2.5)  # the others' counted submissions are suspected meanwhile
        return _run(engine, _allreduce_meta("late", ones), ones)

    before = whole()
    for result in on_every_rank(engines, work):
        np.testing.assert_array_equal(result, 3 * ones)
    after = whole()
    assert after > before  # rank 1's suspect and resend, rank 2's whole submission
    for _ in range(2):  # that round gave "late" a new id: the next ones are counted
        outcomes = on_every_rank(engines, lambda r, e: _run(e, _allreduce_meta("late", ones), ones))
        for result in outcomes:
            np.testing.assert_array_equal(result, 3 * ones)
    assert whole() == after


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_whose_caches_disagree_fail_in_the_next_round_naming_what_each_ran(
    started, size, capsys
):
    """No call can make this happen: a rank's cache is corrupted by hand, as a bug would."""
    fabric, engines = started(size)
    _warm(fabric, engines, ["a", "b"], True, length=2)
    last = engines[-1]
    meta, ident, digest = last._cache["a"]
    last._cache["a"] = (meta, ident, digest ^ 1)  # it stands for other metas than elsewhere
    ones = np.ones(2, np.float32)
    for result in on_every_rank(engines, lambda r, e: _run(e, _allreduce_meta("a", ones), ones)):
        np.testing.assert_array_equal(result, size * ones)  # it shows in the round after
    outcomes = on_every_rank(engines, lambda r, e: _run(e, _allreduce_meta("b", ones), ones))
    for err in outcomes:
        assert isinstance(err, EngineStoppedError), err
        assert "the ranks ran different tensors in agreement round" in str(err), err
    printed = capsys.readouterr().err
    for rank in range(size):
        assert f"rank {rank}: the ranks ran different tensors" in printed
    assert "this rank ran 'a'" in printed
    assert {r for r, _ in fabric.aborted} == set(range(size))
