"""The chunk of large calls across hosts: both candidates timed, one chosen by every rank.

On the job's hosts where it spans several, else on pretend hosts (``common.pretend_hosts``),
flat and hierarchical: the first calls of at least ``TRIAL_FROM_BYTES`` alternate between
the ring chunk setting and the small chunk, each rank's data its own and every result
against NumPy, in place and not; then every rank must hold the same choice, and later
calls, large and small, stay right, each cut as chosen. A setting no larger than the
small chunk leaves nothing to choose, rank 0 turning the trial off turns it off
everywhere, and one host (-np 1) has no choice.
"""

import numpy as np
from common import assert_equal, expected, main, pretend_hosts, rank_data
from mpi4py import MPI

from ringtrain import settings
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.topology import discover
from ringtrain.transport import link_chunk
from ringtrain.transport.router import Transport

LARGE = link_chunk.TRIAL_FROM_BYTES // 4 + 1001  # float32 and int32 elements, uneven
CALLS = [(np.int32, ReduceOp.Sum), (np.float32, ReduceOp.Max)]


def allreduce_checked(transport, comm, length, number):
    """Run one allreduce of ``length`` rank-distinct values; check it against NumPy."""
    r, n = comm.Get_rank(), comm.Get_size()
    dtype, op = CALLS[number % len(CALLS)]
    data = [rank_data(i, (length,), dtype, salt=number) for i in range(n)]
    what = f"call {number}: {np.dtype(dtype).name} {op.name} of {length} on {n} ranks"
    if number % 3 == 0:
        got = data[r].copy()
        transport.allreduce(got, got, op)
    else:
        got = np.empty(length, dtype)
        transport.allreduce(data[r], got, op)
    assert_equal(got, expected(op, data, dtype), what)


def body():
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topology = discover(comm)  # hosts of their own (tests/test_multihost.py), or pretend ones
    if topology.one_host:
        topology = pretend_hosts(comm, 1 if n == 2 else 2)
    if n == 1:  # one host: no ring crosses a link, so nothing is chosen
        transport = Transport(comm, topology, settings.read(), BufferPool())
        assert transport.link_chunks is None, "a chunk choice on one host"
        allreduce_checked(transport, comm, LARGE, 0)
        transport.free()
        return
    for hierarchical in (False, True):
        chosen = settings.read(hierarchical_allreduce=hierarchical)
        transport = Transport(comm, topology, chosen, BufferPool())
        choice = transport.link_chunks
        assert choice is not None and choice.chosen is None, "a choice before any call"
        trials = 2 * link_chunk.TRIAL_CALLS
        candidates = (chosen.ring_chunk_bytes, link_chunk.SMALL_CHUNK_BYTES)
        for number in range(trials):
            allreduce_checked(transport, comm, LARGE, number)
            cut = transport.messages.link_chunk_bytes
            assert cut == candidates[number % 2], f"trial call {number} cut {cut}"
            allreduce_checked(transport, comm, 1 + number * 7, number)  # small: not timed
            cut = transport.messages.link_chunk_bytes
            assert cut == chosen.ring_chunk_bytes, f"a small call cut {cut}"
            done = number == trials - 1
            assert (choice.chosen is not None) == done, f"chosen {choice.chosen} after {number}"
        assert choice.chosen in candidates, f"chose {choice.chosen}, not one of {candidates}"
        everyone = comm.allgather(choice.chosen)
        assert len(set(everyone)) == 1, f"the ranks chose apart: {everyone}"
        for number in range(trials, trials + 3):
            allreduce_checked(transport, comm, LARGE + number, number)
            cut = transport.messages.link_chunk_bytes
            assert cut == choice.chosen, f"a call after the choice of {choice.chosen} cut {cut}"
            allreduce_checked(transport, comm, number - trials, number)  # 0, 1, 2
        transport.free()
    # Rank 0's setting wins: with the trial off there, no rank tries.
    off = settings.read(ring_chunk_trial=comm.Get_rank() != 0)
    transport = Transport(comm, topology, off, BufferPool())
    assert transport.link_chunks is None, "a trial where rank 0 turned it off"
    allreduce_checked(transport, comm, LARGE, 0)
    transport.free()
    small = settings.read(ring_chunk_bytes=link_chunk.SMALL_CHUNK_BYTES // 2)
    transport = Transport(comm, topology, small, BufferPool())
    assert transport.link_chunks.chosen == small.ring_chunk_bytes, "nothing to choose"
    allreduce_checked(transport, comm, LARGE, 0)
    transport.free()


main(body)
