"""The framework-neutral hand-over (``ringtrain.exchange.Handover``) of a step's arrays.

Each rank hands over its own arrays of lengths 0, 1 and uneven, with an entry that holds
no tensor, in buckets small enough that there are several, for several steps: every result
must equal NumPy's mean over the ranks, with the buckets' parts handed over one by one and
as one grouped request per bucket (parts whose dtype the plan knows). Then ranks that
disagree on an entry's kind, and ranks that hand over different numbers of entries, must
each fail at once with an error that names what differs, and the next step must still run.
"""

import numpy as np
from common import main, rank_data

import ringtrain
from ringtrain import exchange
from ringtrain.errors import MismatchError

SHAPES = [(0,), (1,), (7,), (3, 5), (1000,), (2, 0)]


def handover(kinds, cap=64, dtype=None):
    """Return the hand-over of ``kinds``' dense entries, last first, averaged.

    With ``dtype`` (their dtype, known to the plan) each bucket of several is one request.
    """
    parts = [
        exchange.Part(i, "", exchange.reducer(ringtrain.Average), 4 * _count(i), True, dtype)
        for i in reversed(range(len(kinds)))
        if kinds[i] == exchange.DENSE
    ]
    labels = [f"entry {i}" for i in range(len(kinds))]
    return exchange.Handover("step", kinds, labels, parts, cap)


def _count(i):
    return int(np.prod(SHAPES[i % len(SHAPES)]))


def arrays_of(rank, kinds, step):
    return [
        rank_data(rank, SHAPES[i % len(SHAPES)], np.float32, salt=100 * step + i)
        if kind == exchange.DENSE
        else None
        for i, kind in enumerate(kinds)
    ]


def run_step(plan, arrays):
    parts = [arrays[p.entry] for p in plan.parts]
    return plan.collect(plan.submit_all(parts))


def body():
    ringtrain.init()
    rank, size = ringtrain.rank(), ringtrain.size()
    kinds = [exchange.DENSE] * len(SHAPES) + [exchange.NO_TENSOR, exchange.DENSE]
    alone, grouped = handover(kinds), handover(kinds, dtype=np.float32)
    assert len(alone.buckets) > 2, alone.buckets
    counts = [grouped.handle_count(k) - (k == 0) for k in range(len(grouped.buckets))]
    assert 1 in counts and counts != [len(b) for b in grouped.buckets], counts
    for step in range(3):
        for plan in (alone, grouped):
            results = run_step(plan, arrays_of(rank, kinds, step))
            for part, result in zip(plan.parts, results, strict=True):
                every = [arrays_of(q, kinds, step)[part.entry] for q in range(size)]
                want = np.mean(np.stack(every).astype(np.float64), axis=0)
                assert result.shape == want.shape, (part.entry, result.shape)
                assert np.allclose(result, want, rtol=1e-6, atol=1e-6), (rank, part.entry)
    plan = grouped

    if size > 1:
        # Rank 1 has no tensor at entry 2 where the others have one.
        odd = list(kinds)
        if rank == 1:
            odd[2] = exchange.NO_TENSOR
        try:
            run_step(handover(odd, dtype=np.float32), arrays_of(rank, odd, 9))
        except MismatchError as err:
            assert "step: entry 2: ranks disagree on its gradient" in str(err), err
            assert "no tensor, a dense tensor" in str(err), err
        else:
            raise AssertionError("ranks that disagree on an entry's kind did not fail")
        # Rank 0 hands over one entry more.
        more = kinds + [exchange.DENSE] if rank == 0 else kinds
        try:
            run_step(handover(more), arrays_of(rank, more, 10))
        except MismatchError as err:
            assert "ranks hand over different numbers of tensors" in str(err), err
            assert f"(this rank: {len(more)})" in str(err), err
        else:
            raise AssertionError("ranks that hand over different numbers did not fail")

    results = run_step(plan, arrays_of(rank, kinds, 11))  # the names are free again
    last = [arrays_of(q, kinds, 11)[plan.parts[0].entry] for q in range(size)]
    assert np.allclose(results[0], np.mean(np.stack(last), axis=0), rtol=1e-6, atol=1e-6)
    print(f"rank {rank}: exchange ok", flush=True)
    ringtrain.shutdown()


if __name__ == "__main__":
    main(body)
