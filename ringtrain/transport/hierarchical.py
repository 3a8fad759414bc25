"""Hierarchical allreduce: reduce within each host, ring across hosts, share within hosts.

Across hosts the links carry ``2(h-1)/h`` of the data for ``h`` hosts, instead of the flat
ring's ``2(p-1)/p`` for ``p`` ranks split over every link of the ring.

Where every host runs the same number ``m`` of ranks, the work is split ``m`` ways: local
rank ``i`` owns segment ``i``, and the ranks with local rank ``i`` on every host run the
ring across hosts on it. The host's other ranks feed the owner their input for it, and
take the result back, chunk by chunk while its ring runs (``owners``). Each host's link
carries the same bytes as with one rank per host crossing, but ``m`` processes move and
add them, and the steps within a host move each byte once instead of twice. Large calls
(``choice.through_leaders``) give the whole buffer to each host's first rank instead, the
same way, so that one ring crosses the links. Hosts of different sizes fall back to one
rank per host: the host's ring gives each of its ranks the host's sum, the hosts' first
ranks run the ring across hosts, and each sends the result to the rest of its host.

Every step is point-to-point messages in chunks (``messages.MessageTransport``). Each wait
is for one chunk, so a rank that sleeps between polls (``progress``) slows a step by a
sleep per chunk at most. MPI's non-blocking reduce and broadcast, which this used before,
move only while every rank polls them: with sleeping polls, 2 hosts of 2 ranks took 5 times
as long for 16 MiB as with spinning ones.
"""

import time

from mpi4py import MPI

from ringtrain.ops import ReduceOp
from ringtrain.transport import owners
from ringtrain.transport.choice import through_leaders
from ringtrain.transport.messages import MessageTransport
from ringtrain.transport.schedule import segment_bounds


class HierarchicalAllreduce:
    """The allreduce of one rank split by host (module docstring); built collectively."""

    def __init__(self, comm: MPI.Comm, topology, chunk_bytes: int, window_bytes: int, pool, waiter):
        rank = comm.Get_rank()
        self._host_count = topology.host_count
        self._split = topology.homogeneous
        self._pool, self._waiter = pool, waiter
        local = comm.Split(color=topology.host, key=rank)
        mates = topology.local_ranks()
        self._local = MessageTransport(local, chunk_bytes, window_bytes, pool, waiter, mates)
        position = local.Get_rank()
        crosses = self._split or position == 0
        cross = comm.Split(position if crosses else MPI.UNDEFINED, key=rank)
        self.across = None  # this rank's ring across hosts, where it runs one
        if crosses:
            peers = [r for r in range(comm.Get_size()) if _position(topology.hosts, r) == position]
            self.across = MessageTransport(cross, chunk_bytes, window_bytes, pool, waiter, peers)

    def rings(self) -> list:
        """Return this rank's message rings: within its host, and across hosts where it runs one."""
        return [ring for ring in (self._local, self.across) if ring is not None]

    def allreduce(self, src, dst, op: ReduceOp, postscale: float, codec=None) -> int:
        """Reduce ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        ``codec`` (``codec.WireCodec``, or None) applies to the rings across hosts only:
        the steps within each host stay in ``src``'s dtype. Returns the ``perf_counter_ns`` time
        at which this rank's reduction across hosts ended.
        """
        if self._host_count == 1:  # one host (of several ranks): its ring is the allreduce
            local = self._local
            return local.ring(src, dst, op, postscale, _bounds(dst, local.size), True)
        if self._split:
            return self._split_by_rank(src, dst, op, postscale, codec)
        return self._through_leaders(src, dst, op, postscale, codec)

    def _split_by_rank(self, src, dst, op, postscale, codec) -> int:
        """Each rank reduces its segment from the host's, rings it across hosts, shares it.

        The steps within the host run chunk by chunk beside the ring (``owners``).
        """
        local, across = self._local, self.across
        hosts = self._host_count
        if local.size == 1:
            return across.ring(src, dst, op, postscale, _bounds(dst, hosts), True, codec)
        wire_bytes = dst.nbytes if codec is None else codec.wire_bytes(len(dst))
        bounds = _owned(len(dst), local.size, through_leaders(wire_bytes))
        chunk = across.chunk_elements(dst.dtype, codec)
        # The ring of each local rank's segment runs at this host's place in it: across.rank.
        pieces = [owners.segment_pieces(across.rank, hosts, lo, hi, chunk) for lo, hi in bounds]
        exchange = owners.Exchange(local, src, dst, pieces, self._waiter)
        lo, hi = bounds[local.rank]
        reduced = time.perf_counter_ns()
        feed = None
        if hi > lo:  # every rank of this ring has the same segment, empty or not
            segment = dst[lo:hi]
            reads = [(a - lo, b - lo) for a, b in pieces[local.rank][0]]
            feed = owners.OwnerFeed(
                local, src[lo:hi], segment, op, reads, self._pool, self._waiter, exchange.advance
            )
            reduced = across.ring(
                segment, segment, op, postscale, _bounds(segment, hosts), True, codec, feed
            )
        # The others' results first: a rank may post their receives only now, and each waits
        # for its own to be received (tests/mpi/check_late_results.py).
        exchange.finish()
        if feed is not None:
            feed.finish()
        return reduced

    def _through_leaders(self, src, dst, op, postscale, codec) -> int:
        """Allreduce within the host, ring across the hosts' first ranks, send out within."""
        local, across = self._local, self.across
        if local.size > 1:
            local.ring(src, dst, op, 1.0, _bounds(dst, local.size), True)
            src = dst
        reduced = time.perf_counter_ns()
        if across is not None:
            reduced = across.ring(src, dst, op, postscale, _bounds(dst, across.size), True, codec)
        if local.size > 1:
            local.broadcast_chunks(dst, 0)
        return reduced

    def free(self) -> None:
        """Free the per-host and across-host communicators."""
        if self.across is not None:
            self.across.comm.Free()
        self._local.comm.Free()


def _owned(length, parts, leaders):
    """Return each local rank's segment: even ones, or all of it for the first (``leaders``)."""
    if leaders:
        return [(0, length)] + [(length, length)] * (parts - 1)
    return segment_bounds(length, parts)


def _bounds(array, parts):
    return segment_bounds(len(array), parts)


def _position(hosts, rank) -> int:
    """Return ``rank``'s local rank: how many ranks before it share its host."""
    return sum(1 for r in range(rank) if hosts[r] == hosts[rank])
