"""The hierarchical allreduce with 16-bit values on its ring across hosts, on pretend hosts.

The ranks are split into hosts of two (``Topology`` built by hand, so one machine runs it):
each host reduces in float32 to its first rank, the first ranks run the compressed ring, and
each host broadcasts the result. Compared bit for bit with float32 host sums run through
``wire_ring.simulate``.
"""

import numpy as np
from common import main, rank_data, same_bits_everywhere
from mpi4py import MPI
from wire_ring import WIRES, simulate

from ringtrain import settings
from ringtrain.buffers import BufferPool
from ringtrain.ops import ReduceOp
from ringtrain.topology import Topology
from ringtrain.transport.router import Transport

PER_HOST = 2


def pretend_hosts(comm) -> Topology:
    """Return the topology of ``comm`` as if every ``PER_HOST`` ranks shared a host."""
    r, n = comm.Get_rank(), comm.Get_size()
    hosts = tuple(i - i % PER_HOST for i in range(n))
    local = [i for i in range(n) if hosts[i] == hosts[r]]
    leaders = sorted(set(hosts))
    names = tuple(f"host{h}" for h in hosts)
    return Topology(
        r, n, local.index(r), len(local), leaders.index(hosts[r]), len(leaders), hosts, names,
        tuple(range(n)),
    )  # fmt: skip


def body():
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    topology = pretend_hosts(comm)
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
                want = simulate(host_sums, ReduceOp.Sum, postscale, wire)[0]
                got = np.empty(length, np.float32)
                transport.allreduce(data[r], got, ReduceOp.Sum, postscale, wire)
                what = f"{name} hierarchical {length} x{postscale}"
                bits = got.view(np.uint32) != want.view(np.uint32)
                assert not bits.any(), f"{what}: differs at {np.flatnonzero(bits)[:4].tolist()}"
                same_bits_everywhere(got, what)
    transport.free()


main(body)
