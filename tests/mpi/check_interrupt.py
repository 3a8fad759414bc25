"""Ctrl-C in a loop of blocking calls ends the job, whether or not it lands inside a turn.

Each rank sends itself SIGINT after a second of 64 MiB allreduces.
"""

import os
import signal
import sys
import threading

import numpy as np

import ringtrain

ringtrain.init()
r = ringtrain.rank()
data = np.ones(16 << 20, np.float32)
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    while True:
        ringtrain.allreduce(data, name="big", op=ringtrain.Sum)
except KeyboardInterrupt:
    print(f"rank {r}: interrupted between turns", flush=True)
    sys.exit(3)
