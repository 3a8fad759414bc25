"""Several ranks' engines in one process, joined by in-memory channels and transports.

Nothing here stands in for a result: each rank runs ringtrain's own ``Engine`` (the same
coordinator, sides, heartbeats, planner and executor as under ``mpirun``), every control
message is pickled as the MPI control channel pickles it, and every collective moves each
rank's real data between threads and reduces it with ringtrain's own kernels, in rank order,
so that every rank ends with the same bits. What differs from MPI is only the wire: a
queue per pair of ranks, in order, as MPI's messages between two ranks are. Waits on peers
go through the transport's real ``Waiter``, so a rank cut off (``Fabric.cut``) is found
lost by the same timeouts, heartbeats and notices as a frozen host.
"""

import collections
import dataclasses
import pickle
import threading
import time

import numpy as np

from ringtrain.buffers import BufferPool
from ringtrain.engine.core import Engine
from ringtrain.kernels import cpu
from ringtrain.settings import Settings
from ringtrain.topology import Topology
from ringtrain.transport.adasum import adasum
from ringtrain.transport.local import copy_scaled
from ringtrain.transport.progress import Waiter

_REQUEST, _RESPONSE, _ROUND, _LOST, _DATA = "request", "response", "round", "lost", "data"


class Fabric:
    """The wires between ``size`` ranks: one ordered queue per (kind, sender, receiver)."""

    def __init__(self, size):
        self.size = size
        self._lock = threading.Lock()
        self._queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self._cut: set[int] = set()
        self.aborted: list[tuple[int, int]] = []  # (rank, status) of each abort
        self.submitted: list[tuple[int, list]] = []  # every submission that reached rank 0

    def post(self, kind, source, dest, payload) -> None:
        """Queue ``payload`` from ``source`` to ``dest``, unless either is cut off."""
        with self._lock:
            if source not in self._cut and dest not in self._cut:
                self._queues[kind, source, dest].append(payload)

    def take(self, kind, source, dest):
        """Return the oldest ``payload`` queued from ``source`` to ``dest``, or None."""
        with self._lock:
            queue = self._queues.get((kind, source, dest))
            return queue.popleft() if queue else None

    def unreceived(self) -> dict[tuple, int]:
        """Return how many messages wait in each (kind, sender, receiver) queue still."""
        with self._lock:
            return {key: len(queue) for key, queue in self._queues.items() if queue}

    def cut(self, rank) -> None:
        """Cut ``rank`` off, as a frozen host is: nothing it sends arrives, nothing reaches it."""
        with self._lock:
            self._cut.add(rank)


class MemoryChannel:
    """One rank's end of the control channel (``transport.control.ControlChannel``'s calls)."""

    def __init__(self, fabric, rank, waiter):
        self._fabric = fabric
        self.rank = rank
        self.size = fabric.size
        self._waiter = waiter

    def submit(self, entries) -> None:
        """Send ``entries`` to the coordinator."""
        self._fabric.post(_REQUEST, self.rank, 0, pickle.dumps(entries))

    def submissions(self):
        """Return (rank, entries) for every submission that has reached the coordinator."""
        received = [
            (source, entries)
            for source in range(self.size)
            for entries in _drained(self._fabric, _REQUEST, source, 0)
        ]
        self._fabric.submitted += received
        return received

    def respond(self, wire) -> None:
        """Send ``wire`` to every other rank, pickled once."""
        payload = pickle.dumps(wire)
        for dest in range(1, self.size):
            self._fabric.post(_RESPONSE, 0, dest, payload)

    def responses(self):
        """Return the wire forms of every response that has reached this rank, in order."""
        return _drained(self._fabric, _RESPONSE, 0, self.rank)

    def start_and(self, vector):
        """Start the bitwise AND of every rank's ``vector``: sent to each, ANDed in ``test``."""
        for dest in range(self.size):
            if dest != self.rank:
                self._fabric.post(_ROUND, self.rank, dest, vector.copy())
        return _MemoryRound(self._fabric, self.rank, vector)

    def tell_lost(self, notice, ranks) -> list:
        """Send ``notice`` to each of ``ranks``; return the sends (complete at once here)."""
        payload = pickle.dumps(notice)
        for dest in ranks:
            self._fabric.post(_LOST, self.rank, dest, payload)
        return []

    def lost_notices(self) -> list:
        """Return the notices of lost peers that other ranks have sent this one."""
        return [n for s in range(self.size) for n in _drained(self._fabric, _LOST, s, self.rank)]

    def finish(self, last) -> None:
        """Send ``last`` after all else to rank 0, which drains until every rank's came."""
        if self.rank != 0:
            self.submit(last)
        else:
            self._drain(_REQUEST, range(1, self.size), last)

    def _drain(self, kind, sources, last) -> None:
        waiting = set(sources)

        def every_last_in():
            for source in list(waiting):
                payload = self._fabric.take(kind, source, self.rank)
                while payload is not None:
                    if pickle.loads(payload) == last:
                        waiting.discard(source)
                        break
                    payload = self._fabric.take(kind, source, self.rank)
            return not waiting

        what = "the engine's shutdown (each rank's last control message)"
        self._waiter.until(every_last_in, sorted(waiting), what)

    def close(self) -> None:
        """Free the channel: every send here has completed already."""

    def abort(self, status: int) -> None:
        """Record that this rank ends the job with ``status`` (MPI would end every process)."""
        self._fabric.aborted.append((self.rank, status))


class _MemoryRound:
    """One rank's agreement round in flight: the others' vectors, taken as they come.

    A rank has one round in flight at a time, so the next vector from each rank is its
    vector of this round, as MPI matches a communicator's collectives in order.
    """

    def __init__(self, fabric, rank, vector):
        self._fabric = fabric
        self._rank = rank
        self._result = vector.copy()
        self._waiting = {r for r in range(fabric.size) if r != rank}

    def test(self):
        """Return the AND of every rank's vector once all are in, else None."""
        for source in list(self._waiting):
            vector = self._fabric.take(_ROUND, source, self._rank)
            if vector is not None:
                self._result &= vector
                self._waiting.discard(source)
        return None if self._waiting else self._result


def _drained(fabric, kind, source, dest) -> list:
    received = []
    payload = fabric.take(kind, source, dest)
    while payload is not None:
        received.append(pickle.loads(payload))
        payload = fabric.take(kind, source, dest)
    return received


class MemoryTransport:
    """One rank's collectives over the fabric (``transport.router.Transport``'s calls).

    Each collective sends this rank's data to every rank that needs it and reduces what it
    receives in rank order with ringtrain's CPU kernels; Adasum runs ringtrain's own
    exchange pattern (``transport.adasum``) over the same wires.
    """

    def __init__(self, fabric, topology, settings):
        self._fabric = fabric
        self.rank = topology.rank
        self.size = topology.size
        self.chunk_bytes = settings.ring_chunk_bytes
        self.waiter = Waiter(settings.collective_timeout, topology)
        self.cache_capacity = settings.cache_capacity

    def _send(self, dest, array) -> None:
        self._fabric.post(_DATA, self.rank, dest, np.array(array, copy=True))

    def _receive(self, source, what):
        got = [None]

        def arrived():
            got[0] = self._fabric.take(_DATA, source, self.rank)
            return got[0] is not None

        self.waiter.until(arrived, [source], what)
        return got[0]

    def _everyones(self, array, what) -> list:
        """Return every rank's copy of ``array``, in rank order (collective)."""
        for dest in range(self.size):
            if dest != self.rank:
                self._send(dest, array)
        return [array if r == self.rank else self._receive(r, what) for r in range(self.size)]

    def allreduce(self, src, dst, op, postscale=1.0, codec=None) -> int:
        """Reduce 1-D ``src`` over all ranks into ``dst``, times ``postscale``."""
        if codec is not None:
            raise ValueError(f"the in-memory transport carries no {codec} wire; reduce float32")
        if self.size == 1:
            copy_scaled(src, dst, postscale)
            return time.perf_counter_ns()
        parts = self._everyones(src, "an allreduce")  # dst is written only at the end
        total = parts[0].copy()
        for part in parts[1:-1]:
            cpu.reduce(total, total, part, op)
        cpu.reduce(dst, total, parts[-1], op, postscale)
        return time.perf_counter_ns()

    def allreduce_new(self, src, op, postscale, new, read_only, codec=None):
        """Reduce ``src`` into ``new(len(src))``; return it and the time it ended."""
        result = new(len(src))
        return result, self.allreduce(src, result, op, postscale, codec)

    def reduce_scatter(self, src, dst, op, postscale, bounds) -> int:
        """Reduce ``src`` into the whole of ``dst`` (this rank's part of it included)."""
        return self.allreduce(src, dst, op, postscale)

    def allgatherv(self, send, recv, counts, displacements) -> None:
        """Gather every rank's bytes ``send`` into ``recv``: rank r's at ``displacements[r]``."""
        for r, part in enumerate(self._everyones(send, "an allgather")):
            recv[displacements[r] : displacements[r] + counts[r]] = part

    def broadcast(self, buffer, root: int) -> None:
        """Overwrite the bytes ``buffer`` on every rank with ``root``'s."""
        if self.rank == root:
            for dest in range(self.size):
                if dest != root:
                    self._send(dest, buffer)
        else:
            buffer[:] = self._receive(root, "a broadcast")

    def alltoallv(self, send, sent, recv, got) -> None:
        """Send ``sent[r]`` bytes of ``send`` to rank r, and take ``got[r]`` bytes from it."""
        starts = np.concatenate([[0], np.cumsum(sent)]).astype(int)
        for dest in range(self.size):
            if dest != self.rank:
                self._send(dest, send[starts[dest] : starts[dest + 1]])
        at = 0
        for source in range(self.size):
            if source == self.rank:
                part = send[starts[source] : starts[source + 1]]
            else:
                part = self._receive(source, "an alltoall")
            recv[at : at + got[source]] = part
            at += got[source]

    def adasum(self, vector, scratch) -> None:
        """Combine every rank's ``vector`` by Adasum, in place."""
        adasum(self.rank, self.size, vector, scratch, self._exchange)

    def _exchange(self, send, recv, partner) -> None:
        self._send(partner, send)
        recv[:] = self._receive(partner, "an Adasum exchange")

    def free(self) -> None:
        """Free nothing: the fabric holds no resource."""


def topology_of(rank, size) -> Topology:
    """Return the topology of ``rank`` in a job of ``size`` ranks, each on its own host."""
    return Topology(
        rank,
        size,
        0,
        1,
        rank,
        size,
        tuple(range(size)),
        tuple(f"memory{r}" for r in range(size)),
        tuple(range(size)),
    )


def start_engines(size, **settings):
    """Return a fabric and ``size`` engines on it, with ``settings`` (Settings fields) set."""
    chosen = dataclasses.replace(Settings(), **settings)
    fabric = Fabric(size)
    engines = []
    for rank in range(size):
        topology = topology_of(rank, size)
        transport = MemoryTransport(fabric, topology, chosen)
        channel = MemoryChannel(fabric, rank, transport.waiter)
        engines.append(Engine(chosen, topology, transport, channel, BufferPool()))
    return fabric, engines


def on_every_rank(engines, work, timeout=60.0) -> list:
    """Run ``work(rank, engine)`` on a thread per rank; return each rank's result or error.

    Raises AssertionError, naming the ranks, if any is still running after ``timeout`` s.
    """
    outcomes: list = [None] * len(engines)

    def run(rank):
        try:
            outcomes[rank] = work(rank, engines[rank])
        except BaseException as err:  # noqa: BLE001 - the test reads each rank's error
            outcomes[rank] = err

    threads = [
        threading.Thread(target=run, args=(r,), name=f"rank-{r}", daemon=True)
        for r in range(len(engines))
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"ranks {hung} still running after {timeout:g} s"
    return outcomes


def shut_down(engines, timeout=30.0) -> list:
    """Shut every engine down, as every rank's ``shutdown()`` does; return each one's error."""
    return on_every_rank(engines, lambda rank, engine: engine.shutdown(), timeout)
