"""Plans the collectives beside the fused allreduce: what each rank moves, and where results live.

Each ``plan_*`` function is pure: a response, this rank's requests (None where it has
joined) and its place in the job in, one plan per name out, which the executor carries out
through its transport without deciding anything. Counts are the bytes that the transport
moves; shapes and dtypes are the results'. A result lives in new aligned memory that the
caller keeps, except on a rank without a request: it takes part (so that the other ranks'
collective completes) with scratch memory that nobody keeps, and its result is None.
``ringtrain.engine.planner`` plans the fused allreduce (every op but Adasum); Adasum,
which combines each tensor on its own, is planned here.
"""

import math
import typing

import numpy as np

from ringtrain.dtypes import by_name, reduction_dtype
from ringtrain.engine import planner
from ringtrain.engine.planner import Reduction
from ringtrain.transport.messages import displacements
from ringtrain.transport.schedule import segment_bounds


class GatherPlan(typing.NamedTuple):
    """An allgather of one name: every rank's rows end to end, in rank order.

    ``counts[r]`` bytes come from rank r, to byte ``displacements[r]`` of the result of
    ``shape``; ``keeps``: this rank has a request (else it sends nothing, keeps nothing).
    """

    name: str
    dtype: np.dtype
    shape: tuple
    counts: tuple
    displacements: tuple
    keeps: bool


def plan_allgather(response, requests) -> list[GatherPlan]:
    """Return the plan of each name of allgather ``response`` (ranks' rows may differ)."""
    plans = []
    for meta, per_rank, request in zip(response.metas, response.per_rank, requests, strict=True):
        dtype = by_name(meta.dtype)
        row_bytes = math.prod(meta.shape[1:]) * dtype.itemsize
        rows = [m.shape[0] if m is not None else 0 for m in per_rank]
        counts = [n * row_bytes for n in rows]
        shape = (sum(rows), *meta.shape[1:])
        plans.append(
            GatherPlan(
                meta.name,
                dtype,
                shape,
                tuple(counts),
                tuple(displacements(counts)),
                request is not None,
            )
        )
    return plans


class BroadcastPlan(typing.NamedTuple):
    """A broadcast of one name from rank ``root`` of the job.

    ``sends``: this rank is the root, whose data every rank ends with; ``keeps``: this rank
    has a request, so its result is new memory rather than scratch.
    """

    name: str
    dtype: np.dtype
    shape: tuple
    root: int
    sends: bool
    keeps: bool


def plan_broadcast(response, requests, rank: int) -> BroadcastPlan:
    """Return the plan of broadcast ``response`` (one name) on ``rank``."""
    meta, request = response.metas[0], requests[0]
    keeps = request is not None
    sends = keeps and rank == meta.root
    return BroadcastPlan(meta.name, by_name(meta.dtype), meta.shape, meta.root, sends, keeps)


class AlltoallPlan(typing.NamedTuple):
    """An alltoall of one name: ``sent[r]`` bytes go to rank r, ``got[r]`` come from it.

    The result, of ``shape``, holds what came, in rank order.
    """

    name: str
    dtype: np.dtype
    shape: tuple
    sent: tuple
    got: tuple


def plan_alltoall(response, rank: int) -> AlltoallPlan:
    """Return the plan of alltoall ``response`` (one name, every rank present) on ``rank``."""
    meta, per_rank = response.metas[0], response.per_rank[0]
    dtype = by_name(meta.dtype)
    row_bytes = math.prod(meta.shape[1:]) * dtype.itemsize
    got_rows = [m.splits[rank] for m in per_rank]
    return AlltoallPlan(
        meta.name,
        dtype,
        (sum(got_rows), *meta.shape[1:]),
        tuple(n * row_bytes for n in per_rank[rank].splits),
        tuple(n * row_bytes for n in got_rows),
    )


class ScatterPlan(typing.NamedTuple):
    """A reduce-scatter of one name: ``reduction`` over ``count`` elements, reduced in ``wire``.

    Rank r ends with elements ``bounds[r]`` of the flat sum (whole rows); this rank's result
    has ``shape`` and ``dtype``.
    """

    name: str
    reduction: Reduction
    dtype: np.dtype
    wire: np.dtype
    count: int
    bounds: tuple
    shape: tuple


def plan_reducescatter(response, rank: int, size: int) -> ScatterPlan:
    """Return the plan of reduce-scatter ``response`` (one name) on ``rank`` of ``size``.

    Rows are dealt out as the ring deals its segments: the first ranks take one more where
    they do not divide evenly.
    """
    meta = response.metas[0]
    dtype = by_name(meta.dtype)
    row = math.prod(meta.shape[1:])
    row_bounds = segment_bounds(meta.shape[0], size)
    first, last = row_bounds[rank]
    return ScatterPlan(
        meta.name,
        planner.reduction(meta, size - len(response.joined)),
        dtype,
        reduction_dtype(dtype),
        math.prod(meta.shape),
        tuple((lo * row, hi * row) for lo, hi in row_bounds),
        (last - first, *meta.shape[1:]),
    )


class AdasumPlan(typing.NamedTuple):
    """One tensor of an Adasum response, combined on its own: ``count`` elements in ``wire``.

    It is scaled by ``prescale`` before and ``postscale`` after; its result goes to ``out``
    (the caller's), or new memory of ``shape`` and ``dtype`` where that is None.
    """

    name: str
    array: object
    shape: tuple
    dtype: np.dtype
    wire: np.dtype
    count: int
    prescale: float
    postscale: float
    out: object


def plan_adasum(requests) -> list[AdasumPlan]:
    """Return the plan of each tensor of an Adasum response (every rank present)."""
    plans = []
    for member in planner.members(requests, [r.meta for r in requests]):
        meta = member.request.meta
        dtype = by_name(meta.dtype)
        plans.append(
            AdasumPlan(
                meta.name,
                member.array,
                member.shape,
                dtype,
                reduction_dtype(dtype),
                math.prod(member.shape),
                meta.prescale,
                meta.postscale,
                member.out,
            )
        )
    return plans
