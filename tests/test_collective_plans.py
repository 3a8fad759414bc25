"""The plans of allgather, broadcast, alltoall, reduce-scatter and Adasum, without MPI.

Every rank's plan is made in one process, and carried out by hand on NumPy bytes: what the
plans say each rank moves must give NumPy's answer.
"""

import numpy as np
import pytest

from ringtrain.engine import collective_plans, messages
from ringtrain.engine.handle import Request
from ringtrain.engine.messages import Meta, Response
from ringtrain.ops import ReduceOp

SIZES = [1, 2, 3, 4]


def _data(rank, rows, trailing=(3,), dtype=np.float32):
    rng = np.random.default_rng(7 + rank)
    return rng.standard_normal((rows, *trailing)).astype(dtype)


def _as_bytes(array):
    return array.reshape(-1).view(np.uint8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("trailing", [(3,), (), (2, 0)])
def test_allgather_plans_lay_every_ranks_rows_end_to_end(size, trailing):
    rows = [0, 1, 5, 2][:size]  # uneven, and a rank with none
    arrays = [_data(r, n, trailing) for r, n in enumerate(rows)]
    metas = [Meta("g", messages.ALLGATHER, "float32", a.shape) for a in arrays]
    response = Response(messages.ALLGATHER, ["g"], [metas[0]], per_rank=[metas])
    expected = np.concatenate(arrays)
    for rank in range(size):
        request = Request(metas[rank], arrays[rank], None, 0)
        (plan,) = collective_plans.plan_allgather(response, [request])
        assert plan.shape == expected.shape and plan.keeps
        out = np.empty(plan.shape, np.float32)
        for r, (count, at) in enumerate(zip(plan.counts, plan.displacements, strict=True)):
            assert count == arrays[r].nbytes
            _as_bytes(out)[at : at + count] = _as_bytes(arrays[r])
        np.testing.assert_array_equal(out, expected)


def test_an_allgather_rank_that_joined_sends_nothing_and_keeps_nothing():
    meta = Meta("g", messages.ALLGATHER, "float32", (2, 3))
    response = Response(messages.ALLGATHER, ["g"], [meta], per_rank=[[meta, None]])
    (plan,) = collective_plans.plan_allgather(response, [None])
    assert plan.counts == (24, 0) and plan.displacements == (0, 24)
    assert plan.shape == (2, 3) and not plan.keeps


@pytest.mark.parametrize("size", SIZES)
def test_broadcast_plans_send_from_the_root_alone(size):
    root = size - 1
    meta = Meta("b", messages.BROADCAST, "int32", (0, 4) if size == 2 else (3,), root=root)
    response = Response(messages.BROADCAST, ["b"], [meta])
    for rank in range(size):
        request = Request(meta, np.zeros(meta.shape, np.int32), None, 0)
        plan = collective_plans.plan_broadcast(response, [request], rank)
        assert plan.sends == (rank == root) and plan.keeps
        assert plan.shape == meta.shape and plan.dtype == np.int32 and plan.root == root
    plan = collective_plans.plan_broadcast(response, [None], root)  # joined: scratch only
    assert not plan.sends and not plan.keeps


@pytest.mark.parametrize("size", SIZES)
def test_alltoall_plans_deliver_each_ranks_splits_in_rank_order(size):
    # splits[r][q]: the rows rank r sends rank q; uneven, with zeros
    splits = [[(r + 2 * q) % 3 for q in range(size)] for r in range(size)]
    arrays = [_data(r, sum(splits[r]), (2,)) for r in range(size)]
    metas = [
        Meta("a", messages.ALLTOALL, "float32", a.shape, splits=tuple(s))
        for a, s in zip(arrays, splits, strict=True)
    ]
    response = Response(messages.ALLTOALL, ["a"], [metas[0]], per_rank=[metas])
    plans = [collective_plans.plan_alltoall(response, rank) for rank in range(size)]
    for rank, plan in enumerate(plans):
        parts = []
        for r in range(size):
            starts = np.cumsum([0, *splits[r]])
            parts.append(arrays[r][starts[rank] : starts[rank + 1]])
        expected = np.concatenate(parts)
        assert plan.shape == expected.shape
        assert plan.got == tuple(p.nbytes for p in parts)
        # what this rank receives from r is what r's plan sends it
        assert plan.got == tuple(plans[r].sent[rank] for r in range(size))
        assert sum(plan.sent) == arrays[rank].nbytes


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("rows", [0, 1, 7])
def test_reducescatter_plans_deal_the_sums_rows_as_numpy_splits_them(size, rows):
    arrays = [_data(r, rows, (2,)) for r in range(size)]
    meta = Meta("s", messages.REDUCESCATTER, "float32", (rows, 2), int(ReduceOp.Average))
    response = Response(messages.REDUCESCATTER, ["s"], [meta])
    total = np.sum(arrays, axis=0).reshape(-1)
    expected = np.array_split(np.mean(arrays, axis=0), size)
    for rank in range(size):
        plan = collective_plans.plan_reducescatter(response, rank, size)
        assert plan.count == rows * 2 and plan.wire == np.float32
        assert plan.reduction.op == ReduceOp.Sum and plan.reduction.postscale == 1 / size
        lo, hi = plan.bounds[rank]
        mine = (total[lo:hi] * plan.reduction.postscale).reshape(plan.shape)
        np.testing.assert_allclose(mine, expected[rank], rtol=1e-6)
    assert [b for b, _ in plan.bounds][1:] == [e for _, e in plan.bounds][:-1]  # no gaps


def test_a_float16_reducescatter_is_reduced_widened_and_dealt_first_ranks_first():
    meta = Meta("s", messages.REDUCESCATTER, "float16", (5,), int(ReduceOp.Sum))
    response = Response(messages.REDUCESCATTER, ["s"], [meta])
    plan = collective_plans.plan_reducescatter(response, 2, 3)
    assert plan.wire == np.float32 and plan.dtype == np.float16
    assert plan.bounds == ((0, 2), (2, 4), (4, 5)) and plan.shape == (1,)


def test_adasum_plans_one_entry_per_tensor_with_its_scales_and_out():
    out = np.empty((2, 2), np.float16)
    lone = Request(
        Meta("x", messages.ALLREDUCE, "float16", (2, 2), int(ReduceOp.Adasum), prescale=0.5),
        np.ones((2, 2), np.float16),
        out,
        0,
    )
    shapes = ((3,), (0,))
    group = Request(
        Meta("g", messages.ALLREDUCE, "float64", (3,), int(ReduceOp.Adasum), group=shapes),
        [np.ones(3), np.ones(0)],
        None,
        0,
    )
    plans = collective_plans.plan_adasum([lone, group])
    assert [(p.name, p.shape, p.count) for p in plans] == [
        ("x", (2, 2), 4),
        ("g", (3,), 3),
        ("g", (0,), 0),
    ]
    assert plans[0].wire == np.float32 and plans[0].dtype == np.float16
    assert plans[0].prescale == 0.5 and plans[0].out is out and plans[1].out is None
    assert plans[1].array is group.array[0]
