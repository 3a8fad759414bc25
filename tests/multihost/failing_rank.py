"""One rank fails in a chosen way while the other ranks wait for it in a collective.

Usage: ``failing_rank.py MODE RANK [STATUS]`` with MODE ``none`` (nobody fails), ``raise``,
``exit`` (``sys.exit(STATUS)``), ``kill`` (SIGKILL) or ``segv`` (a segmentation fault).
"""

import ctypes
import os
import signal
import socket
import sys

from mpi4py import MPI


def main() -> None:
    """Fail on the chosen rank; on the others, wait for it in an allreduce."""
    mode, victim = sys.argv[1], int(sys.argv[2])
    comm = MPI.COMM_WORLD
    # Connect every pair first (Open MPI connects lazily), so that the peers of a killed rank
    # notice it at once: the launcher must still report the killed rank, not them.
    comm.alltoall(list(range(comm.Get_size())))
    if comm.Get_rank() == victim:
        _fail(mode, int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    total = comm.allreduce(comm.Get_rank())
    print(f"rank {comm.Get_rank()} on {socket.gethostname()} finished, sum {total}", flush=True)


def _fail(mode, status):
    if mode == "raise":
        raise RuntimeError("failing on purpose")
    if mode == "exit":
        sys.exit(status)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segv":
        ctypes.string_at(0)
    if mode != "none":
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
