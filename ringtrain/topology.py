"""Where this process sits: global, per-host (local) and across-host (cross) rank and size.

The hosts of a communicator are found once, by ``discover``; everything that needs them (core
binding, the choice of transport, the hierarchical allreduce's split) asks the ``Topology``
instead of asking MPI again.
"""

import collections
import dataclasses


@dataclasses.dataclass(frozen=True)
class Topology:
    """Ranks and sizes of one process in its communicator, its host and across hosts.

    ``hosts[r]`` names the host of communicator rank ``r`` by the lowest rank on it, and
    ``host_names[r]`` by its name (``MPI_Get_processor_name``), for messages;
    ``world_ranks[r]`` is its rank in ``MPI_COMM_WORLD`` (what the launcher knows it by).
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hosts: tuple[int, ...]
    host_names: tuple[str, ...]
    world_ranks: tuple[int, ...]

    @property
    def homogeneous(self) -> bool:
        """Return True if every host runs the same number of ranks."""
        return len(set(collections.Counter(self.hosts).values())) == 1

    @property
    def host(self) -> int:
        """Return this process's host, named by the lowest rank on it."""
        return self.hosts[self.rank]

    @property
    def one_host(self) -> bool:
        """Return True if every rank runs on this process's host."""
        return self.local_size == self.size

    @property
    def alone_on_host(self) -> bool:
        """Return True if other ranks run, but none of them on this process's host."""
        return self.size > 1 and self.local_size == 1

    @property
    def host_count(self) -> int:
        """Return the number of hosts."""
        return len(set(self.hosts))

    @property
    def most_per_host(self) -> int:
        """Return the largest number of ranks that one host runs."""
        return max(collections.Counter(self.hosts).values())

    def local_ranks(self) -> list[int]:
        """Return the communicator ranks on this process's host, in order."""
        return [r for r, host in enumerate(self.hosts) if host == self.host]


def discover(comm) -> Topology:
    """Read the topology of ``comm`` from MPI itself (collective over ``comm``)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    cross = comm.Split(color=local.Get_rank(), key=comm.Get_rank())
    try:
        leader = local.bcast(comm.Get_rank(), root=0)
        here = (leader, MPI.Get_processor_name(), MPI.COMM_WORLD.Get_rank())
        everyone = comm.allgather(here)
        return Topology(
            comm.Get_rank(),
            comm.Get_size(),
            local.Get_rank(),
            local.Get_size(),
            cross.Get_rank(),
            cross.Get_size(),
            *(tuple(column) for column in zip(*everyone, strict=True)),
        )
    finally:
        local.Free()
        cross.Free()
