"""Plans an allreduce response on one rank, without moving data: what fuses, what goes in place.

``plan_allreduce`` turns a response and this rank's requests into an ``AllreducePlan``: the
reduction to run, and its units, each one reduction through the transport. The executor
carries plans out. The common lone host tensor skips the planning (``Executor``'s fast path):
``lone_host`` says when it applies, and it then runs as the one in-place unit that
``plan_allreduce`` would have planned.
"""

import dataclasses
import functools
import math
import operator
import typing

import numpy as np

from ringtrain.buffers import ALIGNMENT
from ringtrain.dtypes import by_name, is_integer, reduction_dtype
from ringtrain.engine.messages import member_shapes
from ringtrain.engine.results import shareable
from ringtrain.ops import ReduceOp, as_reduce_op
from ringtrain.transport import codec as codecs
from ringtrain.transport.codec import WireCodec
from ringtrain.transport.messages import displacements


def identity(op: ReduceOp, dtype) -> object:
    """Return the element that leaves ``op`` unchanged: what a joined rank contributes."""
    dtype = np.dtype(dtype)
    if op in (ReduceOp.Sum, ReduceOp.Average):
        return 0
    if op == ReduceOp.Product:
        return 1
    info = np.iinfo(dtype) if is_integer(dtype) else None
    if op == ReduceOp.Min:
        return info.max if info else np.inf
    return info.min if info else -np.inf


class Reduction(typing.NamedTuple):
    """The reduction that the transport runs for one meta, once ``contributors`` ranks take part.

    Average becomes Sum: a float Average divides through ``postscale``, an integer one
    divides its results by ``contributors`` afterwards, truncating toward zero as Horovod
    and C do (``truncating_divide``). ``codec``: the ``transport.codec.WireCodec`` that
    partial sums cross the link through, or None.
    """

    op: ReduceOp
    prescale: float
    postscale: float
    contributors: int
    truncating_divide: bool
    codec: WireCodec | None = None


def reduction(meta, contributors: int) -> Reduction:
    """Return the reduction of ``meta`` (an allreduce or reduce-scatter) over ``contributors``."""
    op = as_reduce_op(meta.op)
    postscale = meta.postscale
    truncating_divide = False
    if op == ReduceOp.Average:
        op = ReduceOp.Sum
        if is_integer(meta.dtype):
            truncating_divide = True
        else:
            postscale = postscale / contributors
    codec = codecs.by_name(meta.compression)
    return Reduction(op, meta.prescale, postscale, contributors, truncating_divide, codec)


class Member(typing.NamedTuple):
    """One tensor of a response on this rank: a named tuple, cheap on the per-tensor path.

    ``request`` is None where this rank has joined (no data: ``array`` and ``out`` None);
    ``out`` is where the caller wants the result, or None for a new array.
    """

    name: str
    request: object
    shape: tuple
    array: object
    out: object


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """One reduction through the transport, over ``members`` laid out at ``offsets``.

    ``fused``: the unit gathers the tensors that do not go alone. ``in_place``: its one host
    tensor is read from where it lies, and its result written where it goes, with no fusion
    buffer; otherwise the members are packed into a fusion buffer of ``total`` elements,
    each at its ALIGNMENT-aligned offset. ``read_only``: a new result may be read-only and
    shared by the host's ranks. ``positions``: each member's place among the plan's members;
    ``ends``: where each member's elements end in the buffer. ``present``: every member has
    its data on this rank. ``flat``: every member is 1-D, so its slice of the buffer is its
    result as it is.
    """

    members: tuple
    positions: tuple
    fused: bool
    in_place: bool
    read_only: bool
    offsets: tuple
    total: int
    ends: tuple  # where each member's elements end: offsets[i] + its size
    present: bool
    flat: bool


@dataclasses.dataclass(frozen=True, slots=True)
class AllreducePlan:
    """How this rank runs one allreduce response: ``reduction`` over each of ``units`` in turn.

    ``members`` holds every tensor in response order; ``dtype`` is theirs, ``wire`` the type
    they are reduced in (float16 widens). ``host_results``: the tensors are host arrays that
    need no widening, so the transport writes each result into new memory (a fused unit's
    results are slices of one array) instead of the fusion buffer being unpacked. ``fill``
    is what a joined rank's members hold. ``one_each``: every request is one tensor (none
    is a group), so the present members' results are the requests' results as they are.
    """

    reduction: Reduction
    dtype: np.dtype
    wire: np.dtype
    host_results: bool
    fill: object
    members: tuple
    units: tuple
    one_each: bool


def plan_allreduce(response, requests, size: int, direct_bytes: int, host: bool) -> AllreducePlan:
    """Return the plan of allreduce ``response`` (not Adasum) on a rank of ``size`` ranks.

    ``requests`` holds this rank's request per name (None where it has joined);
    ``direct_bytes`` is the reduced size from which a tensor goes alone; ``host``: the
    present arrays are host arrays (the CPU backend).
    """
    # The response carries metas only when some rank has joined (and so has no request).
    metas = response.metas or [r.meta for r in requests]
    dtype = by_name(metas[0].dtype)
    wire = reduction_dtype(dtype)
    reduced = reduction(metas[0], size - len(response.joined))
    everyone = members(requests, metas)
    one_each = all([m.group is None for m in metas])
    if len(metas) == 1 and metas[0].group:
        shapes = metas[0].group
    else:
        shapes = tuple([m.shape for m in metas] if one_each else _shapes(metas))
    layout = _layout(shapes, bool(response.joined), direct_bytes, wire.itemsize)
    # A host tensor that needs no widening is read in place, and the result written
    # where it goes: no copies through a fusion buffer.
    host_results = host and dtype == wire
    share = shareable(metas[0], dtype)
    units = tuple(_unit(everyone, requests, geometry, host_results, share) for geometry in layout)
    fill = identity(reduced.op, wire)
    return AllreducePlan(reduced, dtype, wire, host_results, fill, everyone, units, one_each)


def _shapes(metas) -> tuple:
    """Return the shapes of every tensor of ``metas``, in order."""
    return tuple(shape for meta in metas for shape in member_shapes(meta))


class _Geometry(typing.NamedTuple):
    """Where one unit's members lie: a unit's layout, without the data of any call."""

    positions: tuple
    fused: bool
    offsets: tuple
    total: int
    ends: tuple
    flat: bool  # every member is 1-D


@functools.lru_cache(maxsize=256)
def _layout(shapes: tuple, joined: bool, direct_bytes: int, itemsize: int) -> tuple:
    """Return the ``_Geometry`` of each unit of tensors of ``shapes``, reduced in ``itemsize``.

    Planned once per set of shapes and kept while it repeats: a step's gradients come
    back with the same shapes every step. A tensor goes through the ring by itself when it
    is alone or at least a ring chunk (``direct_bytes``) long: fusing it would save no
    messages. Every rank splits alike, from shapes and settings that all ranks share
    (never from where its own data lives), and fuses everything while some rank has
    ``joined``, with no tensors to read.
    """
    sizes = [math.prod(shape) for shape in shapes]
    if joined or len(sizes) == 1:
        alone = [not joined] * len(sizes)
    else:
        alone = [count * itemsize >= direct_bytes for count in sizes]
    lone = [(i,) for i, a in enumerate(alone) if a]
    if not lone:  # the common case of a fused response: every member in one unit
        fused = tuple(range(len(sizes)))
    else:
        fused = tuple(i for i, a in enumerate(alone) if not a)
    layout = []
    for positions in [fused, *lone] if fused else lone:
        chosen = [sizes[i] for i in positions]
        # One tensor lies at 0; only a fusion buffer of several needs the aligned layout.
        offsets = aligned_displacements(chosen, itemsize) if len(chosen) > 1 else [0]
        ends = tuple(map(operator.add, offsets, chosen))
        flat = all(len(shapes[i]) == 1 for i in positions)
        goes_fused = not alone[positions[0]]
        layout.append(_Geometry(positions, goes_fused, tuple(offsets), ends[-1], ends, flat))
    return tuple(layout)


def _unit(everyone, requests, geometry, host_results, share) -> Unit:
    """Return the unit of the members of ``everyone`` that ``geometry`` lays out."""
    positions = geometry.positions
    if len(positions) == len(everyone):
        chosen = everyone
        present = None not in requests
        asking = requests if present else [r for r in requests if r is not None]
    else:
        chosen = tuple(everyone[i] for i in positions)
        present = all(m.request is not None for m in chosen)
        # A group's members share their request: each request is asked once.
        asking = {id(m.request): m.request for m in chosen if m.request is not None}.values()
    read_only = share and all([r.read_only for r in asking])
    in_place = host_results and not geometry.fused
    return Unit(
        chosen,
        positions,
        geometry.fused,
        in_place,
        read_only,
        geometry.offsets,
        geometry.total,
        geometry.ends,
        present,
        geometry.flat,
    )


def lone_host(request):
    """Return the dtype of ``request`` if it alone may skip ``plan_allreduce``, else None.

    It may, where no rank has joined, when it is one NumPy tensor that needs no widening:
    its plan is then one in-place unit, with ``reduction(meta, size)``, read-only where the
    request asks and ``shareable`` allows.
    """
    meta = request.meta
    if meta.group is not None or type(request.array) is not np.ndarray:
        return None
    dtype = by_name(meta.dtype)
    return dtype if reduction_dtype(dtype) == dtype else None


def members(requests, metas) -> tuple:
    """Return the tensors of ``requests`` (of ``metas``, one per name) in order, as Members."""
    if None not in requests and all([m.group is None for m in metas]):
        # The common case, every request here and one tensor: built column by column.
        names = [m.name for m in metas]
        shapes = [m.shape for m in metas]
        outs = [r.out for r in requests]
        return tuple(map(Member, names, requests, shapes, [r.array for r in requests], outs))
    everyone = []
    for request, meta in zip(requests, metas, strict=True):
        shapes = member_shapes(meta)
        arrays_, outs = _arrays_and_outs(request, meta)
        if not len(shapes) == len(arrays_) == len(outs):
            raise ValueError(
                f"tensor {meta.name!r}: {len(shapes)} shapes for {len(arrays_)} arrays"
            )
        count = len(shapes)
        everyone += map(Member, [meta.name] * count, [request] * count, shapes, arrays_, outs)
    return tuple(everyone)


def regroup(requests, outputs) -> list:
    """Return one result per request from the outputs of the present requests' tensors."""
    results, taken = [], 0
    for request in requests:
        if request is None:
            results.append(None)
        elif request.meta.group is not None:
            results.append(outputs[taken : taken + len(request.array)])
            taken += len(request.array)
        else:
            results.append(outputs[taken])
            taken += 1
    return results


def arrays(request) -> list:
    """Return the arrays of ``request``: a group's list, or its one array in a list."""
    return request.array if request.meta.group is not None else [request.array]


def _arrays_and_outs(request, meta):
    """Return the arrays of ``request`` (of ``meta``) and where each goes (None: a new array).

    A joined rank has no request: None for both, per tensor of ``meta``.
    """
    count = len(member_shapes(meta))
    if request is None:
        return [None] * count, [None] * count
    return arrays(request), [request.out] if meta.group is None else [None] * count


def aligned_displacements(sizes, itemsize) -> list:
    """Return start offsets for ``sizes`` laid end to end, each rounded up to ALIGNMENT bytes."""
    step = max(ALIGNMENT // itemsize, 1)
    return displacements([-(-size // step) * step for size in sizes])
