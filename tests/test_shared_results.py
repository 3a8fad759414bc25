"""The result area's bookkeeping, in one process: places, and what a held result blocks."""

import gc
import mmap

import numpy as np

from ringtrain.transport.results import SharedResults


def _area(nbytes=1024):
    return SharedResults(memoryview(mmap.mmap(-1, nbytes)))


def test_places_follow_each_other_aligned_and_wrap_to_the_start():
    area = _area(1024)
    assert [area.place(n) for n in (100, 1, 64, 500)] == [0, 128, 192, 256]
    assert area.place(300) == 0  # 256 + 512 leaves 256 bytes: the next goes to the start
    assert area.place(1024) == 0
    assert area.place(0) is None and area.place(1025) is None


def test_a_result_blocks_its_place_while_any_view_of_it_lives():
    area = _area(1024)
    result = area.take(64, 10, np.float32)
    result[:] = np.arange(10)
    part = result[3:5]
    shaped = result.reshape(2, 5)
    del result
    gc.collect()
    assert not area.free_here(64, 40) and not area.free_here(100, 4)
    assert area.free_here(0, 64) and area.free_here(104, 100)
    del part
    gc.collect()
    assert not area.free_here(64, 40)  # the reshaped view still holds it
    assert shaped[1, 0] == 5
    del shaped
    gc.collect()
    assert area.free_here(64, 40) and area.free_here(0, 1024)
