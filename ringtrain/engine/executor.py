"""Carries out the coordinator's responses on one rank, moving data only through its transport."""

import functools
import math

import numpy as np

from ringtrain import kernels
from ringtrain.buffers import aligned_empty
from ringtrain.engine import collective_plans, messages, planner
from ringtrain.engine import timeline as tl
from ringtrain.engine.results import ResultMemory, deliver, shareable
from ringtrain.ops import ReduceOp

_CPU = kernels.backend_for(np.empty(0))


def _as_bytes(array):
    return array.reshape(-1).view(np.uint8)


class Executor:
    """Runs responses on one rank, moving data through ``transport`` (``router.Transport``).

    It carries out ``planner.AllreducePlan``s; a lone host tensor skips the planning.
    """

    def __init__(self, transport, pool, timeline):
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self._pool = pool
        self._results = ResultMemory()
        self.timeline = timeline  # where spans go, or None; the engine may swap it
        self._run = {
            messages.ALLREDUCE: self._allreduce,
            messages.ALLGATHER: self._allgather,
            messages.BROADCAST: self._broadcast,
            messages.ALLTOALL: self._alltoall,
            messages.REDUCESCATTER: self._reducescatter,
            messages.JOIN: lambda response, requests: [response.last_joined],
        }

    def run(self, response, requests) -> list:
        """Run ``response``; ``requests`` holds this rank's request per name (None if joined).

        Returns the result per name (None where this rank had no request).
        """
        return self._run[response.kind](response, requests)

    def _span(self, names, phase, start, end):
        timeline = self.timeline
        if timeline is not None:
            for name in names:
                timeline.span(name, phase, start, end)

    def _finish_average(self, reduction, outputs):
        """Divide the results of an integer Average (``reduction``) by its contributors.

        The quotient is truncated toward zero, as Horovod's and C's: the remainder (which
        ``np.fmod`` gives the sign of the sum) is taken off first, so the division is exact.
        """
        if reduction.truncating_divide:
            for out in outputs:
                if out is not None:
                    out -= np.fmod(out, reduction.contributors)
                    np.floor_divide(out, reduction.contributors, out=out)

    def _allreduce(self, response, requests):
        if _op_of(response, requests) == _ADASUM:
            return self._adasum(requests)  # no rank has joined: the coordinator refuses it
        if len(requests) == 1 and not response.joined:
            lone = self._lone_host_allreduce(requests[0])
            if lone is not None:
                return lone
        present = next((r for r in requests if r is not None), None)
        backend = kernels.backend_for(planner.arrays(present)[0]) if present else _CPU
        direct = self.transport.chunk_bytes  # the tuner may change it between responses
        plan = planner.plan_allreduce(response, requests, self.size, direct, backend is _CPU)
        outputs = [None] * len(plan.members)
        for unit in plan.units:
            if unit.in_place:
                name, _, shape, array, out = unit.members[0]
                reduction, read_only = plan.reduction, unit.read_only
                results = [self._in_place(name, shape, array, out, plan.wire, reduction, read_only)]
            elif backend is _CPU:
                results = self._fused(unit, plan)
            else:
                results = self._on_device(unit, plan, backend)
            if len(plan.units) == 1 and unit.present:  # every member's result, in order
                self._finish_average(plan.reduction, results)
                return results if plan.one_each else planner.regroup(requests, results)
            for i, result in zip(unit.positions, results, strict=True):
                outputs[i] = result
        present_outputs = [
            o for m, o in zip(plan.members, outputs, strict=True) if m.request is not None
        ]
        self._finish_average(plan.reduction, present_outputs)
        return planner.regroup(requests, present_outputs)

    def _adasum(self, requests):
        """Run Adasum over every tensor of ``requests`` (host arrays), each on its own."""
        outputs = []
        for plan in collective_plans.plan_adasum(requests):
            start = tl.now_ns()
            vector = self._pool.get("adasum", plan.count, plan.wire)
            np.multiply(plan.array.reshape(-1), plan.prescale, out=vector)
            self.transport.adasum(vector, self._pool.get("adasum.peer", plan.count, plan.wire))
            out = plan.out
            result = out if out is not None else self._results.empty(plan.shape, plan.dtype)
            np.multiply(vector, plan.postscale, out=result.reshape(-1), casting="unsafe")
            self._span([plan.name], "ADASUM", start, tl.now_ns())
            outputs.append(result)
        return planner.regroup(requests, outputs)

    def _lone_host_allreduce(self, request):
        """Run the common case, one NumPy tensor that needs no widening, as ``_allreduce`` would.

        Returns its results, or None where the case does not apply (``planner.lone_host``).
        It skips the general path's planning, which costs a lone call several microseconds.
        """
        dtype = planner.lone_host(request)
        if dtype is None:
            return None
        meta = request.meta
        reduction = planner.reduction(meta, self.size)
        read_only = request.read_only and shareable(meta, dtype)
        result = self._in_place(
            meta.name, meta.shape, request.array, request.out, dtype, reduction, read_only
        )
        self._finish_average(reduction, [result])
        return [result]

    def _in_place(self, name, shape, array, out, wire, reduction, read_only):
        """Reduce one host tensor from where it lies into its result: no fusion buffer."""
        start = tl.now_ns()
        source = array.reshape(-1)
        if reduction.prescale != 1.0:
            source = self._pool.get("fusion", source.size, wire)
            _CPU.pack([array], source, [0], reduction.prescale)
        packed = tl.now_ns()
        op, postscale, codec = reduction.op, reduction.postscale, reduction.codec
        if out is not None:
            result = out
            reduced = self.transport.allreduce(source, out.reshape(-1), op, postscale, codec)
        else:
            flat, reduced = self.transport.allreduce_new(
                source, op, postscale, self._results.factory(wire), read_only, codec
            )
            result = flat.reshape(shape)
        gathered = tl.now_ns()
        self._spans([name], start, packed, reduced, gathered, gathered)
        return result

    def _fused(self, unit, plan):
        """Reduce host ``unit`` (of ``plan``) through one fusion buffer; return its results.

        A joined rank's members get None.
        """
        op, prescale, postscale = plan.reduction[:3]
        codec, wire = plan.reduction.codec, plan.wire
        start = tl.now_ns()
        # Every member laid end to end, each aligned so that its slice of the result is
        # too; what lies between is unused.
        buffer = self._pool.get("fusion", unit.total, wire)
        here, offsets, ends = self._present(unit, plan, buffer)
        _CPU.pack([member.array for member in here], buffer, offsets, prescale)
        packed = tl.now_ns()
        if plan.host_results:
            # The ring writes straight into one new array whose slices are the results: no
            # copy out of the fusion buffer.
            result, reduced = self.transport.allreduce_new(
                buffer, op, postscale, self._results.factory(wire), unit.read_only, codec
            )
            gathered = tl.now_ns()
            outputs = _slices(result, offsets, ends, here, unit.flat)
        else:
            reduced = self.transport.allreduce(buffer, buffer, op, postscale, codec)
            gathered = tl.now_ns()
            outputs = [
                m.out if m.out is not None else _CPU.empty(m.shape, plan.dtype) for m in here
            ]
            _CPU.unpack(buffer, offsets, outputs, 1.0)
        return self._unit_results(unit, here, outputs, (start, packed, reduced, gathered))

    def _on_device(self, unit, plan, backend):
        """Reduce GPU ``unit`` (of ``plan``) through one device buffer; return its results.

        The members are packed on the GPU by one launch (a lone one that needs no widening
        or scaling is reduced where it lies), the transport carries the buffer (through the
        host, once each way), and the results are views of one device array
        (``kernels.device_view``: no numba array is built for them): the reduced buffer
        itself where no member narrows, else one unpack launch into the tensors' dtype.
        Members with an ``out`` are unpacked into it by one more launch.
        """
        op, prescale, postscale = plan.reduction[:3]
        codec, wire = plan.reduction.codec, plan.wire
        start = tl.now_ns()
        if not unit.fused and unit.present and plan.dtype == wire and prescale == 1:
            here, offsets = unit.members, (0,)
            buffer = here[0].array.reshape(-1)
        else:
            buffer = backend.empty(unit.total, wire)
            here, offsets, _ = self._present(unit, plan, buffer, backend)
            backend.pack([member.array for member in here], buffer, offsets, prescale)
        packed = tl.now_ns()
        new = functools.partial(backend.empty, dtype=wire)
        reduced_values, reduced = self.transport.allreduce_new(
            buffer, op, postscale, new, False, codec
        )
        gathered = tl.now_ns()
        into_out = [i for i, member in enumerate(here) if member.out is not None]
        if into_out:
            outs = [here[i].out for i in into_out]
            backend.unpack(reduced_values, [offsets[i] for i in into_out], outs, 1.0)
        result = reduced_values
        if plan.dtype != wire and len(into_out) < len(here):  # narrowed once, for the rest
            result = backend.empty(len(reduced_values), plan.dtype)
            backend.unpack(reduced_values, [0], [result], 1.0)
        fresh = [i for i, member in enumerate(here) if member.out is None]
        starts, shapes = [offsets[i] for i in fresh], [here[i].shape for i in fresh]
        views = iter(backend.views(result, starts, shapes))
        outputs = [member.out if member.out is not None else next(views) for member in here]
        # Once: a result is written when its handle completes, whatever stream reads it.
        backend.finish_queued()
        return self._unit_results(unit, here, outputs, (start, packed, reduced, gathered))

    def _present(self, unit, plan, buffer, backend=_CPU):
        """Return ``unit``'s members that this rank holds, with their offsets and ends.

        Where a member is missing (its rank has joined), ``buffer`` holds ``plan.fill``
        there, what leaves the reduction unchanged.
        """
        if unit.present:
            return unit.members, unit.offsets, unit.ends
        if backend is _CPU:
            filled = buffer
        else:
            filled = np.empty(len(buffer), buffer.dtype)
        here, offsets, ends = [], [], []
        for member, off, end in zip(unit.members, unit.offsets, unit.ends, strict=True):
            if member.request is None:
                filled[off:end] = plan.fill
            else:
                here.append(member)
                offsets.append(off)
                ends.append(end)
        if filled is not buffer:
            backend.to_device(filled, buffer)
        return here, offsets, ends

    def _unit_results(self, unit, here, outputs, times):
        """Return ``unit``'s results from those of the members ``here``; write its spans.

        ``times`` are when the unit started, was packed, reduced and gathered. A joined
        rank's members get None.
        """
        if self.timeline is not None:
            names = list(dict.fromkeys(member.name for member in unit.members))
            self._spans(names, *times, tl.now_ns())
        if unit.present:
            return outputs
        produced = iter(outputs)
        return [next(produced) if m.request is not None else None for m in unit.members]

    def _spans(self, names, start, packed, reduced, gathered, unpacked):
        if self.timeline is None:
            return  # the common case: four calls fewer
        self._span(names, tl.MEMCPY_IN_FUSION_BUFFER, start, packed)
        self._span(names, tl.REDUCE_SCATTER, packed, reduced)
        self._span(names, tl.ALLGATHER, reduced, gathered)
        self._span(names, tl.MEMCPY_OUT_FUSION_BUFFER, gathered, unpacked)

    def _allgather(self, response, requests):
        results = []
        for plan, request in zip(
            collective_plans.plan_allgather(response, requests), requests, strict=True
        ):
            start = tl.now_ns()
            out = aligned_empty(plan.shape, plan.dtype)
            send = _as_bytes(request.array) if plan.keeps else np.empty(0, np.uint8)
            self.transport.allgatherv(send, _as_bytes(out), plan.counts, plan.displacements)
            self._span([plan.name], tl.ALLGATHER, start, tl.now_ns())
            results.append(out if plan.keeps else None)
        return results

    def _broadcast(self, response, requests):
        plan = collective_plans.plan_broadcast(response, requests, self.rank)
        start = tl.now_ns()
        if plan.keeps:
            out = aligned_empty(plan.shape, plan.dtype)
            if plan.sends:
                out[...] = requests[0].array
        else:
            out = self._pool.get("broadcast", math.prod(plan.shape), plan.dtype)
        self.transport.broadcast(_as_bytes(out), plan.root)
        self._span([plan.name], "BROADCAST", start, tl.now_ns())
        return [out if plan.keeps else None]

    def _alltoall(self, response, requests):
        plan = collective_plans.plan_alltoall(response, self.rank)
        start = tl.now_ns()
        out = aligned_empty(plan.shape, plan.dtype)
        self.transport.alltoallv(_as_bytes(requests[0].array), plan.sent, _as_bytes(out), plan.got)
        self._span([plan.name], "ALLTOALL", start, tl.now_ns())
        return [out]

    def _reducescatter(self, response, requests):
        plan = collective_plans.plan_reducescatter(response, self.rank, self.size)
        reduction = plan.reduction
        start = tl.now_ns()
        buf = self._pool.get("fusion", plan.count, plan.wire)
        _CPU.pack([requests[0].array], buf, [0], reduction.prescale)
        packed = tl.now_ns()
        self.transport.reduce_scatter(buf, buf, reduction.op, reduction.postscale, plan.bounds)
        reduced = tl.now_ns()
        lo, hi = plan.bounds[self.rank]
        out = aligned_empty(plan.shape, plan.dtype)
        _CPU.unpack(buf[lo:hi], [0], [out], 1.0)
        self._finish_average(reduction, [out])
        self._span([plan.name], tl.MEMCPY_IN_FUSION_BUFFER, start, packed)
        self._span([plan.name], tl.REDUCE_SCATTER, packed, reduced)
        self._span([plan.name], tl.MEMCPY_OUT_FUSION_BUFFER, reduced, tl.now_ns())
        return [out]


def _slices(result, offsets, ends, members, flat) -> list:
    """Return each of ``members``' result: its slice of ``result``, or its ``out`` filled from it.

    A ``flat`` unit's members are 1-D, so their slices need no reshape.
    """
    if flat:
        outputs = list(map(result.__getitem__, map(slice, offsets, ends)))
    else:
        outputs = [
            result[o:e].reshape(m.shape) for m, o, e in zip(members, offsets, ends, strict=True)
        ]
    for i, member in enumerate(members):
        if member.out is not None:
            outputs[i] = deliver(outputs[i], member.out)
    return outputs


_ADASUM = int(ReduceOp.Adasum)


def _op_of(response, requests) -> int:
    """Return the op of ``response``: every tensor of an allreduce response shares it."""
    return (response.metas[0] if response.metas else requests[0].meta).op
