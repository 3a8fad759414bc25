"""The ring's reduce-scatter and an allgather through shared memory, for ranks on one host.

Each rank owns a region of one shared-memory file that every rank of the host maps. Where the
message ring sends a partial sum to its right neighbour, here a rank leaves it in its own
region and the neighbour reads it from there straight into its reduction: no message
protocol, no copy into a receive buffer. The reduce-scatter follows the ring's schedule; in the
allgather every rank then copies each finished segment from the region of the rank that
finished it.

No barrier orders the ranks. Each rank works in chunks of ``CHUNK_BYTES`` and publishes,
after each, how much of the call it has written (``ringtrain.transport.flags``); a rank that
needs a chunk of another's waits until that rank's count covers it. So a neighbour reduces a
chunk while it is still in a cache, and the ranks' steps overlap.

Every region is double: consecutive calls alternate halves. A rank starts a call only once
every rank has finished the call before the last, so it cannot overwrite data that a slower
rank still reads in the half it reuses. (The calls alone do not hold it back: a rank whose
share of a reduce-scatter is empty waits for no one.)

An allreduce may also leave its result in the file's result area (``ringtrain.transport.results``),
where every rank writes its finished segment and then reads the whole result in place: no
allgather copies. It does so when every rank asked for a new, read-only result and holds
nothing at the call's place; each rank writes its vote beside the regions before it
publishes that it has begun the call, and every rank reads the votes once all have begun.

The loops over the chunks are compiled (numba, without the GIL); they return to Python to
wait for a flag (``flags.follow``).
"""

import functools
import mmap
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from ringtrain import kernels
from ringtrain.buffers import aligned_size
from ringtrain.kernels.cpu import copy_elements, njit, reduce_elements
from ringtrain.transport import schedule
from ringtrain.transport.flags import (
    flag_words,
    follow,
    publish,
    reached,
    store,
    through,
    wait_until,
    waiting,
)
from ringtrain.transport.results import SharedResults

_DIRECTORY = "/dev/shm"
# A rank publishes its part of a call in chunks of this many bytes, so its neighbour reads
# each chunk while it is still in a cache, and the two overlap.
CHUNK_BYTES = 256 << 10


class SharedRegions:
    """One shared-memory file: two ``capacity``-byte regions per rank, votes, flags, results.

    The result area has ``result_bytes``. Collective over ``comm``, whose ranks must share a
    host. ``available`` is False on every rank when some rank could not create or map the
    file; the reason is printed once.
    """

    def __init__(self, comm: MPI.Comm, capacity: int, result_bytes: int = 0):
        self.capacity = capacity
        self._stride = aligned_size(capacity)  # each region starts aligned
        size = comm.Get_size()
        self._rows = 2 * size  # regions
        votes_at = self._rows * self._stride
        flags_at = votes_at + aligned_size(2 * size)
        addresses_at = flags_at + aligned_size(8 * flag_words(3 * size))
        results_at = addresses_at + aligned_size(16 * size)
        total = results_at + result_bytes
        path, error = None, None
        if comm.Get_rank() == 0:
            try:
                fd, path = tempfile.mkstemp(prefix="ringtrain-", dir=_DIRECTORY)
                try:
                    # Reserve the pages now: on a full tmpfs a sparse file fails later, in a
                    # write, with SIGBUS.
                    os.posix_fallocate(fd, 0, total)
                finally:
                    os.close(fd)
            except OSError as err:
                error = f"cannot create a {total}-byte file in {_DIRECTORY}: {err}"
        path, error = comm.bcast((path, error), root=0)
        self._map = None
        if error is None:
            try:
                with open(path, "r+b") as f:
                    self._map = mmap.mmap(f.fileno(), total)
            except OSError as err:
                error = f"rank {comm.Get_rank()} cannot map {path}: {err}"
        errors = [e for e in comm.allgather(error) if e is not None]
        if comm.Get_rank() == 0 and path is not None:
            os.unlink(path)  # every rank has it mapped or gave up: nothing is left behind
        self.available = not errors
        if errors:
            self._map = None
            if comm.Get_rank() == 0:
                sys.stderr.write(
                    f"ringtrain: warning: {errors[0]}; the ring on this host sends every "
                    "segment as an MPI message instead\n"
                )
        self._bytes = np.frombuffer(self._map, np.uint8) if self._map is not None else None
        self._tables = {}  # dtype -> every region as one row of that dtype
        self.votes = None  # [half, rank]: 1 where that rank may take the call's result place
        # Each rank's progress (flag rank), finished calls (size + rank), and how far it has
        # read its left neighbour's buffers (2 size + rank; ``ringtrain.transport.attach``).
        self.flags = None
        self.addresses = None  # [rank]: its input's and its result's address in its process
        self.results = None
        if self._map is not None:
            self.votes = self._bytes[votes_at : votes_at + 2 * size].reshape(2, size)
            self.flags = self._bytes[flags_at:addresses_at].view(np.uint64)
            self.addresses = self._bytes[addresses_at : addresses_at + 16 * size].view(np.uint64)
            self.addresses = self.addresses.reshape(size, 2)
            if result_bytes > 0:
                self.results = SharedResults(memoryview(self._map)[results_at:total])

    def vote(self, call: int, rank: int, src, wants: bool):
        """Cast ``rank``'s vote on whether ``call``'s result goes in the result area.

        Every rank calls this for every allreduce that either ring runs, in call order,
        before it publishes that it has begun the call: each call has its place in the area
        whether it takes it or not. The vote is yes where this rank ``wants`` a shared
        result, the call's ``src`` fits the area, and this rank holds nothing at its place.
        Returns the place if the vote is yes, else None.
        """
        if self.results is None:
            return None
        place = self.results.place(src.nbytes)
        vote = wants and place is not None and self.results.free_here(place, src.nbytes)
        self.votes[call % 2, rank] = vote
        return place if vote else None

    def carried(self, call: int, begun: int, waiter) -> bool:
        """Return True if every rank voted yes on ``call``: for a rank that voted yes.

        Waits until every rank's progress flag is at least ``begun``, the value it publishes
        once its vote is in.
        """
        for q in range(self.votes.shape[1]):
            wait_until(self.flags, q, begun, waiter)
        return bool(self.votes[call % 2].all())

    def destination(self, place, shared: bool, src, dst, new):
        """Return the array that ``src``'s call writes its result into.

        The call's ``place`` in the result area where ``shared`` (every rank voted yes),
        else ``dst``, or ``new(len(src))`` where ``dst`` is None.
        """
        if shared:
            return self.results.take(place, len(src), src.dtype)
        return new(len(src)) if dst is None else dst

    def table(self, dtype) -> np.ndarray:
        """Return every region as a row of ``dtype`` elements: rank q's half h is row 2 q + h.

        A row may run past its region's capacity into alignment padding; use no more.
        """
        table = self._tables.get(dtype)
        if table is None:
            whole = self._bytes[: self._rows * self._stride]
            table = whole.view(dtype).reshape(self._rows, -1)
            self._tables[dtype] = table
        return table


class SharedRing:
    """Ring collectives of one rank through ``regions`` (see the module docstring)."""

    def __init__(self, comm: MPI.Comm, regions: SharedRegions, waiter):
        self._waiter = waiter  # every wait for a peer's flag goes through it
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._regions = regions
        self._flags = regions.flags
        self._calls = 0
        # A rank's progress flag holds ((call + 1) << _shift) + the elements it has published
        # in that call (calls count from 0): it only grows, no count passes for a later call's,
        # and it overflows only after 2**63 / capacity calls.
        self._shift = regions.capacity.bit_length()
        # Per rank, the segments it outputs in order (the first one is copied in).
        self._orders = np.array(schedule.outputs(self.size), np.int64)
        # A few microseconds of checks a call, done once per kind of call instead.
        self._operands = functools.lru_cache(maxsize=64)(self._checked_operands)

    def take_call(self) -> int:
        """Return the number of the call about to start (the attach ring numbers them too)."""
        call, self._calls = self._calls, self._calls + 1
        return call

    def run(self, src, dst, op, postscale, bounds, allgather, new=None, read_only=False):
        """Reduce ``src`` into ``dst`` as ``Transport.allreduce`` does; return it and the time.

        The time is when the reduce-scatter ended. ``dst[bounds[rank]]`` gets this rank's
        reduced segment; with ``allgather``, every segment. ``src`` may be ``dst``. With
        ``dst`` None (an allgather only), the result is a new array: read-only in the result
        area if every rank passed ``read_only`` and can take it there (see the module
        docstring), else ``new(len(src))``.
        """
        call = self.take_call()
        half = call % 2
        n, rank, flags = self.size, self.rank, self._flags
        if call >= 2:  # nobody may still read this half of the regions from two calls ago
            for q in range(n):
                wait_until(flags, n + q, call - 1, self._waiter)
        base = (call + 1) << self._shift  # above anything an earlier call published, and 0
        regions = self._regions
        place = regions.vote(call, rank, src, dst is None and read_only) if allgather else None
        publish(flags, rank, base)  # this call has begun, and the vote is in
        # One that voted no knows the outcome already.
        shared = place is not None and regions.carried(call, base, self._waiter)
        dst = regions.destination(place, shared, src, dst, new)
        op, scale, table, chunk = self._operands(
            src.dtype, src.ndim, dst.dtype, dst.ndim, op, postscale
        )
        limits = limits_of(tuple(bounds))
        follow(
            _reduce_scatter, flags, self._waiter, rank, n, base, limits, self._orders, chunk,
            src, dst, table, half, op, scale, not allgather or shared,
        )  # fmt: skip
        reduced = time.perf_counter_ns()
        if allgather and shared:  # every rank reads the result in place: wait for all of it
            for q in range(n):
                wait_until(flags, q, base + len(src), self._waiter)
            dst.flags.writeable = False
        elif allgather:
            follow(_allgather, flags, self._waiter, rank, n, base, limits, chunk, dst, table, half)
        publish(flags, n + rank, call + 1)
        return dst, reduced

    def _checked_operands(self, src_dtype, src_ndim, dst_dtype, dst_ndim, op, postscale):
        """Return (op, scale, table, chunk) for ``run`` on arrays of these dtypes and ranks.

        ``kernels.reduction_args`` checks them, on empty arrays of the same dtypes and ranks.
        """
        src, dst = np.empty((0,) * src_ndim, src_dtype), np.empty((0,) * dst_ndim, dst_dtype)
        op, scale = kernels.reduction_args(dst, src, src, op, postscale)
        chunk = max(1, CHUNK_BYTES // src.itemsize)
        return op, scale, self._regions.table(src.dtype), chunk


@functools.lru_cache(maxsize=256)
def limits_of(bounds):
    """Return ``bounds`` as an array of (start, stop) rows, kept for the layouts seen lately."""
    return np.array(bounds, np.int64).reshape(len(bounds), 2)


@njit
def _reduce_scatter(
    flags, rank, n, base, limits, orders, chunk, src, dst, table, half, op, scale, into_dst,
    start,
):  # fmt: skip
    """Run the copy-in and the reduce-scatter from chunk ``start`` on (see ``flags.follow``).

    This rank copies its input's share of its output 0 into its region, then reduces each
    output of its left neighbour with its own input into its next one. The last, its own
    segment, goes times ``scale`` into ``dst`` when ``into_dst``, else into its region and
    from there into ``dst``. Progress counts elements, published after each chunk.
    """
    left = (rank - 1) % n
    mine, theirs = table[2 * rank + half], table[2 * left + half]
    step, published = 0, 0
    lo, hi = limits[orders[rank, 0], 0], limits[orders[rank, 0], 1]
    for c_lo in range(lo, hi, chunk):
        c_hi = min(c_lo + chunk, hi)
        if step >= start:
            copy_elements(mine[c_lo:c_hi], src[c_lo:c_hi])
            store(flags, rank, base + published + c_hi - c_lo)
        published += c_hi - c_lo
        step += 1
    # What the left neighbour published as its output t is this rank's output t + 1, once
    # this rank's own contribution is added.
    left_published = 0
    for t in range(n - 1):
        lo, hi = limits[orders[left, t], 0], limits[orders[left, t], 1]
        for c_lo in range(lo, hi, chunk):
            c_hi = min(c_lo + chunk, hi)
            if step >= start:
                needed = base + left_published + c_hi - lo
                if not reached(flags, left, needed):
                    return waiting(step, left, needed)
                a, b = src[c_lo:c_hi], theirs[c_lo:c_hi]
                if t < n - 2:
                    reduce_elements(mine[c_lo:c_hi], a, b, op, None)
                elif into_dst:
                    reduce_elements(dst[c_lo:c_hi], a, b, op, scale)
                else:
                    reduce_elements(mine[c_lo:c_hi], a, b, op, scale)
                    copy_elements(dst[c_lo:c_hi], mine[c_lo:c_hi])  # its own, while in cache
                store(flags, rank, base + published + c_hi - c_lo)
            published += c_hi - c_lo
            step += 1
        left_published += hi - lo
    return through(step)


@njit
def _allgather(flags, rank, n, base, limits, chunk, dst, table, half, start):
    """Copy every other rank's finished segment from its region into ``dst``, chunk by chunk.

    From chunk ``start`` on, as ``flags.follow`` calls it. A rank's finished segment is its
    last output: it is read once published.
    """
    total = len(dst)
    step = 0
    for k in range(1, n):
        owner = (rank + k) % n
        lo, hi = limits[owner, 0], limits[owner, 1]
        before = total - (hi - lo)
        region = table[2 * owner + half]
        for c_lo in range(lo, hi, chunk):
            c_hi = min(c_lo + chunk, hi)
            if step >= start:
                needed = base + before + c_hi - lo
                if not reached(flags, owner, needed):
                    return waiting(step, owner, needed)
                copy_elements(dst[c_lo:c_hi], region[c_lo:c_hi])
            step += 1
    return through(step)
