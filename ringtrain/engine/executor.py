"""Carries out the coordinator's responses on one rank, moving data only through its transport."""

import functools
import math

import numpy as np

from ringtrain import kernels
from ringtrain.buffers import ALIGNMENT, ResultPool, aligned_empty
from ringtrain.dtypes import by_name, is_integer, reduction_dtype
from ringtrain.engine import messages
from ringtrain.engine import timeline as tl
from ringtrain.engine.messages import member_shapes
from ringtrain.ops import ReduceOp
from ringtrain.transport.messages import displacements
from ringtrain.transport.schedule import segment_bounds

_CPU = kernels.backend_for(np.empty(0))


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


def _as_bytes(array):
    return array.reshape(-1).view(np.uint8)


class Executor:
    """Runs responses on one rank, moving data through ``transport`` (``router.Transport``).

    Host tensors of at least a ring chunk skip the fusion buffer (see ``_allreduce``).
    """

    def __init__(self, transport, pool, timeline):
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self._pool = pool
        self._results = ResultPool()
        self._direct = transport.chunk_bytes
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

    def _reduction(self, joined, meta):
        op = ReduceOp(meta.op)
        contributors = self.size - len(joined)
        postscale = meta.postscale
        if op == ReduceOp.Average:
            op = ReduceOp.Sum
            if not is_integer(meta.dtype):
                postscale = postscale / contributors
        return op, postscale, contributors

    def _finish_average(self, meta, outputs, contributors):
        if meta.op == ReduceOp.Average and is_integer(meta.dtype):
            for out in outputs:
                if out is not None:
                    np.floor_divide(out, contributors, out=out)

    def _allreduce(self, response, requests):
        if _op_of(response, requests) == _ADASUM:
            return self._adasum(requests)  # no rank has joined: the coordinator refuses it
        if len(requests) == 1 and not response.joined:
            lone = self._lone_host_allreduce(requests[0])
            if lone is not None:
                return lone
        # The response carries metas only when some rank has joined (and so has no request).
        metas = response.metas or [r.meta for r in requests]
        dtype = by_name(metas[0].dtype)
        wire = reduction_dtype(dtype)
        op, postscale, contributors = self._reduction(response.joined, metas[0])
        prescale = metas[0].prescale
        present = [r for r in requests if r is not None]
        backend = kernels.backend_for(_arrays(present[0])[0]) if present else _CPU
        members = [
            (meta.name, request, shape, array, out)
            for request, meta in zip(requests, metas, strict=True)
            for shape, array, out in zip(
                member_shapes(meta), *_arrays_and_outs(request, meta), strict=True
            )
        ]
        # A tensor goes through the ring by itself when it is alone or at least a ring chunk
        # long: fusing it would save no messages. Every rank splits alike, from shapes and
        # settings that all ranks share (never from where its own data lives), and fuses
        # everything while some rank has joined, with no tensors to read.
        alone = [
            not response.joined
            and (len(members) == 1 or math.prod(shape) * wire.itemsize >= self._direct)
            for _, _, shape, _, _ in members
        ]
        # A host tensor that needs no widening is read in place, and the result written
        # where it goes: no copies through a fusion buffer.
        direct = backend is _CPU and dtype == wire
        shareable = _shareable(metas[0], dtype)
        outputs = [None] * len(members)
        fused = [i for i, a in enumerate(alone) if not a]
        units = [fused] if fused else []
        units += [[i] for i, a in enumerate(alone) if a]
        for unit in units:
            read_only = shareable and all(
                members[i][1].read_only for i in unit if members[i][1] is not None
            )
            if direct and len(unit) == 1 and alone[unit[0]]:
                member = members[unit[0]]
                results = [self._in_place(member, wire, op, prescale, postscale, read_only)]
            else:
                results = self._fused(
                    [members[i] for i in unit],
                    backend,
                    dtype,
                    wire,
                    op,
                    (prescale, postscale),
                    read_only,
                )
            for i, result in zip(unit, results, strict=True):
                outputs[i] = result
        present_outputs = [o for m, o in zip(members, outputs, strict=True) if m[1] is not None]
        self._finish_average(metas[0], present_outputs, contributors)
        return _regroup(requests, present_outputs)

    def _adasum(self, requests):
        """Run Adasum over every tensor of ``requests`` (host arrays), each on its own."""
        results = []
        for request in requests:
            meta = request.meta
            dtype = by_name(meta.dtype)
            outputs = []
            for shape, array, out in zip(
                member_shapes(meta), *_arrays_and_outs(request, meta), strict=True
            ):
                start = tl.now_ns()
                count, wire = math.prod(shape), reduction_dtype(dtype)
                vector = self._pool.get("adasum", count, wire)
                np.multiply(array.reshape(-1), meta.prescale, out=vector)
                self.transport.adasum(vector, self._pool.get("adasum.peer", count, wire))
                result = out if out is not None else self._results.empty(shape, dtype)
                np.multiply(vector, meta.postscale, out=result.reshape(-1), casting="unsafe")
                self._span([meta.name], "ADASUM", start, tl.now_ns())
                outputs.append(result)
            results.append(outputs if meta.group is not None else outputs[0])
        return results

    def _lone_host_allreduce(self, request):
        """Run the common case, one NumPy tensor that needs no widening, as ``_allreduce`` would.

        Returns its results, or None where the case does not apply. It skips the general
        path's planning, which costs a lone call several microseconds.
        """
        meta = request.meta
        dtype = by_name(meta.dtype)
        host = type(request.array) is np.ndarray
        if meta.group is not None or not host or reduction_dtype(dtype) != dtype:
            return None
        op, postscale, contributors = self._reduction((), meta)
        read_only = request.read_only and _shareable(meta, dtype)
        member = (meta.name, request, meta.shape, request.array, request.out)
        result = self._in_place(member, dtype, op, meta.prescale, postscale, read_only)
        self._finish_average(meta, [result], contributors)
        return [result]

    def _in_place(self, member, wire, op, prescale, postscale, read_only):
        """Reduce one host tensor from where it lies into its result: no fusion buffer."""
        name, _, shape, array, out = member
        start = tl.now_ns()
        source = array.reshape(-1)
        if prescale != 1.0:
            source = self._pool.get("fusion", source.size, wire)
            _CPU.pack([array], source, [0], prescale)
        packed = tl.now_ns()
        if out is not None:
            result = out
            reduced = self.transport.allreduce(source, out.reshape(-1), op, postscale)
        else:
            flat, reduced = self.transport.allreduce_new(
                source, op, postscale, self._new_result(wire), read_only
            )
            result = flat.reshape(shape)
        gathered = tl.now_ns()
        self._spans([name], start, packed, reduced, gathered, gathered)
        return result

    def _new_result(self, dtype):
        """Return the function that makes a new 1-D result of ``dtype`` from the result pool."""
        return functools.partial(self._results.empty, dtype=dtype)

    def _fused(self, members, backend, dtype, wire, op, scales, read_only):
        """Reduce ``members`` through one fusion buffer; return their results (None: absent).

        ``scales`` is (prescale, postscale).
        """
        prescale, postscale = scales
        start = tl.now_ns()
        # Every member laid end to end, each aligned so that its slice of the result is
        # too; what lies between is unused.
        owners = [r for _, r, _, _, _ in members]
        shapes = [s for _, _, s, _, _ in members]
        sizes = [math.prod(s) for s in shapes]
        offsets = _aligned_displacements(sizes, wire.itemsize)
        total = offsets[-1] + sizes[-1]
        host = self._pool.get("fusion", total, wire)
        fill = identity(op, wire)
        for r, off, n in zip(owners, offsets, sizes, strict=True):
            if r is None:
                host[off : off + n] = fill
        here = [(m, off) for m, off in zip(members, offsets, strict=True) if m[1] is not None]
        sources = [array for (_, _, _, array, _), _ in here]
        source_offsets = [off for _, off in here]
        staging = host if backend is _CPU else backend.empty(len(host), wire)
        backend.pack(sources, staging, source_offsets, prescale)
        staged = staging is not host and len(host) > 0
        if staged:
            backend.to_host(staging, host)
        packed = tl.now_ns()
        if backend is _CPU and dtype == wire:
            # The ring writes straight into one new array whose slices are the results: no
            # copy out of the fusion buffer.
            result, reduced = self.transport.allreduce_new(
                host, op, postscale, self._new_result(wire), read_only
            )
            gathered = tl.now_ns()
            outputs = [
                _deliver(result[off : off + math.prod(shape)].reshape(shape), out)
                for (_, _, shape, _, out), off in here
            ]
        else:
            reduced = self.transport.allreduce(host, host, op, postscale)
            gathered = tl.now_ns()
            if staged:
                backend.to_device(host, staging)
            outputs = [
                out if out is not None else backend.empty(shape, dtype)
                for (_, _, shape, _, out), _ in here
            ]
            backend.unpack(staging, source_offsets, outputs, 1.0)
        names = list(dict.fromkeys(name for name, _, _, _, _ in members))
        self._spans(names, start, packed, reduced, gathered, tl.now_ns())
        produced = iter(outputs)
        return [next(produced) if r is not None else None for r in owners]

    def _spans(self, names, start, packed, reduced, gathered, unpacked):
        self._span(names, tl.MEMCPY_IN_FUSION_BUFFER, start, packed)
        self._span(names, tl.REDUCE_SCATTER, packed, reduced)
        self._span(names, tl.ALLGATHER, reduced, gathered)
        self._span(names, tl.MEMCPY_OUT_FUSION_BUFFER, gathered, unpacked)

    def _allgather(self, response, requests):
        results = []
        for meta, per_rank, request in zip(
            response.metas, response.per_rank, requests, strict=True
        ):
            start = tl.now_ns()
            dtype = by_name(meta.dtype)
            row_bytes = math.prod(meta.shape[1:]) * dtype.itemsize
            rows = [m.shape[0] if m is not None else 0 for m in per_rank]
            out = aligned_empty((sum(rows), *meta.shape[1:]), dtype)
            counts = [n * row_bytes for n in rows]
            displs = displacements(counts)
            send = _as_bytes(request.array) if request is not None else np.empty(0, np.uint8)
            self.transport.allgatherv(send, _as_bytes(out), counts, displs)
            self._span([meta.name], tl.ALLGATHER, start, tl.now_ns())
            results.append(out if request is not None else None)
        return results

    def _broadcast(self, response, requests):
        meta, request = response.metas[0], requests[0]
        start = tl.now_ns()
        dtype = by_name(meta.dtype)
        if request is None:
            out = self._pool.get("broadcast", math.prod(meta.shape), dtype)
        else:
            out = aligned_empty(meta.shape, dtype)
            if self.rank == meta.root:
                out[...] = request.array
        self.transport.broadcast(_as_bytes(out), meta.root)
        self._span([meta.name], "BROADCAST", start, tl.now_ns())
        return [out if request is not None else None]

    def _alltoall(self, response, requests):
        meta, per_rank, request = response.metas[0], response.per_rank[0], requests[0]
        start = tl.now_ns()
        dtype = by_name(meta.dtype)
        row_bytes = math.prod(meta.shape[1:]) * dtype.itemsize
        sent = [n * row_bytes for n in per_rank[self.rank].splits]
        got_rows = [m.splits[self.rank] for m in per_rank]
        got = [n * row_bytes for n in got_rows]
        out = aligned_empty((sum(got_rows), *meta.shape[1:]), dtype)
        self.transport.alltoallv(_as_bytes(request.array), sent, _as_bytes(out), got)
        self._span([meta.name], "ALLTOALL", start, tl.now_ns())
        return [out]

    def _reducescatter(self, response, requests):
        meta, request = response.metas[0], requests[0]
        start = tl.now_ns()
        dtype = by_name(meta.dtype)
        wire = reduction_dtype(dtype)
        op, postscale, contributors = self._reduction(response.joined, meta)
        row = math.prod(meta.shape[1:])
        row_bounds = segment_bounds(meta.shape[0], self.size)
        bounds = [(lo * row, hi * row) for lo, hi in row_bounds]
        buf = self._pool.get("fusion", math.prod(meta.shape), wire)
        _CPU.pack([request.array], buf, [0], meta.prescale)
        packed = tl.now_ns()
        self.transport.reduce_scatter(buf, buf, op, postscale, bounds)
        reduced = tl.now_ns()
        lo, hi = bounds[self.rank]
        first, last = row_bounds[self.rank]
        out = aligned_empty((last - first, *meta.shape[1:]), dtype)
        _CPU.unpack(buf[lo:hi], [0], [out], 1.0)
        self._finish_average(meta, [out], contributors)
        self._span([meta.name], tl.MEMCPY_IN_FUSION_BUFFER, start, packed)
        self._span([meta.name], tl.REDUCE_SCATTER, packed, reduced)
        self._span([meta.name], tl.MEMCPY_OUT_FUSION_BUFFER, reduced, tl.now_ns())
        return [out]


_ADASUM = int(ReduceOp.Adasum)


def _op_of(response, requests) -> int:
    """Return the op of ``response``: every tensor of an allreduce response shares it."""
    return (response.metas[0] if response.metas else requests[0].meta).op


def _shareable(meta, dtype) -> bool:
    """Return True if results of ``meta`` may be read-only (and shared by the host's ranks).

    They may where every caller said it never writes to them (checked apart), and no integer
    Average divides them afterwards.
    """
    return not (meta.op == ReduceOp.Average and is_integer(dtype))


def _arrays(request):
    """Return the arrays of ``request``: a group's list, or its one array in a list."""
    return request.array if request.meta.group is not None else [request.array]


def _arrays_and_outs(request, meta):
    """Return the arrays of ``request`` (of ``meta``) and where each goes (None: a new array).

    A joined rank has no request: None for both, per tensor of ``meta``.
    """
    count = len(member_shapes(meta))
    if request is None:
        return [None] * count, [None] * count
    return _arrays(request), [request.out] if meta.group is None else [None] * count


def _regroup(requests, outputs):
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


def _deliver(result, out):
    """Return ``result``, or copy it into the caller's ``out`` and return that."""
    if out is None:
        return result
    np.copyto(out, result)
    return out


def _aligned_displacements(sizes, itemsize):
    """Return start offsets for ``sizes`` laid end to end, each rounded up to ALIGNMENT bytes."""
    step = max(ALIGNMENT // itemsize, 1)
    return displacements([-(-size // step) * step for size in sizes])
