"""The steps within a host of the split hierarchical allreduce, run chunk by chunk.

Each rank of a host owns one segment of the buffer and carries it across hosts in its own
ring. The other ranks of the host send it their input for that segment in the ring's
chunks, in the order the ring first reads them (``schedule.input_reads``); the owner adds
each chunk in just before its ring reads it (``OwnerFeed.ready``) and sends each chunk of
the result back as soon as its ring has finished it (``OwnerFeed.done``, in
``schedule.output_order``). So the reduce and the share within the host run beside the
rings across hosts, where a reduce-scatter ring within the host ran before them and an
allgather ring after.
"""

from collections import deque

from ringtrain import kernels
from ringtrain.transport import schedule

_UP_TAG = 11  # a rank's input for a segment, to the segment's owner
_DOWN_TAG = 12  # a finished segment, from its owner
_AHEAD = 4  # chunks from each other rank of the host that the owner receives ahead


def segment_pieces(across_rank, hosts, lo, hi, chunk):
    """Return the reads and outputs of the ring across hosts over ``[lo, hi)``, in order.

    Each is a list of (lo, hi) in the whole buffer: the pieces that the ring over the
    segment, run by the rank ``across_rank`` of ``hosts``, first reads and finishes.
    """
    bounds = schedule.segment_bounds(hi - lo, hosts)
    reads = schedule.input_reads(across_rank, hosts, bounds, chunk)
    outputs = schedule.output_order(across_rank, hosts, bounds, chunk)
    return [(lo + a, lo + b) for a, b in reads], [(lo + a, lo + b) for a, b in outputs]


class OwnerFeed:
    """The owner's side: adds the host's other inputs into its ring's, and sends results out.

    ``local`` is the host's ``MessageTransport``; ``src`` and ``dst`` are this rank's
    segment of its input and of the buffer its ring runs on, in place; ``reads`` are the
    ring's reads, relative to the segment; ``meanwhile()`` is called before each read.
    """

    def __init__(self, local, src, dst, op, reads, pool, waiter, meanwhile):
        self._comm, self._waiter, self._meanwhile = local.comm, waiter, meanwhile
        self._src, self._dst, self._op = src, dst, op
        self._backend = kernels.backend_for(dst)
        self._mates, self._peers = _mates(local)
        self._reads = reads
        stride = max((hi - lo for lo, hi in reads), default=0)
        self._window = min(_AHEAD, len(reads))
        scratch = pool.get("owner-scratch", len(self._mates) * self._window * stride, dst.dtype)
        count = len(self._mates) * self._window
        self._slots = [scratch[i * stride : (i + 1) * stride] for i in range(count)]
        self._posted = deque()  # per read: the receives from every other rank, in order
        self._taken = 0  # reads added in so far
        self._sends = []
        self._what = f"a host's reduce of {dst.nbytes} bytes to the segment's owner"
        while len(self._posted) < self._window:
            self._post()

    def _post(self) -> None:
        number = self._taken + len(self._posted)
        lo, hi = self._reads[number]
        base = (number % self._window) * len(self._mates)
        self._posted.append(
            [
                (self._comm.Irecv(self._slots[base + m][: hi - lo], mate, _UP_TAG), base + m)
                for m, mate in enumerate(self._mates)
            ]
        )

    def ready(self, lo, hi, received) -> None:
        """Add every other rank's ``[lo, hi)`` into ``dst``, from this rank's ``src``.

        ``received(request)`` polls a request and moves the ring's sends on meanwhile; the
        owner's ``meanwhile()`` is called once per piece.
        """
        self._meanwhile()
        dst, first = self._dst[lo:hi], self._src[lo:hi]
        for peer, (request, slot) in zip(self._peers, self._posted.popleft(), strict=True):
            self._waiter.until(lambda request=request: received(request), [peer], self._what)
            self._backend.reduce(dst, first, self._slots[slot][: hi - lo], self._op, 1.0)
            first = dst
        self._taken += 1
        if self._taken + len(self._posted) < len(self._reads):
            self._post()

    def done(self, lo, hi) -> None:
        """Send the finished ``dst[lo:hi]`` to every other rank of the host."""
        piece = self._dst[lo:hi]
        self._sends += [self._comm.Isend(piece, mate, _DOWN_TAG) for mate in self._mates]

    def finish(self) -> None:
        """Wait until every result sent has gone."""
        what = f"a host's share of {self._dst.nbytes} bytes"
        self._waiter.wait_all(self._sends, self._peers, what)


class Exchange:
    """A rank's side of the segments it does not own: its inputs sent up, the results back.

    ``pieces[r]`` is local rank r's (reads, outputs) as ``segment_pieces`` gives them. Every
    input is sent at once. A finished piece's receive is posted, in its owner's order, once
    the input sent from the same place has gone, since ``dst`` may be ``src``
    (``advance``); the owner sends it only after that input reached it, so the wait is
    short.
    """

    def __init__(self, local, src, dst, pieces, waiter):
        self._comm, self._dst, self._waiter = local.comm, dst, waiter
        self._mates, self._peers = _mates(local)
        self._sends = {
            owner: {
                (lo, hi): self._comm.Isend(src[lo:hi], owner, _UP_TAG)
                for lo, hi in pieces[owner][0]
            }
            for owner in self._mates
        }
        self._waiting = {owner: deque(pieces[owner][1]) for owner in self._mates}
        self._receives = []
        self.advance()

    def advance(self) -> bool:
        """Post the receives whose place is free; return True once every one is posted."""
        for owner, waiting in self._waiting.items():
            sends = self._sends[owner]
            while waiting and sends[waiting[0]].Test():
                lo, hi = waiting.popleft()
                self._receives.append(self._comm.Irecv(self._dst[lo:hi], owner, _DOWN_TAG))
        return not any(self._waiting.values())

    def finish(self) -> None:
        """Wait until every input has gone and every finished segment has come."""
        what = f"a host's share of {self._dst.nbytes} bytes among its ranks"
        self._waiter.until(self.advance, self._peers, what)
        self._waiter.wait_all(self._receives, self._peers, what)


def _mates(local):
    """Return the other ranks of the host: in ``local``'s communicator, and the waiter's."""
    mates = [r for r in range(local.size) if r != local.rank]
    return mates, [local.peer(r) for r in mates]
