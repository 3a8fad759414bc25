"""The result pool: aligned arrays whose memory is reused only once nothing refers to it."""

import numpy as np

from ringtrain.buffers import ALIGNMENT
from ringtrain.engine.results import ResultPool


def test_memory_comes_back_only_once_every_view_of_it_is_gone():
    pool = ResultPool(smallest=1000, capacity=1 << 20)
    first = pool.empty(1000, np.float32)
    address = first.ctypes.data
    second = pool.empty(1000, np.float32)
    assert second.ctypes.data != address  # the first is still held
    part = first[10:20].reshape(2, 5)
    del first
    third = pool.empty((10, 100), np.float32)
    assert not np.shares_memory(third, part)  # a view keeps the memory busy
    del part
    again = pool.empty((250, 4), np.float32)
    assert again.ctypes.data == address
    assert again.shape == (250, 4) and again.dtype == np.float32


def test_results_are_aligned_of_every_shape_and_dtype():
    pool = ResultPool(smallest=0, capacity=1 << 20)
    for shape, dtype in [(0, np.float32), (1, np.int8), (7, np.float64), ((3, 5), np.int64)]:
        array = pool.empty(shape, dtype)
        assert array.shape == (shape if isinstance(shape, tuple) else (shape,))
        assert array.dtype == dtype
        assert array.size == 0 or array.ctypes.data % ALIGNMENT == 0  # no data, no address


def test_small_results_and_those_past_the_capacity_are_not_kept():
    block = 4000 + ALIGNMENT  # what a pooled result of 1000 float32 takes
    pool = ResultPool(smallest=4000, capacity=2 * block + 100)
    small = pool.empty(100, np.float32)  # 400 bytes: below the pooled size
    assert pool.held_bytes == 0
    kept = [pool.empty(1000, np.float32) for _ in range(2)]
    assert pool.held_bytes == 2 * block
    extra = pool.empty(1000, np.float32)  # no room, and nothing idle to let go of
    assert pool.held_bytes == 2 * block
    assert not any(np.shares_memory(extra, k) for k in kept + [small])


def test_a_result_past_the_capacity_is_kept_while_the_pool_keeps_nothing_else():
    pool = ResultPool(smallest=0, capacity=1000)
    big = pool.empty(1000, np.float32)  # 4000 bytes: past the capacity, but the pool is empty
    assert pool.held_bytes == 4000 + ALIGNMENT
    other = pool.empty(1000, np.float32)  # the first is still held: this one is not kept
    assert pool.held_bytes == 4000 + ALIGNMENT and not np.shares_memory(big, other)
    address = big.ctypes.data
    del big
    again = pool.empty(1000, np.float32)
    assert again.ctypes.data == address


def test_idle_memory_makes_room_for_other_sizes_least_recently_used_first():
    block = 4000 + ALIGNMENT
    pool = ResultPool(smallest=0, capacity=3 * block)
    a, b, c = (pool.empty(1000, np.float32) for _ in range(3))
    b_address = b.ctypes.data
    del a, b
    d = pool.empty(250, np.float64)  # 2000 bytes: a's memory goes to make room, b's stays
    assert pool.held_bytes == 2 * block + 2000 + ALIGNMENT
    e = pool.empty(1000, np.float32)
    assert e.ctypes.data == b_address
    assert not np.shares_memory(d, c) and not np.shares_memory(e, c)
