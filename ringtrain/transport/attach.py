"""The ring for large calls on one host: each rank reads its neighbours' buffers in place.

Linux lets a process copy straight out of another's memory (``process_vm_readv``, cross-memory
attach), as MPI itself does for large messages between ranks of a host. Here a rank needs no
send at all: where the message ring would receive its left neighbour's partial sum, it copies
that piece out of the neighbour's own buffer into a small scratch buffer, which stays in its
cache, and reduces it from there. In the allgather it copies each finished segment out of the
buffer of the rank that finished it, straight into its result. That is one copy per piece,
with no message protocol and no copy through shared memory.

The ranks order themselves with the progress flags of the shared-memory ring
(``ringtrain.transport.flags``), in the same file. At the start of a call each rank writes the
addresses of its input and result beside the flags, then publishes that it has begun; after
each piece it publishes how far it has got, and how far it has read its left neighbour:

- A rank reads a piece only once its owner's count covers it.
- A rank overwrites a piece of its result that its right neighbour reads (its own input,
  when the call is in place, or a partial sum) only once that neighbour's count of what it
  has read covers it.
- A rank returns only when every rank has finished the call, since until then another rank
  may still read its buffers.

A call may also leave its result in the file's result area, decided by the same votes as in
the shared-memory ring (``SharedRegions.vote``): then each rank reduces its last segment
straight into that one result, which every rank reads in place, and there is no allgather.
A rank publishes its vote before its addresses, so its progress counts start one above the
call's base.

The loops over the pieces are compiled (numba, without the GIL), and call the C library's
``process_vm_readv`` from there: in Python, each piece's calls and the GIL's hand-overs to
the engine's other thread cost 10-15% at 16 MiB (docs/benchmarks.md). A loop that finds a
flag it needs not yet there returns, and Python waits for it, where Ctrl-C still works.
"""

import functools
import os
import sys
import time

import numpy as np
from numba.core import types

from ringtrain import kernels
from ringtrain.kernels.cpu import njit, reduce_elements
from ringtrain.transport import schedule
from ringtrain.transport.flags import (
    DONE,
    follow,
    publish,
    reached,
    store,
    through,
    wait_until,
    waiting,
)
from ringtrain.transport.shared import SharedRegions, limits_of

_PROBE = 0x5249_4E47_0000_0000  # "RING": a rank's probe word holds this plus its rank
# A rank reads and reduces pieces of this many bytes: small enough that a piece and its
# scratch copy stay in the cache, large enough that the calls per piece cost little
# (measured: 512 KiB beat 256 KiB and 1 MiB at 16 MiB, docs/benchmarks.md).
PIECE_BYTES = 512 << 10

# The C library's functions, called from compiled code by name (pointers as integers).
_process_vm_readv = types.ExternalFunction(
    "process_vm_readv",
    types.intp(types.int32, types.uintp, types.uintp, types.uintp, types.uintp, types.uintp),
)
_errno_location = types.ExternalFunction("__errno_location", types.CPointer(types.int32)())

_FAILED = 2  # what a compiled loop returns when a read fails (see ``flags.follow``)


@njit
def _copy_from(pid, iov, local, remote, nbytes):
    """Copy ``nbytes`` at address ``remote`` of process ``pid`` to address ``local``.

    ``iov``: four uint64 words of scratch. Returns 0, the errno of a failed call, or -1 when
    the kernel read nothing.
    """
    local, remote, nbytes = np.int64(local), np.int64(remote), np.int64(nbytes)
    done = np.int64(0)
    while done < nbytes:
        iov[0] = local + done
        iov[1] = nbytes - done
        iov[2] = remote + done
        iov[3] = nbytes - done
        vectors = iov.ctypes.data
        got = _process_vm_readv(pid, vectors, 1, vectors + np.uint64(16), 1, 0)
        if got < 0:
            return np.int64(_errno_location()[0])
        if got == 0:
            return np.int64(-1)
        done += got
    return np.int64(0)


def _read_error(err, pid, address):
    """Return the OSError for ``_copy_from``'s result ``err`` at ``address`` of ``pid``."""
    reason = os.strerror(err) if err > 0 else "read nothing"
    return OSError(
        max(err, 0), f"cannot read at {address:#x} of process {pid} (process_vm_readv: {reason})"
    )


def read(pid: int, address: int, out: np.ndarray) -> None:
    """Fill ``out`` (contiguous) with the bytes at ``address`` in process ``pid``.

    Raises OSError naming the process and the errno when the kernel refuses or falls short.
    """
    iov = np.empty(4, np.uint64)
    err = _copy_from(pid, iov, out.ctypes.data, address, out.nbytes)
    if err != 0:
        raise _read_error(err, pid, address)


class AttachRing:
    """Ring collectives of one rank that read peers' buffers in place (module docstring).

    Build it with ``create``, which checks that every rank may read every other. Progress
    is counted in pieces (of ``PIECE_BYTES``), below the call number in a flag (see
    ``SharedRing``); ``limit_bytes`` says which calls have few enough pieces for that.
    """

    def __init__(self, comm, regions: SharedRegions, pids, pool, waiter):
        self._waiter = waiter  # every wait for a peer's flag goes through it
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._regions = regions
        self._flags = regions.flags
        self._addresses = regions.addresses
        self._pids = pids
        self._pool = pool
        self._shift = regions.capacity.bit_length()
        self._pid_array = np.array(pids, np.int32)
        self._iov = np.empty(4, np.uint64)  # scratch for the compiled reads

    @classmethod
    def create(cls, comm, regions: SharedRegions, pool, waiter):
        """Return an ``AttachRing`` on every rank, or None on all: collective.

        None when some rank cannot read another's memory (no ``process_vm_readv``, or the
        kernel forbids it).
        """
        rank = comm.Get_rank()
        probe = np.array([_PROBE + rank], np.uint64)
        pids = comm.allgather((os.getpid(), probe.ctypes.data))
        works = sys.platform.startswith("linux")
        seen = np.zeros(1, np.uint64)
        for q, (pid, address) in enumerate(pids):
            if not works:
                break
            try:
                read(pid, address, seen)
            except OSError:
                works = False
            works = works and int(seen[0]) == _PROBE + q
        every = all(comm.allgather(works))  # the probe words stay alive until all have read
        if not every:
            return None
        return cls(comm, regions, [pid for pid, _ in pids], pool, waiter)

    @property
    def limit_bytes(self) -> int:
        """Return the bytes below which a call makes few enough pieces for the flags.

        A call's pieces, one per rank more, and one more for its vote, must stay below
        ``1 << shift``.
        """
        return ((1 << self._shift) - self.size - 1) * PIECE_BYTES

    def run(self, src, dst, op, postscale, bounds, allgather, call, new=None, read_only=False):
        """Reduce host array ``src`` into ``dst`` like ``Transport.allreduce``; return it, time.

        The time is when the reduce-scatter ended (``perf_counter_ns``). ``call`` numbers
        the calls that share the flags with the shared-memory ring. With ``dst`` None (an
        allgather only) the result is new: read-only in the result area of the shared file
        where every rank passed ``read_only`` and can take it there (as ``SharedRing.run``
        decides), else ``new(len(src))``. There the reduce-scatter writes each rank's
        segment straight into the one result, and there is no allgather.
        """
        n, rank, flags = self.size, self.rank, self._flags
        base = (call + 1) << self._shift
        regions = self._regions
        place = regions.vote(call, rank, src, dst is None and read_only) if allgather else None
        shared = False
        if place is not None:
            publish(flags, rank, base)  # the vote is in (output 0 is not: see below)
            shared = regions.carried(call, base, self._waiter)
        dst = regions.destination(place, shared, src, dst, new)
        op, scale = kernels.reduction_args(dst[:0], src[:0], src[:0], op, postscale)
        left, right = (rank - 1) % n, (rank + 1) % n
        chunk = max(1, PIECE_BYTES // src.itemsize)
        limits, pieces, lefts, ahead, counted, first = _layout(tuple(bounds), chunk, rank, n)
        base += 1  # progress counts from here: ``base`` itself says only that a vote is in
        self._addresses[rank] = (src.ctypes.data, dst.ctypes.data)
        publish(flags, rank, base + first)  # begun: addresses and output 0 are ready
        wait_until(flags, left, base, self._waiter)
        left_src, left_dst = (int(a) for a in self._addresses[left])
        scratch = self._pool.get("attach-scratch", chunk, src.dtype)
        outcome = follow(
            _reduce_scatter, flags, self._waiter, rank, n, base, self._pids[left], left_src,
            left_dst, limits, lefts, first, chunk, scratch, src, dst, op, scale, self._iov,
        )  # fmt: skip
        reduced = time.perf_counter_ns()
        if outcome[0] == DONE and allgather and not shared:
            outcome = follow(
                _allgather, flags, self._waiter, rank, right, n, base, self._pid_array,
                self._addresses, limits, pieces, ahead, counted, chunk, dst, self._iov,
            )  # fmt: skip
        if outcome[0] == _FAILED:
            err, address, owner = outcome[1:]
            raise _read_error(err, self._pids[owner], address)
        publish(flags, n + rank, call + 1)
        # Until every rank is done, one may still read this rank's buffers; and a shared
        # result is whole only once every rank has written its segment.
        for q in range(n):
            wait_until(flags, n + q, call + 1, self._waiter)
        if shared:
            dst.flags.writeable = False
        return dst, reduced


@functools.lru_cache(maxsize=64)
def _layout(bounds, chunk, rank, size):
    """Return the pieces' layout of a call cut by ``bounds`` for ``rank``, as arrays.

    That is: every segment's (start, stop) and its number of pieces; the segments that the
    left neighbour outputs (which this rank reads), in order; per segment, how many pieces
    of this rank's own outputs come before it (its right neighbour reads them in that
    order); the pieces of all segments; and the pieces of this rank's output 0, its input.
    """
    limits = limits_of(bounds)
    pieces = -(-(limits[:, 1] - limits[:, 0]) // chunk)
    orders = schedule.outputs(size)
    mine = orders[rank]
    ahead = np.zeros(size, np.int64)
    counted = 0
    for segment in mine:
        ahead[segment] = counted
        counted += int(pieces[segment])
    lefts = np.array(orders[(rank - 1) % size], np.int64)
    return limits, pieces, lefts, ahead, counted, int(pieces[mine[0]])


@njit
def _reduce_scatter(
    flags, rank, n, base, pid, left_src, left_dst, limits, lefts, first,
    chunk, scratch, src, dst, op, scale, iov, start,
):  # fmt: skip
    """Run the reduce-scatter from piece ``start`` on, as ``flags.follow`` calls it.

    Each piece of the left neighbour's outputs (its input first, then its partial sums) is
    read into ``scratch`` and reduced with this rank's ``src`` into ``dst``, the last step
    times ``scale``. Progress flags as in the module docstring. A failed read returns
    (_FAILED, piece, errno, address, the rank read).
    """
    left = (rank - 1) % n
    itemsize = src.itemsize
    j = 0
    for t in range(n - 1):
        lo, hi = limits[lefts[t], 0], limits[lefts[t], 1]
        origin = left_src if t == 0 else left_dst
        for c_lo in range(lo, hi, chunk):
            if j >= start:
                if not reached(flags, left, base + j + 1):
                    return waiting(j, left, base + j + 1)
                c_hi = min(c_lo + chunk, hi)
                piece = scratch[: c_hi - c_lo]
                address = origin + c_lo * itemsize
                err = _copy_from(pid, iov, piece.ctypes.data, address, (c_hi - c_lo) * itemsize)
                if err != 0:
                    return _FAILED, j, err, np.int64(address), np.int64(left)
                store(flags, 2 * n + rank, base + j + 1)  # read of the left so far
                if t == n - 2:
                    reduce_elements(dst[c_lo:c_hi], src[c_lo:c_hi], piece, op, scale)
                else:
                    reduce_elements(dst[c_lo:c_hi], src[c_lo:c_hi], piece, op, None)
                store(flags, rank, base + first + j + 1)
            j += 1
    return through(j)


@njit
def _allgather(
    flags, rank, right, n, base, pids, addresses, limits, pieces, ahead, counted, chunk, dst, iov,
    start,
):  # fmt: skip
    """Run the allgather from piece ``start`` on; return what ``_reduce_scatter`` does.

    Every other rank's finished segment is read, piece by piece, straight into ``dst``.
    """
    itemsize = dst.itemsize
    j = 0
    for k in range(1, n):
        owner = (rank + k) % n
        lo, hi = limits[owner, 0], limits[owner, 1]
        finished = counted - pieces[owner]  # the pieces before its last output
        i = 0
        for c_lo in range(lo, hi, chunk):
            if j >= start:
                if not reached(flags, owner, base + finished + i + 1):
                    return waiting(j, owner, base + finished + i + 1)
                # The right neighbour may still have to read what this piece overwrites.
                if not reached(flags, 2 * n + right, base + ahead[owner] + i + 1):
                    return waiting(j, 2 * n + right, base + ahead[owner] + i + 1)
                c_hi = min(c_lo + chunk, hi)
                address = np.int64(addresses[owner, 1]) + c_lo * itemsize
                local = dst.ctypes.data + np.uint64(c_lo * itemsize)
                err = _copy_from(pids[owner], iov, local, address, (c_hi - c_lo) * itemsize)
                if err != 0:
                    return _FAILED, j, err, address, np.int64(owner)
            i += 1
            j += 1
    return through(j)
