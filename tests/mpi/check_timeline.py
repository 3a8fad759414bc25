"""Writes a timeline while reducing a few tensors and a burst of 60; the test reads it back."""

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
    ringtrain.shutdown()


main(body)
