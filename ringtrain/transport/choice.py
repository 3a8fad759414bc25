"""Which transport carries a collective: a pure function of the call and what the job has.

Measured (docs/benchmarks.md), the rules are:

- Nothing to exchange (one rank, or no bytes): the call stays local.
- Allreduce across hosts when some host runs several ranks (``hierarchical``): reduce within
  each host, ring across the hosts, share the result within each host (every rank of a host
  carries its share across where the hosts run equally many ranks, else the hosts' first
  ranks carry it all). Splitting by host wins across slow links between hosts, and loses to
  the flat ring within one host.
- Where the hosts run equally many ranks, a hierarchical allreduce whose bytes on the wire
  reach ``LEADERS_FROM_BYTES`` crosses through the hosts' first ranks alone (the others feed
  them chunk by chunk and take the result back), so that one stream of messages crosses
  each link each way (``through_leaders``). At 1 Gbit/s, 2 hosts x 2 ranks, medians of
  the `out=` and read-only calls over five rounds: 16 MiB took 141.5 and 142.7 ms against
  145.9 and 146.0 with a ring per local rank, 8 MiB 73.3 and 71.1 against 73.4 and 73.2
  (`MPI_Allreduce` 140.7 and 70.3). Over three rounds, 1 MiB took 9.2 and 9.6 against 8.9
  and 8.7, and 4 MiB 38.8 and 37.2 against 36.2 and 36.7: there the host's first feed and
  last share weigh more. At 10 Gbit/s it was faster at 4 and 16 MiB. A call compressed to
  16 bits counts its 16-bit bytes: 16 MiB of float32 in fp16 took 73.3 ms through the
  leaders against 75.5, 8 MiB 38.4 against 37.3.
- Every rank on one host, with shared memory: calls that fit the shared-memory regions go
  through them (``SHARED``), except host calls of more than ``ATTACH_ABOVE_BYTES`` where
  every rank has a core of its own and peers may read each other's memory: those read
  peers' buffers in place (``ATTACH``). Through the engine at -np 2 on 2 cores that ring
  was 10% faster at 3 MiB and 17% at 4 MiB, level at 2 MiB, and slower at 1 MiB, where the
  ranks' skew costs it more; at -np 4 on 2 cores it was 8-24% slower at 3 and 4 MiB, since
  it waits for every rank at the end of a call. Calls too large for the regions take the
  attach ring wherever it can carry them.
- An allreduce compressed to 16 bits on the wire goes where it halves the bytes on a link:
  the message ring when flat, and the ring across hosts when hierarchical (whose reduce and
  broadcast within each host stay float32). The host's shared-memory and attach rings,
  which move no bytes over a link, never carry it.
- Allgather across hosts of ``RING_ALLGATHER_BYTES`` gathered or more: the message
  transport's own chunked ring (``RING``), which keeps each host's link busy while
  ringtrain's waits sleep. At 2 hosts x 2 ranks and 1 Gbit/s, 1 MiB from each rank took
  42-44 ms against 51-53 for MPI's non-blocking allgather, 4 MiB 128-131 against 170-185;
  64 KiB took 1.8 ms against 1.3, and 64 bytes 0.9 against 0.5; at one rank per host the
  two were level. On one host MPI's own is faster at every size (-np 2, 1 MiB from each
  rank: 190 us against 757 us). ``bench allreduce --allgather`` through ``bench cluster``
  times the result against a blocking ``MPI_Allgather`` (docs/benchmarks.md).
- Reductions of arrays in GPU memory cross to the host once and back once (``STAGED``),
  and between those copies the host's route, by the rules above, carries the host copy.
  Where every rank's MPI is CUDA-aware (``device_mpi``), an allreduce that sends float32 on
  the wire goes to MPI on the device memory itself instead (``DEVICE``); a compressed one
  and a reduce-scatter are still staged, since their kernels run on the host. Not yet
  measured on a GPU. Other collectives take host memory only.
- Everything else, and broadcast, alltoall and Adasum always: MPI messages.
"""

import dataclasses
import enum

ATTACH_ABOVE_BYTES = 2 << 20
RING_ALLGATHER_BYTES = 4 << 20
LEADERS_FROM_BYTES = 8 << 20


class Collective(enum.Enum):
    """The collectives that the engine asks a transport for."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    ADASUM = "adasum"


class Route(enum.Enum):
    """The transports a collective can take."""

    LOCAL = "local"  # nothing crosses a process boundary
    MESSAGES = "messages"  # ringtrain.transport.messages
    RING = "ring"  # ringtrain.transport.messages, its own ring instead of MPI's collective
    SHARED = "shared"  # ringtrain.transport.shared
    ATTACH = "attach"  # ringtrain.transport.attach
    HIERARCHICAL = "hierarchical"  # ringtrain.transport.hierarchical
    STAGED = "staged"  # device memory through a host copy (ringtrain.transport.routes)
    DEVICE = "device"  # device memory straight to a CUDA-aware MPI (ringtrain.transport.routes)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one rank's transports can do; the same on every rank of a communicator.

    ``shared_bytes``: the largest call the shared-memory regions take (0: no regions).
    ``attach_below``: calls of fewer bytes fit the attach ring (0: no attach ring).
    ``core_each``: every rank of the host has a core of its own.
    ``hierarchical``: allreduce splits by host.
    ``across_hosts``: the ranks run on more than one host.
    ``device_mpi``: every rank's MPI takes GPU memory (``transport.device_mpi``).
    """

    size: int
    shared_bytes: int = 0
    attach_below: int = 0
    core_each: bool = False
    hierarchical: bool = False
    across_hosts: bool = False
    device_mpi: bool = False


def hierarchical_wanted(setting: bool | None, host_count: int, most_per_host: int) -> bool:
    """Return whether allreduce splits by host: the setting, or by default where it pays."""
    if setting is not None:
        return setting
    return host_count > 1 and most_per_host > 1


def through_leaders(wire_bytes: int) -> bool:
    """Return whether a hierarchical allreduce crosses hosts through their first ranks alone.

    For hosts of equal size; ``wire_bytes`` is the call's size as it crosses the link
    (half a float32 call's, compressed to 16 bits). See the module docstring.
    """
    return wire_bytes >= LEADERS_FROM_BYTES


def choose(
    collective: Collective,
    nbytes: int,
    host: bool,
    capabilities: Capabilities,
    compressed: bool = False,
    device: bool = False,
) -> Route:
    """Return the route of one call of ``collective`` over ``nbytes`` (see the module docstring).

    ``host``: its input, and its output where one is given, are C-contiguous host (NumPy)
    arrays, which a peer can read by address. ``compressed``: an allreduce whose partial
    sums cross the link as 16-bit values. ``device``: its arrays are in GPU memory.
    """
    reduces = collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER)
    if device and not reduces:
        raise ValueError(f"{collective.value} takes host memory only, not device arrays")
    if collective is Collective.ALLGATHER:
        ring = capabilities.across_hosts and nbytes >= RING_ALLGATHER_BYTES
        return Route.RING if ring else Route.MESSAGES
    if not reduces:
        return Route.MESSAGES
    if compressed and collective is not Collective.ALLREDUCE:
        raise ValueError(f"only allreduce sends 16-bit values on the wire, not {collective.value}")
    if capabilities.size == 1 or nbytes == 0:
        return Route.LOCAL
    if device:
        direct = capabilities.device_mpi and collective is Collective.ALLREDUCE and not compressed
        return Route.DEVICE if direct else Route.STAGED
    if capabilities.hierarchical:
        return Route.HIERARCHICAL if collective is Collective.ALLREDUCE else Route.MESSAGES
    if compressed:
        return Route.MESSAGES
    attach = host and nbytes < capabilities.attach_below
    if nbytes <= capabilities.shared_bytes:
        if not (attach and capabilities.core_each and nbytes > ATTACH_ABOVE_BYTES):
            return Route.SHARED
    return Route.ATTACH if attach else Route.MESSAGES
