"""Where this process sits: global, per-host (local) and across-host (cross) rank and size."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Topology:
    """Ranks and sizes of one process in its communicator, its host and across hosts."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool  # every host runs as many ranks as this one


def discover(comm) -> Topology:
    """Read the topology of ``comm`` from MPI itself (collective over ``comm``)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    cross = comm.Split(color=local.Get_rank(), key=comm.Get_rank())
    try:
        local_sizes = comm.allgather(local.Get_size())
        return Topology(
            comm.Get_rank(),
            comm.Get_size(),
            local.Get_rank(),
            local.Get_size(),
            cross.Get_rank(),
            cross.Get_size(),
            len(set(local_sizes)) == 1,
        )
    finally:
        local.Free()
        cross.Free()
