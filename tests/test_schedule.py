"""The ring schedule, simulated for every rank in one process (no MPI)."""

import numpy as np
import pytest

from ringtrain.transport import schedule


@pytest.mark.parametrize("length", [0, 1, 5, 7, 64, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5, 8])
def test_segment_bounds_cover_length_evenly(length, parts):
    bounds = schedule.segment_bounds(length, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    sizes = [hi - lo for lo, hi in bounds]
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(parts - 1))
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra elements go to the first segments


def test_segment_bounds_in_units_and_errors():
    assert schedule.segment_bounds(12, 3, unit=3) == [(0, 6), (6, 9), (9, 12)]
    with pytest.raises(ValueError, match="units of 5"):
        schedule.segment_bounds(12, 3, unit=5)
    with pytest.raises(ValueError, match="parts must be >= 1"):
        schedule.segment_bounds(3, 0)


def test_ring_steps_reject_bad_rank():
    with pytest.raises(ValueError, match="rank 4 is outside a world of size 4"):
        schedule.ring_steps(4, 4)


def test_chunks():
    assert schedule.chunks(3, 10, 4) == [(3, 7), (7, 10)]
    assert schedule.chunks(5, 5, 4) == []


def _simulate(size, length, allgather=True):
    """Run every rank's steps in lock step; return per-rank buffers and contribution sets."""
    bounds = schedule.segment_bounds(length, size)
    # contributions[r][i] = set of ranks whose value element i of rank r's buffer includes
    data = [np.full(length, 1 << r, dtype=np.int64) for r in range(size)]
    contributions = [[{r} for _ in range(length)] for r in range(size)]
    steps = [schedule.ring_steps(r, size, allgather) for r in range(size)]
    for t in range(len(steps[0])):
        sent = []
        for r in range(size):
            lo, hi = bounds[steps[r][t].send]
            sent.append((data[r][lo:hi].copy(), [set(c) for c in contributions[r][lo:hi]]))
        for r in range(size):
            step = steps[r][t]
            left = (r - 1) % size
            assert steps[left][t].send == step.recv, "left neighbour sends what r receives"
            values, contrib = sent[left]
            lo, hi = bounds[step.recv]
            for i in range(hi - lo):
                if step.reduce:
                    assert not contrib[i] & contributions[r][lo + i], "element reduced twice"
                    data[r][lo + i] += values[i]
                    contributions[r][lo + i] |= contrib[i]
                else:
                    data[r][lo + i] = values[i]
                    contributions[r][lo + i] = set(contrib[i])
    return data, contributions, bounds


@pytest.mark.parametrize("size", range(1, 9))
@pytest.mark.parametrize("length", [0, 1, 3, 7, 16, 29])
def test_simulated_allreduce_reduces_each_element_once_everywhere(size, length):
    data, contributions, _ = _simulate(size, length)
    everyone = (1 << size) - 1
    for r in range(size):
        assert all(c == set(range(size)) for c in contributions[r])
        assert np.all(data[r] == everyone)


@pytest.mark.parametrize("size", range(1, 9))
@pytest.mark.parametrize("length", [0, 1, 7, 29])
def test_simulated_reduce_scatter_leaves_rank_r_with_segment_r(size, length):
    data, contributions, bounds = _simulate(size, length, allgather=False)
    for r in range(size):
        lo, hi = bounds[r]
        assert all(c == set(range(size)) for c in contributions[r][lo:hi])
        assert np.all(data[r][lo:hi] == (1 << size) - 1)


@pytest.mark.parametrize("size", range(2, 9))
def test_each_step_moves_one_segment_so_traffic_is_2_n_minus_1_over_n(size):
    length = size * 10
    bounds = schedule.segment_bounds(length, size)
    for r in range(size):
        moved = sum(bounds[s.send][1] - bounds[s.send][0] for s in schedule.ring_steps(r, size))
        assert moved == 2 * (size - 1) * length // size


@pytest.mark.parametrize("size", range(1, 9))
def test_outputs_pass_each_segment_round_and_end_with_the_rank_s_own(size):
    outputs = schedule.outputs(size)
    for q in range(size):
        assert sorted(outputs[q]) == list(range(size))  # every segment once
        assert outputs[q][-1] == q  # finishes its own
        left = outputs[(q - 1) % size]
        # What the left neighbour produced as output t is what this rank reduces next.
        assert outputs[q][1:] == left[:-1]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize(("length", "chunk"), [(0, 4), (1, 4), (23, 4), (23, 100)])
def test_a_ring_reads_each_input_piece_once_and_ends_each_output_piece_once(size, length, chunk):
    bounds = schedule.segment_bounds(length, size)
    for rank in range(size):
        steps = schedule.ring_steps(rank, size)
        first, recvs = schedule.ring_pieces(steps, bounds, chunk)
        assert first == schedule.chunks(*bounds[steps[0].send], chunk)
        reads = schedule.input_reads(rank, size, bounds, chunk)
        outputs = schedule.output_order(rank, size, bounds, chunk)
        for pieces in (reads, outputs):
            covered = np.zeros(length, int)
            for lo, hi in pieces:
                assert 0 < hi - lo <= chunk
                covered[lo:hi] += 1
            assert (covered == 1).all(), (rank, pieces)
        # The reads start with the first sends, then follow the receives that reduce; the
        # outputs start with this rank's own segment, finished at the last reduce step.
        assert reads[: len(first)] == first
        own = schedule.chunks(*bounds[rank], chunk)
        assert outputs[: len(own)] == own
        assert sorted(reads) == sorted(outputs)
