"""The MPI-message transport: every collective as MPI messages over one communicator.

Only buffer (uppercase) calls are used: tensor data is never pickled. The ring allreduce
cuts each segment into chunks (a small segment into four, of 64 KiB at least); a chunk is
forwarded to the right neighbour as soon as it has been received and reduced, while the
next chunks are still in flight, so sending one piece overlaps reducing the previous one.
Receives are posted ahead into reused scratch slots, as many as cover ``window_bytes`` (at
least ``MIN_WINDOW``): MPI's TCP transport sends a large message only once its receive is
posted and that news has crossed back, so the receives posted ahead must cover what the
link holds in flight. Two ranks without a codec or a feed skip the ring: each sends the other
its whole buffer in pieces and reduces what comes (``_pair``), one dependent crossing where
the ring has two, with the same bytes on the wire. Allgather is MPI's own collective on
bytes, or the ring's allgather half (``allgatherv_ring``); broadcast and alltoall are MPI's
own collectives on bytes, and Adasum runs its exchange (``ringtrain.transport.adasum``)
over the same communicator.
"""

import functools
import itertools
import time
from collections import deque

import numpy as np
from mpi4py import MPI

from ringtrain import kernels
from ringtrain.buffers import BufferPool
from ringtrain.transport import schedule
from ringtrain.transport.adasum import adasum

_TAG = 7
_ADASUM_TAG = 8
_BROADCAST_TAG = 9
MIN_WINDOW = 4  # receives posted ahead of the one being reduced, at the least
# Sends of an uncompressed ring in flight to its peer at once (``_SendQueue``): one where
# the link is slow, so that a chunk to forward waits behind no other; two where it is fast,
# so that the link has the next one while a wait notices the last one's end. Measured with
# ``bench cluster``, 1 rank per host: at 1 Gbit/s one gave 0.96 of the link from 4 MiB
# where two gave 0.80-0.86; at 10 Gbit/s two gave 16 MiB in 16.7-17.5 ms where one took
# 26.5-28.6 (and every send at once, as before, 19.0-22.9).
SLOW_LINK_BYTES_PER_S = 250e6  # 2 Gbit/s: below it, a link is slow
# Sends of a two-rank exchange (``_pair``) in flight at once where the link is not slow:
# it forwards nothing, so no send waits behind another that it needs first. At 10 Gbit/s,
# 2 hosts x 1 rank, the exchange alone, timed in turns with two in flight in one launch,
# in 256 KiB pieces (before PAIR_PIECE_BYTES): 1 MiB in 0.92-0.94 ms against 1.00-1.06,
# 2 MiB in 1.79-1.83 against 1.95-2.01, 4 MiB in 3.62 against 3.95; three, eight or every
# send in flight measured alike within the noise, and four against eight alike in 32 KiB
# pieces.
PAIR_IN_FLIGHT = 4
# A two-rank exchange of at most PAIR_SMALL_BYTES cuts pieces of PAIR_PIECE_BYTES (or the
# ring chunk, if smaller), so that all but the last piece is reduced while the bytes still
# cross; larger ones keep ``piece_elements``, since a Python step per piece then costs more
# than it saves. At 10 Gbit/s, 2 hosts x 1 rank, whole calls alternating in one launch,
# against 256 KiB pieces: 320 KiB in 0.34-0.35 ms against 0.48-0.54, 1 MiB in 0.89-0.91
# against 1.14-1.18, 2 MiB in 1.74 against 2.04, where MPI_Allreduce took 0.26-0.27,
# 0.88-0.93 and 1.88. Of the exchange alone at 1 MiB, 32 KiB pieces were the fastest:
# 0.87 ms, against 1.11 with 16 KiB, 1.20 with 64, 1.02 with 128 and 0.99 with 256; at
# 8 MiB, 32 KiB pieces took 9.5 ms against 8.3.
PAIR_SMALL_BYTES = 2 << 20
PAIR_PIECE_BYTES = 32 << 10
# On a slow link, the bytes of an uncompressed ring's sends in flight: one 1 MiB chunk, or
# two of the 128 KiB chunks that ``link_chunk`` may choose there. At 1 Gbit/s, 2 hosts x
# 2 ranks, 16 MiB took 150-164 ms with two in flight and 179-183 with four (one run each).
SLOW_LINK_IN_FLIGHT_BYTES = 256 << 10
_TIMED_SEND_BYTES = 256 << 10  # smaller sends are not timed: their latency rules them
# A ring without a feed cuts each segment into MIN_PIECES chunks at least, none under
# MIN_PIECE_BYTES, so that a small call's allgather half forwards a segment's first piece
# before its last has come (``piece_elements``). At 10 Gbit/s, 2 hosts x 1 rank, two
# alternating pairs: 1 MiB took 0.83-1.01 ms against 1.06-1.37 with one piece a segment,
# 4 MiB 3.39-4.96 against 4.13-5.46; at 1 Gbit/s level. The owners' rings of a
# hierarchical allreduce keep whole chunks: smaller ones measured slower there
# (``link_chunk``, and docs/benchmarks.md, "Where the rest of 2 x 2's time goes").
MIN_PIECES = 4
MIN_PIECE_BYTES = 64 << 10


class MessageTransport:
    """The collectives of one rank over ``comm`` (a private communicator), as MPI messages.

    Every wait goes through ``waiter`` (``progress.Waiter``), which names the peers of a
    collective that stops making progress; ``ranks`` maps ``comm``'s ranks to the waiter's.
    """

    def __init__(
        self, comm: MPI.Comm, chunk_bytes: int, window_bytes: int, pool: BufferPool, waiter, ranks
    ):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.chunk_bytes = chunk_bytes
        self.link_chunk_bytes = chunk_bytes  # an uncompressed ring's chunk (see ``link_chunk``)
        self.window_bytes = window_bytes
        self._pool = pool
        self._waiter = waiter
        self._ranks = tuple(ranks)
        self._right = (self.rank + 1) % self.size
        self._left = (self.rank - 1) % self.size
        self._link_rate = None  # bytes/s of this rank's last timed ring sends (None: none yet)

    @property
    def link_rate(self) -> float | None:
        """Return the bytes per second of this rank's last timed ring sends (None: none yet)."""
        return self._link_rate

    def ring(self, src, dst, op, postscale, bounds, allgather, codec=None, feed=None) -> int:
        """Reduce 1-D ``src`` over all ranks into ``dst`` (may be ``src``), times ``postscale``.

        ``dst[bounds[rank]]`` gets this rank's reduced segment; with ``allgather``, every
        segment. With a ``codec`` (``codec.WireCodec``, for float32 data) the chunks cross
        in its wire type. A ``feed`` (``owners.OwnerFeed``) fills each
        piece of ``src`` just before the ring first reads it, and takes each piece of ``dst``
        as soon as it is final. Returns the ``perf_counter_ns`` time at which the
        reduce-scatter part ended. An allreduce of two ranks without a codec or a feed runs
        no ring: the ranks exchange their buffers (``_pair``).
        """
        if self.size == 2 and allgather and codec is None and feed is None:
            return self._pair(src, dst, op, postscale)
        steps = schedule.ring_steps(self.rank, self.size, allgather)
        return self._ring(src, dst, op, postscale, bounds, steps, codec, feed)

    def chunk_elements(self, dtype, codec=None) -> int:
        """Return the elements of one chunk of a ring on ``dtype`` data (see ``ring``).

        An uncompressed ring cuts ``link_chunk_bytes``; a compressed one ``chunk_bytes``,
        because smaller chunks made it slower (docs/benchmarks.md, 16-bit values). A ring
        without a feed cuts small segments finer (``piece_elements``).
        """
        if codec is None:
            return max(1, self.link_chunk_bytes // np.dtype(dtype).itemsize)
        return codec.chunk_elements(self.chunk_bytes)

    def allgather_ring(self, array, bounds) -> None:
        """Give every rank each rank r's ``array[bounds[r]]`` (1-D, in place): a ring's allgather.

        Each segment goes round the ring in chunks, forwarded as each chunk arrives.
        """
        if self.size > 1:
            steps = schedule.ring_steps(self.rank, self.size)[self.size - 1 :]
            self._ring(array, array, None, 1.0, bounds, steps)

    def _ring(self, src, dst, op, postscale, bounds, steps, codec=None, feed=None) -> int:
        """Run ``steps`` of the ring (``schedule.ring_steps``); see ``ring``."""
        backend = kernels.backend_for(dst)
        wire = None if codec is None else codec.open(self._pool, backend, src, dst)
        scratch_dtype = dst.dtype if wire is None else wire.bits.dtype
        chunk = self.chunk_elements(dst.dtype, codec)
        if feed is None:
            longest = max((hi - lo for lo, hi in bounds), default=0)
            chunk = piece_elements(chunk, longest, scratch_dtype.itemsize)
        last_reduce = sum(step.reduce for step in steps) - 1
        first, recvs = schedule.ring_pieces(steps, bounds, chunk)
        stride = min(chunk, len(src))
        window = self._window(chunk * scratch_dtype.itemsize, len(recvs))
        reduces = last_reduce >= 0
        scratch = None
        if reduces:
            scratch = self._pool.get("ring-scratch", window * stride, scratch_dtype)
        comm, right, left = self.comm, self._right, self._left
        # An uncompressed ring keeps ``SLOW_LINK_IN_FLIGHT_BYTES`` of sends in flight (one
        # send at least) where its last sends went slower than ``SLOW_LINK_BYTES_PER_S``,
        # and two sends elsewhere, in ring order. A compressed one rounds between its
        # sends, and one at a time measured slower there (16 MiB fp16 at 1 Gbit/s: 108-113
        # ms against 80-86 with every send in flight), so it keeps them all in flight.
        if wire is not None:
            depth = len(first) + len(recvs)  # its first sends and a forward per receive, at most
        else:
            depth = self._depth(chunk * scratch_dtype.itemsize)
        sends = _SendQueue(comm, right, _TAG, depth)
        # A send whose source region a later allgather receive overwrites must finish before
        # that receive is posted: ``hazard`` is the number of the last such send. Those are
        # the reduce-scatter's forwards, and the first sends when the data is reduced in
        # place (or goes through the wire buffer, which receives overwrite). They precede
        # every allgather forward in the queue, so waiting for them never waits on a
        # receive that this rank has yet to post. An allgather alone receives each segment
        # once, into a region nothing sends from.
        for lo, hi in first:
            if feed is not None:
                feed.ready(lo, hi, sends.received)
            sends.send(src[lo:hi] if wire is None else wire.narrow(lo, hi))
        in_place = reduces and (wire is not None or np.may_share_memory(src, dst))
        hazard = sends.queued if in_place else 0
        outgoing = dst if wire is None else wire.bits
        posted = deque()
        next_recv = 0
        until = self._waiter.until
        left_peer, right_peer = [self._ranks[left]], [self._ranks[right]]
        what = f"a ring of {src.nbytes} bytes"

        def post_ahead():
            nonlocal next_recv
            while next_recv < len(recvs) and len(posted) < window:
                t, lo, hi = recvs[next_recv]
                if steps[t].reduce:
                    slot = (next_recv % window) * stride
                    target = scratch[slot : slot + hi - lo]
                else:
                    sends.wait_for(hazard, self._waiter, right_peer, what)
                    target = outgoing[lo:hi]
                posted.append((comm.Irecv(target, left, _TAG), t, lo, hi, target))
                next_recv += 1

        post_ahead()
        reduce_scatter_end = time.perf_counter_ns()
        while posted:
            request, t, lo, hi, target = posted.popleft()
            if feed is not None and steps[t].reduce:
                feed.ready(lo, hi, sends.received)
            until(functools.partial(sends.received, request), left_peer, what, True)
            if steps[t].reduce:
                scale = postscale if t == last_reduce else 1.0
                if wire is None:
                    backend.reduce(dst[lo:hi], src[lo:hi], target, op, scale)
                else:
                    wire.reduce(lo, hi, target, op, scale, finished=t == last_reduce)
                reduce_scatter_end = time.perf_counter_ns()
            elif wire is not None:
                wire.widen(lo, hi)
            if feed is not None and t >= last_reduce:
                feed.done(lo, hi)
            if t + 1 < len(steps):
                number = sends.send(outgoing[lo:hi])
                if t < last_reduce:
                    hazard = number
            post_ahead()
        sends.wait_for(sends.queued, self._waiter, right_peer, what)
        if wire is None:  # every send in flight at once would time each behind the others
            self._link_rate = sends.rate() or self._link_rate
        return reduce_scatter_end

    def _window(self, piece_bytes: int, receives: int) -> int:
        """Return how many of ``receives`` pieces of ``piece_bytes`` to post ahead at once."""
        return min(max(MIN_WINDOW, -(-self.window_bytes // piece_bytes)), receives)

    def _depth(self, piece_bytes: int, fast: int = 2) -> int:
        """Return how many uncompressed sends of ``piece_bytes`` to keep in flight to a peer.

        ``fast`` of them where the link is not known to be slow.
        """
        if self._link_rate is not None and self._link_rate < SLOW_LINK_BYTES_PER_S:
            return max(1, SLOW_LINK_IN_FLIGHT_BYTES // piece_bytes)
        return fast

    def _pair(self, src, dst, op, postscale) -> int:
        """Allreduce 1-D ``src`` with the one other rank into ``dst``, times ``postscale``.

        Each rank sends its whole ``src`` in pieces (``pair_piece_elements``),
        ``PAIR_IN_FLIGHT`` of them in flight at once, or as many as a ring's sends where the
        link is slow (``_depth``), and reduces each piece it receives as it comes. Both
        ranks put rank 0's values first, so that they end with the same bits where the
        order matters (the sign of a zero in Min and Max, a NaN's payload). A piece reduced
        in place waits for its own send first. The link's rate is timed on the arrivals
        (``_arrival_rate``). Returns the ``perf_counter_ns`` time of the last reduce.
        """
        backend = kernels.backend_for(dst)
        chunk = self.chunk_elements(dst.dtype)
        pieces = schedule.chunks(0, len(src), pair_piece_elements(chunk, len(src), dst.itemsize))
        if not pieces:
            return time.perf_counter_ns()
        stride = pieces[0][1]
        window = self._window(stride * dst.itemsize, len(pieces))
        scratch = self._pool.get("ring-scratch", window * stride, dst.dtype)
        comm, peer = self.comm, self._right
        peers, what = [self._ranks[peer]], f"an exchange of {src.nbytes} bytes with one rank"

        def receive(number):
            lo, hi = pieces[number]
            slot = (number % window) * stride
            target = scratch[slot : slot + hi - lo]
            return comm.Irecv(target, peer, _TAG), target

        posted = deque(receive(number) for number in range(window))
        sends = _SendQueue(comm, peer, _TAG, self._depth(stride * dst.itemsize, PAIR_IN_FLIGHT))
        for lo, hi in pieces:
            sends.send(src[lo:hi])
        in_place = np.may_share_memory(src, dst)
        first_arrival = arrival = 0
        for number, (lo, hi) in enumerate(pieces):
            request, target = posted.popleft()
            self._waiter.until(functools.partial(sends.received, request), peers, what, True)
            arrival = time.perf_counter_ns()
            if not number:
                first_arrival = arrival
            if in_place:
                sends.wait_for(number + 1, self._waiter, peers, what)
            first, second = (src[lo:hi], target) if self.rank == 0 else (target, src[lo:hi])
            backend.reduce(dst[lo:hi], first, second, op, postscale)
            if number + window < len(pieces):
                posted.append(receive(number + window))
        reduced = time.perf_counter_ns()
        sends.wait_for(sends.queued, self._waiter, peers, what)
        after_first = src.nbytes - pieces[0][1] * src.itemsize
        self._link_rate = _arrival_rate(after_first, arrival - first_arrival) or self._link_rate
        return reduced

    def broadcast_chunks(self, array, root: int) -> None:
        """Overwrite 1-D ``array`` on every rank with ``root``'s, in chunks of ``chunk_bytes``.

        Point-to-point messages, every receive posted at once: each wait is for one chunk,
        where MPI's own broadcast moves only while every rank polls it.
        """
        chunk = max(1, self.chunk_bytes // array.itemsize)
        pieces = schedule.chunks(0, len(array), chunk)
        what = f"a broadcast of {array.nbytes} bytes in chunks"
        if self.rank == root:
            others = [r for r in range(self.size) if r != root]
            sends = [
                self.comm.Isend(array[lo:hi], r, _BROADCAST_TAG)
                for lo, hi in pieces
                for r in others
            ]
            self._waiter.wait_all(sends, self._others(), what)
        else:
            receives = [self.comm.Irecv(array[lo:hi], root, _BROADCAST_TAG) for lo, hi in pieces]
            self._waiter.wait_all(receives, [self._ranks[root]], what)

    def allgatherv(self, send, recv, counts, displacements) -> None:
        """Gather every rank's bytes ``send`` into ``recv``: rank r's at ``displacements[r]``."""
        request = self.comm.Iallgatherv([send, MPI.BYTE], [recv, (counts, displacements), MPI.BYTE])
        self._waiter.wait(request, self._others(), f"an allgather of {recv.nbytes} bytes")

    def allgatherv_ring(self, send, recv, counts, displacements) -> None:
        """Do what ``allgatherv`` does, through this transport's ring (``allgather_ring``)."""
        bounds = [(start, start + n) for start, n in zip(displacements, counts, strict=True)]
        lo, hi = bounds[self.rank]
        recv[lo:hi] = send
        self.allgather_ring(recv, bounds)

    def broadcast(self, buffer, root: int) -> None:
        """Overwrite the bytes ``buffer`` on every rank with ``root``'s."""
        request = self.comm.Ibcast([buffer, MPI.BYTE], root=root)
        self._waiter.wait(request, self._others(), f"a broadcast of {buffer.nbytes} bytes")

    def alltoallv(self, send, sent, recv, got) -> None:
        """Send ``sent[r]`` bytes of ``send`` to rank r, and take ``got[r]`` bytes from it.

        Each side's pieces lie end to end, in rank order.
        """
        request = self.comm.Ialltoallv(
            [send, (sent, displacements(sent)), MPI.BYTE],
            [recv, (got, displacements(got)), MPI.BYTE],
        )
        self._waiter.wait(request, self._others(), f"an alltoall of {recv.nbytes} bytes in")

    def peer(self, rank: int) -> int:
        """Return the waiter's rank of this communicator's rank ``rank``."""
        return self._ranks[rank]

    def _others(self) -> list[int]:
        """Return the waiter's ranks of every other rank: whom a collective may wait for."""
        return [r for i, r in enumerate(self._ranks) if i != self.rank]

    def adasum(self, vector, scratch) -> None:
        """Combine every rank's ``vector`` by Adasum, in place; ``scratch`` is as large."""
        adasum(self.rank, self.size, vector, scratch, self._exchange)

    def _exchange(self, send, recv, partner) -> None:
        """Send ``send`` to rank ``partner`` and receive ``recv`` from it, through the waiter."""
        requests = [
            self.comm.Irecv(recv, partner, _ADASUM_TAG),
            self.comm.Isend(send, partner, _ADASUM_TAG),
        ]
        what = f"an Adasum exchange of {recv.nbytes} bytes"
        self._waiter.wait_all(requests, [self._ranks[partner]], what)


class _SendQueue:
    """A ring's sends to one peer, at most ``depth`` in flight at a time, in the order given.

    Open MPI's TCP transport interleaves the messages queued to one peer, so a chunk that
    could be forwarded at once waited behind those queued with it: a 4 MiB allreduce across
    two hosts at 1 Gbit/s took 40.5 ms with every send in flight, and 35.2 with one at a
    time, where the link allows 33.6 (docs/benchmarks.md, across hosts). The queue moves
    only while its owner calls ``progress``, which every wait of the ring does; it times
    its larger sends (``rate``) while any of them is in flight.
    """

    def __init__(
        self, comm: MPI.Comm, dest: int, tag: int, depth: int = 1, clock=time.perf_counter
    ):
        self._comm, self._dest, self._tag = comm, dest, tag
        self._depth = depth
        self._clock = clock
        self._waiting = deque()
        self._in_flight = deque()  # (request, bytes)
        self.queued = 0  # sends given so far
        self.completed = 0  # sends that have completed, the first ones given
        self._timed_in_flight = 0  # timed sends in flight, since ``_timed_since``
        self._timed_since = 0.0
        self._timed_bytes = 0
        self._timed_seconds = 0.0

    def send(self, buffer) -> int:
        """Send ``buffer`` now if there is room in flight, else queue it; return its number.

        Numbers count from 1, in the order given (see ``wait_for``).
        """
        self.queued += 1
        if len(self._in_flight) < self._depth and not self._waiting:
            self._start(buffer)
        else:
            self._waiting.append(buffer)
            self.progress()
        return self.queued

    def _start(self, buffer) -> None:
        request = self._comm.Isend(buffer, self._dest, self._tag)
        self._in_flight.append((request, buffer.nbytes))
        if buffer.nbytes >= _TIMED_SEND_BYTES:
            if not self._timed_in_flight:
                self._timed_since = self._clock()
            self._timed_in_flight += 1

    def progress(self) -> bool:
        """Start the next send once the one in flight is done; return True once all are."""
        in_flight = self._in_flight
        while in_flight and in_flight[0][0].Test():
            _, nbytes = in_flight.popleft()
            self.completed += 1
            if nbytes >= _TIMED_SEND_BYTES:
                self._timed_bytes += nbytes
                self._timed_in_flight -= 1
                if not self._timed_in_flight:
                    self._timed_seconds += self._clock() - self._timed_since
        while self._waiting and len(in_flight) < self._depth:
            self._start(self._waiting.popleft())
        return not in_flight and not self._waiting

    def rate(self) -> float | None:
        """Return the bytes per second of the timed sends so far, or None if none was timed.

        The time is that during which any timed send was in flight, from its start to when
        a wait notices its end: sends in flight together share the link, and each timed
        alone would count slower than it, by as many as were in flight.
        """
        return self._timed_bytes / self._timed_seconds if self._timed_seconds > 0 else None

    def wait_for(self, number: int, waiter, peers, what: str) -> None:
        """Return once send ``number`` and those before it are done, waiting through ``waiter``.

        The sends in flight are waited for one by one, and the queue moves on after each.
        """
        while self.completed < number:  # so a send is in flight: progress keeps one there
            waiter.wait(self._in_flight[0][0], peers, what)
            self.progress()

    def received(self, request) -> bool:
        """Move the queue on; return True once MPI ``request`` (a receive) has completed."""
        self.progress()
        return request.Test()


def piece_elements(chunk: int, longest: int, itemsize: int) -> int:
    """Return the chunk, in elements, of a ring whose longest segment has ``longest`` of them.

    ``chunk`` elements at most, and else a ``MIN_PIECES``-th of the segment, but not under
    ``MIN_PIECE_BYTES`` of ``itemsize``-byte values on the wire.
    """
    return min(chunk, max(MIN_PIECE_BYTES // itemsize, -(-longest // MIN_PIECES)))


def pair_piece_elements(chunk: int, length: int, itemsize: int) -> int:
    """Return the piece, in elements, of a two-rank exchange of ``length`` elements.

    A buffer of at most ``PAIR_SMALL_BYTES`` goes in pieces of ``PAIR_PIECE_BYTES`` (or
    ``chunk`` elements, if fewer); a larger one as a ring's segment (``piece_elements``).
    """
    if length * itemsize <= PAIR_SMALL_BYTES:
        return min(chunk, max(1, PAIR_PIECE_BYTES // itemsize))
    return piece_elements(chunk, length, itemsize)


def _arrival_rate(nbytes: int, nanoseconds: int) -> float | None:
    """Return the bytes per second of ``nbytes`` that arrived after a first piece, or None.

    None where they are too few to time (under ``_TIMED_SEND_BYTES``) or took no time. A
    send completes once MPI has handed its bytes on, which may be long before they arrive
    (an eager piece, into the socket's buffer), so an exchange times what it receives:
    from its first piece's arrival (so that a late peer's delay is not counted) to its
    last.
    """
    if nbytes < _TIMED_SEND_BYTES or nanoseconds <= 0:
        return None
    return nbytes / (nanoseconds * 1e-9)


def displacements(counts) -> list[int]:
    """Return the start offset of each count when the counts are laid end to end."""
    return list(itertools.accumulate(map(int, counts[:-1]), initial=0))
