"""The agreement tree: per cache id, the smallest count over each rank's subtree (no MPI)."""

import pytest

from ringtrain.engine.agreement import CountTree


def _trees(size, fan_out=2):
    return [CountTree(rank, size, fan_out) for rank in range(size)]


def _settle(trees):
    """Carry every rank's risen counts to its parent, leaves first; return rank 0's rises."""
    rises = []
    for tree in reversed(trees):
        risen = tree.risen()
        if tree.parent is None:
            rises += risen
        elif risen:
            trees[tree.parent].heard(trees.index(tree), risen)
    return rises


@pytest.mark.parametrize("fan_out", [2, 16])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 16, 17, 18, 300])
def test_the_tree_spans_every_rank_once_with_fan_out_children_at_most(size, fan_out):
    trees = _trees(size, fan_out)
    children = [c for tree in trees for c in tree.children]
    assert sorted(children) == list(range(1, size))
    assert all(trees[c].parent == p for p, tree in enumerate(trees) for c in tree.children)
    assert all(len(tree.children) <= fan_out for tree in trees)
    assert trees[0].parent is None
    assert (len(trees[0].children) == size - 1) is (size <= fan_out + 1)  # flat up to there


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_rank_0_sees_a_round_only_once_every_rank_counted_it(size):
    trees = _trees(size)
    for rank in range(size):
        assert trees[rank].submit(5) == 1
        assert _settle(trees) == ([(5, 1)] if rank == size - 1 else [])
    for rank in reversed(range(size)):  # the next round, in another order
        assert trees[rank].submit(5) == 2
    assert _settle(trees) == [(5, 2)]
    assert _settle(trees) == []  # nothing rose since


def test_counts_of_one_id_do_not_mix_with_another_and_late_ones_never_lower():
    parent, child = CountTree(0, 2), CountTree(1, 2)  # the default fan-out
    parent.submit(1)
    parent.submit(2)
    child.submit(2)
    parent.heard(1, child.risen())
    assert parent.risen() == [(2, 1)]
    parent.heard(1, [(2, 1), (1, 0)])  # late or repeated: counts only grow
    assert parent.risen() == []


def test_a_forgotten_id_rises_no_more_even_if_stale_counts_come():
    parent = CountTree(0, 2)
    parent.submit(3)
    parent.forget(3)
    parent.heard(1, [(3, 1)])  # sent before the eviction reached the child
    assert parent.risen() == []
