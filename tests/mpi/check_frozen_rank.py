"""One rank freezes itself (SIGSTOP) at step 3 of an allreduce loop; every other rank reports.

Arguments: ``MODE VICTIM``. ``stop``: rank VICTIM freezes before it submits step 3;
``stop-mid``: a timer freezes it 20 ms into step 3's allreduce (4 MiB); ``stop-shutdown``:
it freezes after step 3, and the others shut down once they see it stopped (rank 0's engine
would otherwise answer their shutdown before it freezes). Each rank first prints its process id,
so that the test can check that none is left running, and each checks every result it gets
against NumPy. Each says so when its own call raises. Run with a short
RINGTRAIN_COLLECTIVE_TIMEOUT.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import ringtrain

mode, victim = sys.argv[1], int(sys.argv[2])
ringtrain.init()
r, n = ringtrain.rank(), ringtrain.size()
print(f"rank {r} pid {os.getpid()}", flush=True)
pids = ringtrain.allgather(np.array([os.getpid()]), name="pids")
pattern = (np.arange((1 << 20) + n) % 5).astype(np.float32)  # uneven: segments differ


def wait_until_stopped(pid, bound=30.0):
    """Return once process ``pid`` (on this host) is stopped; fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.01)
    raise AssertionError(f"rank {r}: process {pid} of rank {victim} did not stop in {bound} s")


def steps():
    for step in range(200):
        mine = pattern + (r + 1) * (step + 1)  # small whole numbers: the sums are exact
        # All ranks start the step's allreduce together, so the timer freezes one mid-transfer.
        ringtrain.allreduce(np.ones(1), name=f"start{step}")
        if step == 3 and r == victim and mode != "stop-shutdown":
            print(f"rank {r}: {mode} at {time.time():.3f}", flush=True)
            if mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        got = ringtrain.allreduce(mine, op=ringtrain.Sum, name=f"step{step}")
        if not np.array_equal(got, n * pattern + (step + 1) * n * (n + 1) // 2):
            raise AssertionError(f"rank {r}: step {step} reduced wrong")
        if step == 3 and mode == "stop-shutdown":
            if r == victim:
                print(f"rank {r}: {mode} at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                wait_until_stopped(int(pids[victim]))
            ringtrain.shutdown()
            return


try:
    steps()
except ringtrain.CollectiveTimeoutError as err:
    print(f"rank {r} raised CollectiveTimeoutError: {err}", flush=True)
    raise
print(f"rank {r}: all steps done, though rank {victim} froze", flush=True)
