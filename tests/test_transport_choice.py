"""The pure rule that picks each collective's transport, without MPI."""

import dataclasses
import itertools

import pytest

from ringtrain.transport import routes
from ringtrain.transport.calls import Memory
from ringtrain.transport.choice import (
    ATTACH_ABOVE_BYTES,
    LEADERS_FROM_BYTES,
    RING_ALLGATHER_BYTES,
    Capabilities,
    Collective,
    Route,
    choose,
    hierarchical_wanted,
    through_leaders,
)

MiB = 1 << 20
_ALLREDUCE = Collective.ALLREDUCE
ONE_HOST = Capabilities(size=2, shared_bytes=4 * MiB, attach_below=64 * MiB, core_each=True)


@pytest.mark.parametrize(
    "collective",
    [Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLTOALL, Collective.ADASUM],
)
def test_collectives_other_than_the_reductions_always_go_as_messages(collective):
    for capabilities in (ONE_HOST, Capabilities(size=1), Capabilities(size=4, hierarchical=True)):
        assert choose(collective, 0, True, capabilities) is Route.MESSAGES
        assert choose(collective, 10 * MiB, True, capabilities) is Route.MESSAGES


def test_large_allgathers_across_hosts_take_the_message_ring():
    across = Capabilities(size=4, hierarchical=True, across_hosts=True)
    big = RING_ALLGATHER_BYTES
    assert choose(Collective.ALLGATHER, big, True, across) is Route.RING
    assert choose(Collective.ALLGATHER, big - 1, True, across) is Route.MESSAGES
    assert choose(Collective.ALLGATHER, big, True, ONE_HOST) is Route.MESSAGES
    for collective in (Collective.BROADCAST, Collective.ALLTOALL, Collective.ADASUM):
        assert choose(collective, big, True, across) is Route.MESSAGES


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.REDUCE_SCATTER])
def test_one_rank_or_no_bytes_stays_local(collective):
    assert choose(collective, 5 * MiB, True, Capabilities(size=1)) is Route.LOCAL
    assert choose(collective, 0, True, ONE_HOST) is Route.LOCAL
    assert choose(collective, 0, False, Capabilities(size=3, hierarchical=True)) is Route.LOCAL


def test_hierarchical_takes_allreduce_and_leaves_reduce_scatter_to_the_flat_ring():
    capabilities = Capabilities(size=4, hierarchical=True)
    assert choose(Collective.ALLREDUCE, 1, True, capabilities) is Route.HIERARCHICAL
    assert choose(Collective.REDUCE_SCATTER, 1, True, capabilities) is Route.MESSAGES


def test_large_hierarchical_calls_cross_through_the_hosts_first_ranks():
    assert LEADERS_FROM_BYTES == 8 * MiB
    assert through_leaders(8 * MiB) and through_leaders(64 * MiB)
    assert not through_leaders(8 * MiB - 1) and not through_leaders(0)


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.REDUCE_SCATTER])
def test_one_host_calls_take_shared_memory_then_the_attach_ring(collective):
    assert choose(collective, 1, True, ONE_HOST) is Route.SHARED
    assert choose(collective, ATTACH_ABOVE_BYTES, True, ONE_HOST) is Route.SHARED
    # Above 2 MiB, with a core per rank, calls that fit the regions read peers in place.
    assert choose(collective, ATTACH_ABOVE_BYTES + 1, True, ONE_HOST) is Route.ATTACH
    assert choose(collective, 4 * MiB + 1, True, ONE_HOST) is Route.ATTACH
    # Device or non-contiguous memory cannot be read by address.
    assert choose(collective, 3 * MiB, False, ONE_HOST) is Route.SHARED
    assert choose(collective, 5 * MiB, False, ONE_HOST) is Route.MESSAGES
    # Too many pieces for the attach ring's flags.
    assert choose(collective, 64 * MiB, True, ONE_HOST) is Route.MESSAGES
    assert choose(collective, 64 * MiB - 1, True, ONE_HOST) is Route.ATTACH


def test_ranks_that_share_cores_keep_calls_that_fit_in_shared_memory():
    shared_cores = Capabilities(size=4, shared_bytes=4 * MiB, attach_below=64 * MiB)
    assert choose(Collective.ALLREDUCE, 3 * MiB, True, shared_cores) is Route.SHARED
    assert choose(Collective.ALLREDUCE, 5 * MiB, True, shared_cores) is Route.ATTACH


def test_without_shared_memory_or_attach_everything_goes_as_messages():
    bare = Capabilities(size=3)
    assert choose(Collective.ALLREDUCE, 1, True, bare) is Route.MESSAGES
    no_attach = Capabilities(size=2, shared_bytes=4 * MiB)
    assert choose(Collective.ALLREDUCE, 3 * MiB, True, no_attach) is Route.SHARED
    assert choose(Collective.ALLREDUCE, 5 * MiB, True, no_attach) is Route.MESSAGES


def test_hierarchical_by_default_only_across_hosts_with_several_ranks_on_one():
    assert hierarchical_wanted(None, 2, 2)
    assert not hierarchical_wanted(None, 2, 1)  # one rank per host: the flat ring
    assert not hierarchical_wanted(None, 1, 4)  # one host
    assert hierarchical_wanted(True, 1, 4) and not hierarchical_wanted(False, 2, 2)


def test_a_compressed_allreduce_goes_where_it_crosses_a_link():
    # Flat: the message ring, never the host's shared-memory or attach rings.
    for nbytes in (1, ATTACH_ABOVE_BYTES + 1, 5 * MiB, 64 * MiB):
        assert choose(Collective.ALLREDUCE, nbytes, True, ONE_HOST, True) is Route.MESSAGES
    assert choose(Collective.ALLREDUCE, 1, True, Capabilities(size=3), True) is Route.MESSAGES
    # Hierarchical: its ring across hosts sends the 16-bit values.
    across = Capabilities(size=4, hierarchical=True)
    assert choose(Collective.ALLREDUCE, 1, True, across, True) is Route.HIERARCHICAL
    # Nothing to send: local, uncompressed.
    assert choose(Collective.ALLREDUCE, 0, True, ONE_HOST, True) is Route.LOCAL
    assert choose(Collective.ALLREDUCE, 8, True, Capabilities(size=1), True) is Route.LOCAL


def test_only_allreduce_is_compressed():
    with pytest.raises(ValueError, match="only allreduce sends 16-bit values.*reduce_scatter"):
        choose(Collective.REDUCE_SCATTER, 8, True, ONE_HOST, True)


def test_device_memory_is_staged_through_the_host_unless_nothing_crosses():
    for collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
        for capabilities in (ONE_HOST, Capabilities(size=4, hierarchical=True)):
            assert choose(collective, 8, False, capabilities, device=True) is Route.STAGED
        assert choose(collective, 0, False, ONE_HOST, device=True) is Route.LOCAL
        assert choose(collective, 8, False, Capabilities(size=1), device=True) is Route.LOCAL
    assert choose(Collective.ALLREDUCE, 8, False, ONE_HOST, True, True) is Route.STAGED


def test_device_allreduces_go_to_mpi_itself_where_every_rank_says_it_takes_device_memory():
    for capabilities in (Capabilities(size=2), Capabilities(size=4, hierarchical=True)):
        direct = dataclasses.replace(capabilities, device_mpi=True)
        assert choose(_ALLREDUCE, 8, False, direct, device=True) is Route.DEVICE
        # A compressed call narrows on the host, and a reduce-scatter is the ring's.
        assert choose(_ALLREDUCE, 8, False, direct, True, True) is Route.STAGED
        assert choose(Collective.REDUCE_SCATTER, 8, False, direct, device=True) is Route.STAGED
        assert choose(_ALLREDUCE, 0, False, direct, device=True) is Route.LOCAL
        assert choose(_ALLREDUCE, 8, True, direct) is choose(_ALLREDUCE, 8, True, capabilities)


@pytest.mark.parametrize(
    "collective",
    [Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLTOALL, Collective.ADASUM],
)
def test_only_reductions_take_device_memory(collective):
    with pytest.raises(ValueError, match=f"{collective.value} takes host memory only"):
        choose(collective, 8, False, ONE_HOST, device=True)


# The route object that carries each ``Route`` (as ``router.Transport`` builds them).
_CARRIERS = {
    Route.LOCAL: routes.LocalRoute,
    Route.MESSAGES: routes.MessagesRoute,
    Route.RING: routes.MessagesRoute,
    Route.SHARED: routes.SharedRoute,
    Route.ATTACH: routes.AttachRoute,
    Route.HIERARCHICAL: routes.HierarchicalRoute,
    Route.STAGED: routes.StagedRoute,
    Route.DEVICE: routes.DeviceRoute,
}


def test_every_route_the_rule_picks_declares_that_collective_and_that_memory():
    jobs = [
        ONE_HOST,
        Capabilities(size=1),
        Capabilities(size=3),
        Capabilities(size=2, shared_bytes=4 * MiB),
        Capabilities(size=4, hierarchical=True, across_hosts=True),
        Capabilities(size=4, across_hosts=True),
        Capabilities(size=2, device_mpi=True),
    ]
    picked = set()
    for capabilities, collective, nbytes, host, compressed, device in itertools.product(
        jobs, Collective, (0, 1, 3 * MiB, 5 * MiB, 64 * MiB), *[(False, True)] * 3
    ):
        reduces = collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER)
        if (device and (host or not reduces)) or (compressed and collective is not _ALLREDUCE):
            continue  # calls that are refused, or that cannot be
        route = choose(collective, nbytes, host, capabilities, compressed, device)
        carrier = _CARRIERS[route]
        assert collective in carrier.collectives, (route, collective)
        assert (Memory.DEVICE if device else Memory.HOST) in carrier.memory, (route, device)
        picked.add(route)
    assert picked == set(Route)
