"""A failure while running a response ends the job with a message, whichever thread ran it.

Argument: ``caller`` (a blocking call, whose caller takes the engine's turns) or ``engine``
(an async call polled until done, which the engine thread runs). The last rank's executor
raises for the tensor "boom", which that rank submits last (the executor is wrapped, MPI is
not); no rank may hang.
"""

import sys
import time

import numpy as np

import ringtrain
from ringtrain import runtime

mode = sys.argv[1]
ringtrain.init()
r, n = ringtrain.rank(), ringtrain.size()
if r == n - 1:
    run = runtime.current().engine._executor.run

    def failing(response, requests):
        if "boom" in response.names:
            raise RuntimeError(f"rank {r} fails on purpose")
        return run(response, requests)

    runtime.current().engine._executor.run = failing

ringtrain.allreduce(np.ones(5), name="fine")
if r == n - 1:
    time.sleep(0.3)  # the others have submitted and wait: the response comes at once
if mode == "caller":
    ringtrain.allreduce(np.ones(5), name="boom")
else:
    handle = ringtrain.allreduce_async(np.ones(5), name="boom")
    while not ringtrain.poll(handle):
        time.sleep(0.01)
    ringtrain.synchronize(handle)
print(f"rank {r}: returned from a call that failed elsewhere", flush=True)
