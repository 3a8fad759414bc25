"""The hierarchical allreduce with 16-bit values on its ring across hosts, on pretend hosts.

The ranks are split into hosts of two (``Topology`` built by hand, so one machine runs it).
Hosts of one size (-np 2 and 4) split the work: each rank owns a segment, reduced from its
host's ranks in float32 chunk by chunk while the ranks with the same local rank run the
compressed ring on it across hosts, and hands it back to them. Hosts of different sizes
(-np 3) reduce in float32 to every rank of the host, the first ranks run the compressed
ring, and each host broadcasts the result.
Compared bit for bit with float32 host sums run through ``wire_ring.simulate``, per segment
where the work is split.
"""

import numpy as np
from common import main, pretend_hosts, rank_data, same_bits_everywhere
from mpi4py import MPI
from wire_ring import WIRES, simulate

from ringtrain import settings
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.transport import codec
from ringtrain.transport.router import Transport
from ringtrain.transport.schedule import segment_bounds

PER_HOST = 2


def expected(host_sums, topology, postscale, wire):
    """Return the compressed allreduce of ``host_sums``, as the hosts' rings run it."""
    if not topology.homogeneous:
        return simulate(host_sums, ReduceOp.Sum, postscale, wire)[0]
    pieces = [
        simulate([total[lo:hi] for total in host_sums], ReduceOp.Sum, postscale, wire)[0]
        for lo, hi in segment_bounds(len(host_sums[0]), PER_HOST)
    ]
    return np.concatenate(pieces)


def body():
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    topology = pretend_hosts(comm, PER_HOST)
    chosen = settings.read(hierarchical_allreduce=True, ring_chunk_bytes=256)
    transport = Transport(comm, topology, chosen, BufferPool())
    assert transport.capabilities.hierarchical
    for name, wire in WIRES.items():
        for length in (0, 1, 7, 1001, 10007):
            for postscale in (1.0, 0.25):
                data = [rank_data(i, (length,), np.float32, salt=length) for i in range(n)]
                host_sums = [
                    data[h] + data[h + 1] if h + 1 < n else data[h].copy()
                    for h in sorted(set(topology.hosts))
                ]
                want = expected(host_sums, topology, postscale, wire)
                got = np.empty(length, np.float32)
                transport.allreduce(data[r], got, ReduceOp.Sum, postscale, codec.by_name(str(wire)))
                what = f"{name} hierarchical {length} x{postscale}"
                bits = got.view(np.uint32) != want.view(np.uint32)
                assert not bits.any(), f"{what}: differs at {np.flatnonzero(bits)[:4].tolist()}"
                same_bits_everywhere(got, what)
    transport.free()


main(body)
