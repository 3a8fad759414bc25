"""Ranks allreduce in a loop while one rank's host stops answering at a chosen step.

Usage: ``stalled_peer.py MODE RANK STEPS MIB``: every rank allreduces MIB MiB of rank-distinct
float32 data STEPS times, checking each result against NumPy; at step 3 rank RANK's host
stops answering: MODE ``stop`` (the rank freezes itself with SIGSTOP before it submits
step 3), ``stop-mid`` (a timer freezes it 20 ms into step 3's allreduce), ``down`` (its
host's link goes down), ``drop`` (every packet it sends is dropped), or ``none``.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

import ringtrain

FAULTS = {
    "down": ["ip", "link", "set", "eth0", "down"],
    # Every packet the host sends is dropped (as `tc netem loss 100%` would, on kernels that
    # have netem): its connected route becomes a black hole.
    "drop": ["ip", "route", "replace", "blackhole", "10.231.0.0/24"],
}


def main() -> None:
    """Allreduce in a loop; break the chosen rank's host at step 3."""
    mode, victim, steps, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ringtrain.init()
    rank, size = ringtrain.rank(), ringtrain.size()
    count = mib * (1 << 18) + 3  # uneven: the ring's segments differ by one element
    for step in range(steps):
        if step == 3 and rank == victim and mode != "none":
            print(f"rank {rank} on {socket.gethostname()}: {mode} at {time.time():.3f}", flush=True)
            if mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif mode == "stop-mid":
                threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGSTOP)).start()
            else:
                # The line above reaches mpirun through this host's daemon, over the link
                # that the fault cuts: give it time to leave first.
                time.sleep(0.5)
                subprocess.run(FAULTS[mode], check=True)
        mine = np.random.default_rng(rank * 1000 + step).random(count, dtype=np.float32)
        got = ringtrain.allreduce(mine, op=ringtrain.Sum, name=f"step{step}")
        want = sum(
            np.random.default_rng(q * 1000 + step)
            .random(count, dtype=np.float32)
            .astype(np.float64)
            for q in range(size)
        )
        if not np.allclose(got, want, rtol=1e-5):
            raise AssertionError(f"rank {rank}: step {step} reduced wrong")
    print(f"rank {rank} on {socket.gethostname()}: all {steps} steps right", flush=True)
    ringtrain.shutdown()


if __name__ == "__main__":
    main()
