"""The last rank raises without submitting; the others, waiting in an allreduce, must not hang."""

import numpy as np

import ringtrain

ringtrain.init()
r, n = ringtrain.rank(), ringtrain.size()
if r == n - 1:
    raise RuntimeError(f"rank {r} fails on purpose")
try:
    ringtrain.allreduce(np.ones(4), name="never")
except ringtrain.EngineStoppedError as err:
    print(f"rank {r}: EngineStoppedError: {err}", flush=True)
