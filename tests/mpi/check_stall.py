"""A tensor that one rank never submits: warning on rank 0, then StallError everywhere."""

import sys

import numpy as np
from common import main

import ringtrain


def body():
    ringtrain.init(stall_check_seconds=1.0, stall_shutdown_seconds=float(sys.argv[1]))
    r, n = ringtrain.rank(), ringtrain.size()
    handle = ringtrain.allreduce_async(np.ones(3), name="lonely") if r != n - 1 else None
    if r == n - 1:
        other = ringtrain.allreduce_async(np.ones(3), name="other")
        handle = other
    try:
        ringtrain.synchronize(handle)
    except ringtrain.StallError as err:
        print(f"rank {r}: StallError: {err}", flush=True)
    else:
        raise AssertionError("synchronize returned; expected StallError")
    try:
        ringtrain.allreduce(np.ones(1))
    except ringtrain.EngineStoppedError as err:
        print(f"rank {r}: then EngineStoppedError: {err}", flush=True)
    ringtrain.shutdown()


main(body)
