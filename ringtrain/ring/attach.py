"""The ring for large calls on one host: each rank reads its neighbours' buffers in place.

Linux lets a process copy straight out of another's memory (``process_vm_readv``, cross-memory
attach), as MPI itself does for large messages between ranks of a host. Here a rank needs no
send at all: where the message ring would receive its left neighbour's partial sum, it copies
that piece out of the neighbour's own buffer into a small scratch buffer, which stays in its
cache, and reduces it from there. In the allgather it copies each finished segment out of the
buffer of the rank that finished it, straight into its result. That is one copy per piece,
with no message protocol and no copy through shared memory.

The ranks order themselves with the progress flags of the shared-memory ring
(``ringtrain.ring.flags``), in the same file. At the start of a call each rank writes the
addresses of its input and result beside the flags, then publishes that it has begun; after
each piece it publishes how far it has got, and how far it has read its left neighbour:

- A rank reads a piece only once its owner's count covers it.
- A rank overwrites a piece of its result that its right neighbour reads (its own input,
  when the call is in place, or a partial sum) only once that neighbour's count of what it
  has read covers it.
- A rank returns only when every rank has finished the call, since until then another rank
  may still read its buffers.
"""

import ctypes
import os
import sys
import time

import numpy as np

from ringtrain.ring import schedule
from ringtrain.ring.flags import publish, wait_until
from ringtrain.ring.shared import SharedRegions

_PROBE = 0x5249_4E47_0000_0000  # "RING": a rank's probe word holds this plus its rank
# A rank reads and reduces pieces of this many bytes: small enough that a piece and its
# scratch copy stay in the cache, large enough that the calls per piece cost little
# (measured: 512 KiB beat 256 KiB and 1 MiB at 16 MiB, docs/benchmarks.md).
PIECE_BYTES = 512 << 10


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _process_vm_readv():
    """Return libc's ``process_vm_readv``, typed, or None where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    function.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return function


_READV = _process_vm_readv()


def read(pid: int, address: int, out: np.ndarray) -> None:
    """Fill ``out`` (contiguous) with the bytes at ``address`` in process ``pid``.

    Raises OSError naming the process and the errno when the kernel refuses or falls short.
    """
    done, total = 0, out.nbytes
    local, remote = _Iovec(), _Iovec()
    while done < total:
        local.base, local.length = out.ctypes.data + done, total - done
        remote.base, remote.length = address + done, total - done
        got = _READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(
                err,
                f"cannot read {total - done} bytes at {address + done:#x} of process {pid} "
                f"(process_vm_readv: {os.strerror(err) if got < 0 else 'read nothing'})",
            )
        done += got


class AttachRing:
    """Ring collectives of one rank that read peers' buffers in place (module docstring).

    Build it with ``create``, which checks that every rank may read every other. Progress
    is counted in pieces (of ``PIECE_BYTES``), below the call number in a flag (see
    ``SharedRing``); ``fits`` says which calls have few enough pieces for that.
    """

    def __init__(self, comm, regions: SharedRegions, pids, pool):
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._regions = regions
        self._flags = regions.flags
        self._addresses = regions.addresses
        self._pids = pids
        self._pool = pool
        self._shift = regions.capacity.bit_length()
        self._outputs = schedule.outputs(self.size)

    @classmethod
    def create(cls, comm, regions: SharedRegions, pool):
        """Return an ``AttachRing`` on every rank, or None on all: collective.

        None when some rank cannot read another's memory (no ``process_vm_readv``, or the
        kernel forbids it).
        """
        rank = comm.Get_rank()
        probe = np.array([_PROBE + rank], np.uint64)
        pids = comm.allgather((os.getpid(), probe.ctypes.data))
        works = _READV is not None
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
        return cls(comm, regions, [pid for pid, _ in pids], pool)

    def fits(self, count: int, itemsize: int) -> bool:
        """Return True if ``count`` elements of ``itemsize`` bytes make few enough pieces."""
        pieces = count * itemsize // PIECE_BYTES + self.size
        return pieces < 1 << self._shift

    def run(self, backend, src, dst, op, postscale, bounds, allgather, call) -> int:
        """Reduce host array ``src`` into ``dst`` as ``Ring`` does; return the time it ended.

        The time is when the reduce-scatter ended (``perf_counter_ns``). ``call`` numbers
        the calls that share the flags with the shared-memory ring.
        """
        n, rank, flags = self.size, self.rank, self._flags
        base = (call + 1) << self._shift
        left, right = (rank - 1) % n, (rank + 1) % n
        itemsize = src.itemsize
        chunk = max(1, PIECE_BYTES // itemsize)
        pieces = [schedule.chunks(lo, hi, chunk) for lo, hi in bounds]
        self._addresses[rank] = (src.ctypes.data, dst.ctypes.data)
        outputs, lefts = self._outputs[rank], self._outputs[left]
        # Pieces of a rank's outputs in order, before each output: the same for every rank's
        # right neighbour, which reads them in this order.
        ahead = {}
        counted = 0
        for segment in outputs:
            ahead[segment] = counted
            counted += len(pieces[segment])
        published = len(pieces[outputs[0]])  # output 0 is the input itself
        publish(flags, rank, base + published)  # begun: addresses and output 0 are ready
        wait_until(flags, left, base)
        left_src, left_dst = (int(a) for a in self._addresses[left])
        scratch = self._pool.get("attach-scratch", chunk, src.dtype)
        last, consumed = n - 2, 0
        for t in range(n - 1):
            origin = left_src if t == 0 else left_dst
            for c_lo, c_hi in pieces[lefts[t]]:
                consumed += 1
                wait_until(flags, left, base + consumed)
                piece = scratch[: c_hi - c_lo]
                read(self._pids[left], origin + c_lo * itemsize, piece)
                publish(flags, 2 * n + rank, base + consumed)  # read of the left so far
                scale = postscale if t == last else 1.0
                backend.reduce(dst[c_lo:c_hi], src[c_lo:c_hi], piece, op, scale)
                published += 1
                publish(flags, rank, base + published)
        reduced = time.perf_counter_ns()
        for k in range(1, n if allgather else 1):
            owner = (rank + k) % n
            finished = counted - len(pieces[owner])  # the pieces before its last output
            wait_until(flags, owner, base)
            owner_dst = int(self._addresses[owner][1])
            for i, (c_lo, c_hi) in enumerate(pieces[owner]):
                wait_until(flags, owner, base + finished + i + 1)
                # The right neighbour may still have to read what this piece overwrites.
                wait_until(flags, 2 * n + right, base + ahead[owner] + i + 1)
                read(self._pids[owner], owner_dst + c_lo * itemsize, dst[c_lo:c_hi])
        publish(flags, n + rank, call + 1)
        for q in range(n):  # until every rank is done, one may still read this rank's buffers
            wait_until(flags, n + q, call + 1)
        return reduced
