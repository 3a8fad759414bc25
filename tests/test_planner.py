"""The allreduce planner, tested without MPI on real metas, responses and requests."""

import numpy as np
import pytest

from ringtrain.engine import messages
from ringtrain.engine.handle import Request
from ringtrain.engine.messages import Meta, Response
from ringtrain.engine.planner import identity, lone_host, plan_allreduce, reduction, regroup
from ringtrain.ops import ReduceOp

CHUNK = 4096  # bytes from which a tensor goes alone


def _meta(name, shape, dtype="float32", op=ReduceOp.Sum, group=None, **scales):
    total = (sum(int(np.prod(s)) for s in group),) if group is not None else shape
    return Meta(name, messages.ALLREDUCE, dtype, total, int(op), group=group, **scales)


def _request(name, shape, dtype="float32", read_only=False, out=None, **kwargs):
    meta = _meta(name, shape, dtype, **kwargs)
    array = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return Request(meta, array, out, 0, read_only)


def _group(name, shapes, dtype="float32", **kwargs):
    meta = _meta(name, None, dtype, group=tuple(shapes), **kwargs)
    arrays = [np.ones(s, dtype) for s in shapes]
    return Request(meta, arrays, None, 0, False)


def _plan(requests, joined=(), metas=None, size=4, host=True):
    names = [m.name for m in metas or [r.meta for r in requests]]
    response = Response(messages.ALLREDUCE, names, metas or [], joined=joined)
    return plan_allreduce(response, requests, size, CHUNK, host)


def test_a_lone_host_tensor_goes_in_place():
    request = _request("a", (3,))
    plan = _plan([request])
    (unit,) = plan.units
    assert unit.in_place and not unit.fused and not unit.read_only
    assert unit.offsets == (0,) and unit.total == 3 and unit.positions == (0,)
    assert unit.members[0].array is request.array
    assert lone_host(request) == np.float32


@pytest.mark.parametrize("length", [0, 1, 7])
def test_lengths_zero_one_and_uneven_plan_alike(length):
    (unit,) = _plan([_request("a", (length,))]).units
    assert unit.in_place and unit.total == length


def test_small_tensors_fuse_at_aligned_offsets_in_order():
    requests = [_request("a", (3,)), _request("b", (17,), out=np.empty(17, "float32"))]
    requests.append(_request("c", (2, 5)))
    plan = _plan(requests)
    (unit,) = plan.units
    assert unit.fused and not unit.in_place
    # 64-byte alignment: 16 float32 per step
    assert unit.offsets == (0, 16, 48) and unit.total == 58
    assert [m.name for m in unit.members] == ["a", "b", "c"]
    assert unit.positions == (0, 1, 2)
    assert unit.members[1].out is requests[1].out
    assert plan.host_results


def test_float64_offsets_align_to_eight_elements():
    (unit,) = _plan([_request("a", (1,), "float64"), _request("b", (9,), "float64")]).units
    assert unit.offsets == (0, 8) and unit.total == 17


def test_a_group_fuses_its_members():
    plan = _plan([_group("g", [(2,), (3, 3), ()])])
    assert [m.shape for m in plan.members] == [(2,), (3, 3), ()]
    (unit,) = plan.units
    assert unit.fused and unit.offsets == (0, 16, 32) and unit.total == 33
    assert regroup([plan.members[0].request], ["x", "y", "z"]) == [["x", "y", "z"]]


def test_tensors_of_at_least_a_chunk_go_alone_after_the_fused_ones():
    big = CHUNK // 4
    requests = [_request("big", (big,)), _request("s1", (5,)), _request("under", (big - 1,))]
    requests.append(_request("s2", (2,)))
    plan = _plan(requests)
    fused, alone = plan.units
    assert fused.positions == (1, 2, 3) and fused.fused and not fused.in_place
    assert alone.positions == (0,) and alone.in_place and not alone.fused
    assert alone.total == big and alone.offsets == (0,)


def test_a_joined_rank_fuses_everything_and_fills_with_the_identity():
    metas = [_meta("a", (CHUNK,)), _meta("b", (3,))]
    plan = _plan([None, None], joined=(2,), metas=metas, size=4)
    (unit,) = plan.units
    assert unit.fused and not unit.in_place and unit.positions == (0, 1)
    assert all(m.request is None and m.array is None for m in unit.members)
    assert plan.fill == 0 and plan.reduction.contributors == 3


def test_a_rank_that_others_joined_fuses_even_a_lone_big_tensor():
    request = _request("a", (CHUNK,), op=ReduceOp.Average, postscale=2.0)
    plan = _plan([request], joined=(0,), metas=[request.meta], size=3)
    (unit,) = plan.units
    assert unit.fused and not unit.in_place
    assert plan.reduction.op == ReduceOp.Sum and plan.reduction.postscale == 2.0 / 2
    assert not plan.reduction.truncating_divide


@pytest.mark.parametrize(
    ("op", "dtype", "fill"),
    [
        (ReduceOp.Min, "float32", np.inf),
        (ReduceOp.Max, "int32", np.iinfo(np.int32).min),
        (ReduceOp.Min, "uint8", 255),
        (ReduceOp.Product, "int64", 1),
        (ReduceOp.Average, "float64", 0),
    ],
)
def test_identity_leaves_the_op_unchanged(op, dtype, fill):
    assert identity(op, dtype) == fill
    plan = _plan([None], joined=(1,), metas=[_meta("a", (2,), dtype, op=op)])
    assert plan.fill == identity(plan.reduction.op, dtype)


def test_integer_average_divides_afterwards_and_keeps_its_postscale():
    meta = _meta("a", (2,), "int32", op=ReduceOp.Average, postscale=3.0)
    got = reduction(meta, 5)
    assert got == (ReduceOp.Sum, 1.0, 3.0, 5, True, None)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_a_compressed_tensor_carries_its_wire_dtype_and_still_goes_in_place(wire):
    request = _request("a", (9,), op=ReduceOp.Average, compression=wire)
    plan = _plan([request])
    assert plan.reduction == (ReduceOp.Sum, 1.0, 0.25, 4, False, np.dtype(wire))
    (unit,) = plan.units
    assert unit.in_place and plan.wire == np.float32


def test_read_only_only_where_every_present_request_asks():
    asks = [_request("a", (2,), read_only=True), _request("b", (2,), read_only=True)]
    assert _plan(asks).units[0].read_only
    mixed = [_request("a", (2,), read_only=True), _request("b", (2,))]
    assert not _plan(mixed).units[0].read_only
    # a joined rank's absent members do not vote
    metas = [asks[0].meta, _meta("b", (2,))]
    assert _plan([asks[0], None], joined=(3,), metas=metas).units[0].read_only
    alone = [_request("big", (CHUNK,), read_only=True), _request("s", (2,))]
    small, big = _plan(alone).units
    assert big.read_only and not small.read_only


def test_integer_average_is_never_read_only():
    asks = [_request("a", (2,), "int32", read_only=True, op=ReduceOp.Average)]
    assert not _plan(asks).units[0].read_only
    asks = [_request("a", (2,), "int32", read_only=True, op=ReduceOp.Sum)]
    assert _plan(asks).units[0].read_only


def test_device_arrays_are_staged_never_in_place():
    requests = [_request("big", (CHUNK,)), _request("s", (2,))]
    plan = _plan(requests, host=False)
    assert not plan.host_results
    assert [u.in_place for u in plan.units] == [False, False]
    assert [u.fused for u in plan.units] == [True, False]


def test_float16_widens_to_float32_and_is_not_in_place():
    request = _request("a", (CHUNK,), "float16")
    plan = _plan([request])
    assert plan.dtype == np.float16 and plan.wire == np.float32
    assert not plan.host_results and not plan.units[0].in_place
    assert lone_host(request) is None


def test_lone_host_leaves_groups_and_non_numpy_arrays_to_the_planner():
    assert lone_host(_group("g", [(2,)])) is None
    request = _request("a", (2,))
    request.array = memoryview(request.array)
    assert lone_host(request) is None


def test_regroup_skips_joined_and_splits_groups():
    requests = [_request("a", (1,)), None, _group("g", [(1,), (2,)])]
    assert regroup(requests, [1, 2, 3]) == [1, None, [2, 3]]
