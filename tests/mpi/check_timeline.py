"""Writes a timeline while reducing a few tensors and bursts of many; the test reads it back."""

import numpy as np
from common import main

import ringtrain


def body():
    ringtrain.init()
    handles = [
        ringtrain.allreduce_async(np.ones(1000 * (i + 1), np.float32), name=f"layer{i}")
        for i in range(4)
    ]
    for h in handles:
        ringtrain.synchronize(h)
    ringtrain.allgather(np.ones((2, 2)), name="gathered")
    burst = [ringtrain.allreduce_async(np.ones(100, np.float32), name=f"t{i}") for i in range(60)]
    for h in burst:
        ringtrain.synchronize(h)
    # Eight tensors of 400 bytes and two of 8000 among them, submitted together.
    sizes = {"s0": 100, "s1": 100, "b0": 2000, "s2": 100, "s3": 100, "s4": 100, "b1": 2000}
    sizes.update({"s5": 100, "s6": 100, "s7": 100})
    mixed = [
        ringtrain.allreduce_async(np.ones(size, np.float32), name=name)
        for name, size in sizes.items()
    ]
    for h in mixed:
        ringtrain.synchronize(h)
    ringtrain.shutdown()


main(body)
