"""The process-set registry's bookkeeping, seen from a rank outside every set (no MPI)."""

import pytest

from ringtrain.process_sets import ProcessSet, ProcessSetRegistry, global_process_set

OUTSIDE = 9  # this rank is in none of the sets below, so it holds no engine or communicator


def registry_of(*rank_lists):
    registry = ProcessSetRegistry()
    sets = [ProcessSet(ranks) for ranks in rank_lists]
    for process_set in sets:
        registry.add(process_set, OUTSIDE, None, None)
    return registry, sets


def test_sets_get_ids_in_order_of_addition_and_are_found_by_them():
    registry, sets = registry_of([0, 1], [2, 3], [1])
    assert [s.process_set_id for s in sets] == [1, 2, 3]
    assert registry.added == 3
    assert [registry.by_id(i) for i in (1, 2, 3)] == sets
    assert registry.by_id(0) is global_process_set
    with pytest.raises(ValueError, match=r"no process set has id 4; registered: \[0, 1, 2, 3\]"):
        registry.by_id(4)


def test_a_set_is_found_by_its_exact_ranks_and_held_as_itself():
    registry, (pair, _) = registry_of([1, 0], [2, 3])
    assert registry.with_ranks([0, 1]) is pair
    assert registry.with_ranks([0]) is None
    assert registry.holds(pair)
    assert not registry.holds(ProcessSet([0, 1]))  # the same ranks, not registered
    assert not registry.holds(global_process_set)
    assert pair.included() is False and pair.rank() is None and pair.engine is None


def test_removal_forgets_a_set_and_ids_are_never_reused():
    registry, (first, second) = registry_of([0], [1])
    assert [registry.begin_removal(), registry.begin_removal()] == [0, 1]
    registry.remove(first)
    assert first.process_set_id is None and first.size() is None
    assert not registry.holds(first) and registry.with_ranks([0]) is None
    again = ProcessSet([0])
    registry.add(again, OUTSIDE, None, None)
    assert again.process_set_id == 3
    with pytest.raises(ValueError, match=r"registered: \[0, 2, 3\]"):
        registry.by_id(1)
    registry.clear()
    assert second.process_set_id is None and again.process_set_id is None
    with pytest.raises(ValueError, match=r"registered: \[0\]"):
        registry.by_id(2)
