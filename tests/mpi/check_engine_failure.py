"""A failure while running a response ends the job with a message, whichever thread ran it.

Argument: ``caller`` (a blocking call, whose caller takes the engine's turns) or ``engine``
(an async call polled until done, which the engine thread runs). The last rank's transport
raises for the tensor "boom", which that rank submits last (the transport's method is
wrapped, MPI is not); no rank may hang.
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
    transport = runtime.current().engine.transport
    allreduce_new = transport.allreduce_new
    calls = []

    def failing(*args):
        calls.append(None)
        if len(calls) == 2:  # "boom", after "fine"
            raise RuntimeError(f"rank {r} fails on purpose")
        return allreduce_new(*args)

    transport.allreduce_new = failing

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
