"""The chunk of large calls' rings across hosts, chosen by timing the calls themselves.

A chunk is the size of each message of a ring, so every rank of a ring must cut the same
pieces (the sends in flight, by contrast, each rank sets alone). Small chunks fill a slow
link that two streams share; on a fast link they cost the overhead of each message
(docs/benchmarks.md, "The chunk across hosts is chosen by timing"). Neither a ring's rate
nor a probe of the link told the two apart on 2 cores, where polling paces a fast link,
so the calls choose: the first ``2 * TRIAL_CALLS`` calls of at least ``TRIAL_FROM_BYTES``
alternate between the ring chunk setting and ``SMALL_CHUNK_BYTES``, and every rank then
takes the one whose slowest rank's median time per byte was lower (by ``MARGIN``, or the
setting stays). The call's size decides whether a call takes part, never a segment's, so
every rank cuts alike; smaller calls keep the setting. The rings of other collectives that
a transport runs without a call here (an allgather) cut what the last call set, on every
rank alike. The ``ring_chunk_trial`` setting turns the trial off.
"""

import statistics
import time

import numpy as np
from mpi4py import MPI

SMALL_CHUNK_BYTES = 128 << 10
# At 1 Gbit/s, 2 hosts x 2 ranks, 128 KiB chunks took 16 MiB from 166 ms to 154 and 8 MiB
# from 86 to 80 (medians of six), but 1 and 4 MiB about 5% slower; at 10 Gbit/s they took
# 16 MiB from 26 ms to 55 (docs/benchmarks.md).
TRIAL_FROM_BYTES = 8 << 20
TRIAL_CALLS = 6  # calls timed with each chunk
MARGIN = 0.05  # the small chunk must be this much faster to be taken


class LinkChunkChoice:
    """Sets the chunk of each call's rings across hosts; times the two for the first calls.

    Over ``comm`` (the transport's); ``crossing`` are the ``MessageTransport``s whose rings
    cross hosts on this rank, and ``setting`` the ring chunk setting. ``chosen`` is the
    chunk of calls of at least ``TRIAL_FROM_BYTES`` once chosen (None before).
    """

    def __init__(self, comm: MPI.Comm, waiter, setting: int, crossing):
        self._comm, self._waiter = comm, waiter
        self._crossing = [transport for transport in crossing if transport is not None]
        self._setting = setting
        self._candidates = (setting, min(setting, SMALL_CHUNK_BYTES))
        self._per_byte = ([], [])  # seconds per byte of each candidate's calls
        self.chosen = setting if self._candidates[0] == self._candidates[1] else None

    def run(self, nbytes: int, call, trial: bool):
        """Return ``call()``, a call over ``nbytes`` that every rank makes now, in its chunk.

        Only ``trial`` calls (uncompressed allreduces) are timed; until the choice, the
        others keep the setting.
        """
        if nbytes < TRIAL_FROM_BYTES:
            return self._in(self._setting, call)
        if self.chosen is not None or not trial:
            return self._in(self.chosen or self._setting, call)
        turn = sum(map(len, self._per_byte)) % 2
        began = time.perf_counter()
        result = self._in(self._candidates[turn], call)
        self._per_byte[turn].append((time.perf_counter() - began) / nbytes)
        if len(self._per_byte[1]) == TRIAL_CALLS:
            self.chosen = self._choose()
        return result

    def _in(self, chunk: int, call):
        for transport in self._crossing:
            transport.link_chunk_bytes = chunk
        return call()

    def _choose(self) -> int:
        """Return the candidate whose slowest rank's median time per byte was lower."""
        mine = np.array([statistics.median(times) for times in self._per_byte])
        slowest = np.empty(2)
        request = self._comm.Iallreduce(mine, slowest, MPI.MAX)
        rank = self._comm.Get_rank()
        others = [r for r in range(self._comm.Get_size()) if r != rank]
        self._waiter.wait(request, others, "the choice of the chunk across hosts")
        return self._candidates[1 if small_is_faster(*slowest) else 0]


def small_is_faster(setting_time: float, small_time: float) -> bool:
    """Return True if the small chunk's time beats the setting's by more than ``MARGIN``."""
    return small_time < setting_time * (1 - MARGIN)
