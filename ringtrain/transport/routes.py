"""The routes: each transport of ``ringtrain.transport`` behind the one contract of ``calls``.

``router.Transport`` holds one route per ``choice.Route`` that the job can take, and hands
each call to the one that ``choice.choose`` names. A route carries a call as its transport
runs it; ``StagedRoute``, for arrays in GPU memory, copies the call to the host once, hands
the host copy back to the router, and copies the result back once, and ``DeviceRoute``, where
MPI is CUDA-aware, hands the GPU arrays to MPI's own allreduce instead.
"""

import time

from ringtrain import kernels
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp, as_reduce_op
from ringtrain.transport.calls import (
    Adasum,
    Allgather,
    Alltoall,
    Broadcast,
    Carried,
    Memory,
    Reduce,
)
from ringtrain.transport.choice import Collective
from ringtrain.transport.local import copy_scaled

_REDUCTIONS = frozenset({Collective.ALLREDUCE, Collective.REDUCE_SCATTER})


def _destination(call: Reduce):
    """Return where ``call``'s result goes: its ``dst``, or a new array from its ``new``."""
    return call.dst if call.dst is not None else call.new(len(call.src))


class LocalRoute:
    """A reduction over one rank, or over no elements: a copy, scaled."""

    memory = Memory.HOST | Memory.DEVICE
    collectives = _REDUCTIONS

    def run(self, call: Reduce) -> Carried:
        """Write ``call.src`` times its postscale to its destination."""
        dst = _destination(call)
        copy_scaled(call.src, dst, call.postscale)
        return dst, time.perf_counter_ns()


class MessagesRoute:
    """Every collective as MPI messages (``messages.MessageTransport``).

    With ``ring_allgather``, an allgather runs through the transport's own ring instead of
    MPI's collective (``choice.Route.RING``).
    """

    memory = Memory.HOST
    collectives = frozenset(Collective)

    def __init__(self, messages, ring_allgather: bool = False):
        self._messages = messages
        self._carry = {
            Reduce: self._reduce,
            Allgather: self._ring_allgather if ring_allgather else self._allgather,
            Broadcast: self._broadcast,
            Alltoall: self._alltoall,
            Adasum: self._adasum,
        }

    def run(self, call) -> Carried:
        """Carry ``call`` over MPI messages."""
        return self._carry[type(call)](call)

    def _reduce(self, call: Reduce) -> Carried:
        dst = _destination(call)
        allgather = call.collective is Collective.ALLREDUCE
        reduced = self._messages.ring(
            call.src, dst, call.op, call.postscale, call.bounds, allgather, call.codec
        )
        return dst, reduced

    def _allgather(self, call: Allgather) -> Carried:
        self._messages.allgatherv(call.send, call.recv, call.counts, call.displacements)
        return call.recv, time.perf_counter_ns()

    def _ring_allgather(self, call: Allgather) -> Carried:
        self._messages.allgatherv_ring(call.send, call.recv, call.counts, call.displacements)
        return call.recv, time.perf_counter_ns()

    def _broadcast(self, call: Broadcast) -> Carried:
        self._messages.broadcast(call.buffer, call.root)
        return call.buffer, time.perf_counter_ns()

    def _alltoall(self, call: Alltoall) -> Carried:
        self._messages.alltoallv(call.send, call.sent, call.recv, call.got)
        return call.recv, time.perf_counter_ns()

    def _adasum(self, call: Adasum) -> Carried:
        self._messages.adasum(call.vector, call.scratch)
        return call.vector, time.perf_counter_ns()


class SharedRoute:
    """Reductions through the host's shared-memory ring (``shared.SharedRing``)."""

    memory = Memory.HOST
    collectives = _REDUCTIONS

    def __init__(self, shared):
        self._shared = shared

    def run(self, call: Reduce) -> Carried:
        """Carry ``call`` through the shared-memory file."""
        allgather = call.collective is Collective.ALLREDUCE
        return self._shared.run(
            call.src, call.dst, call.op, call.postscale, call.bounds, allgather,
            call.new, call.read_only,
        )  # fmt: skip


class AttachRoute:
    """Reductions that read peers' buffers in place (``attach.AttachRing``).

    Its calls are numbered with the shared-memory ring's, whose regions they share.
    """

    memory = Memory.HOST
    collectives = _REDUCTIONS

    def __init__(self, shared, attach):
        self._shared, self._attach = shared, attach

    def run(self, call: Reduce) -> Carried:
        """Carry ``call`` by reading each peer's part where it lies."""
        allgather = call.collective is Collective.ALLREDUCE
        number = self._shared.take_call()
        return self._attach.run(
            call.src, call.dst, call.op, call.postscale, call.bounds, allgather, number,
            call.new, call.read_only,
        )  # fmt: skip


class HierarchicalRoute:
    """Allreduce split by host (``hierarchical.HierarchicalAllreduce``)."""

    memory = Memory.HOST
    collectives = frozenset({Collective.ALLREDUCE})

    def __init__(self, hierarchical):
        self._hierarchical = hierarchical

    def run(self, call: Reduce) -> Carried:
        """Reduce within hosts, ring across them, share the result within them."""
        dst = _destination(call)
        reduced = self._hierarchical.allreduce(call.src, dst, call.op, call.postscale, call.codec)
        return dst, reduced


class StagedRoute:
    """Reductions of GPU arrays through the host: one copy over, the host's route, one back.

    The host copy lives in page-locked memory (``kernels`` ``pinned_empty``), kept and
    grown as calls need (``buffers.BufferPool``). ``carry_host`` carries the host copy's
    call, in place, by the route the rule picks for host memory.
    """

    memory = Memory.DEVICE
    collectives = _REDUCTIONS

    def __init__(self, carry_host):
        self._carry_host = carry_host
        self._pinned = None  # made by the first call, from its array's kernel backend

    def run(self, call: Reduce) -> Carried:
        """Copy ``call.src`` to the host, reduce it there, and copy the result back."""
        backend = kernels.backend_for(call.src)
        if self._pinned is None:
            self._pinned = BufferPool(backend.pinned_empty)
        host = self._pinned.get("staged", len(call.src), call.src.dtype)
        backend.to_host(call.src, host)
        on_host = Reduce(
            call.collective, host, host, call.op, call.postscale, call.bounds, call.codec
        )
        reduced = self._carry_host(on_host)[1]
        dst = _destination(call)
        backend.to_device(host, dst)
        return dst, reduced


class DeviceRoute:
    """Allreduces of GPU arrays by MPI's own ``MPI_Iallreduce`` on their device memory.

    Only where every rank's MPI is CUDA-aware (``device_mpi``): nothing is staged through
    the host, and MPI picks its own algorithm. The kernels queued on the GPU finish first,
    since MPI reads the memory off their stream; the wait goes through ``waiter``, as every
    wait on a peer does, and ``postscale`` is one kernel on the result.
    """

    memory = Memory.DEVICE
    collectives = frozenset({Collective.ALLREDUCE})

    def __init__(self, comm, waiter):
        # Here, not at the top: the rule's pure tests import this module without MPI.
        from mpi4py import MPI

        self._comm = comm
        self._waiter = waiter
        self._peers = range(comm.Get_size())
        self._in_place = MPI.IN_PLACE
        self._ops = {
            ReduceOp.Sum: MPI.SUM,
            ReduceOp.Min: MPI.MIN,
            ReduceOp.Max: MPI.MAX,
            ReduceOp.Product: MPI.PROD,
        }

    def run(self, call: Reduce) -> Carried:
        """Reduce ``call.src`` into its destination on the GPU, through MPI; scale it there."""
        op = as_reduce_op(call.op)
        mpi_op = self._ops.get(op)
        if mpi_op is None:
            raise ValueError(f"MPI reduces GPU arrays by Sum, Min, Max or Product, not {op.name}")
        backend = kernels.backend_for(call.src)
        dst = _destination(call)
        backend.finish_queued()
        send = self._in_place if call.src is dst else call.src
        request = self._comm.Iallreduce(send, dst, op=mpi_op)
        self._waiter.wait(request, self._peers, f"an allreduce of {call.nbytes} device bytes")
        reduced = time.perf_counter_ns()
        copy_scaled(dst, dst, call.postscale)
        return dst, reduced
