"""Open MPI settings that each rank defaults before MPI starts: what ringtrain's rings need.

Open MPI's TCP transport sends a message above its eager limit (64 KiB) only after the
receiver's answer has come back, and that answer waits behind the data queued the other
way, which a ring keeps full. So a ring's chunks are sent eagerly: the limit is raised to
hold one chunk. Between two hosts at 1 Gbit/s that took a 16 MiB fp16 allreduce from
81 to 70 ms, and 2 hosts x 2 ranks from 161 to 145 ms (docs/benchmarks.md, "Chunks sent
eagerly"). A value the user gives (``--mca btl_tcp_eager_limit``, or the variable) wins.
"""

import os
import sys

EAGER_LIMIT_VARIABLE = "OMPI_MCA_btl_tcp_eager_limit"
OPEN_MPI_EAGER_LIMIT = 64 << 10  # Open MPI 5's own default
_HEADER_BYTES = 1024  # Open MPI's headers, which the limit counts, with room to spare


def tcp_eager_limit(chunk_bytes: int) -> int:
    """Return the TCP eager limit under which a ring chunk of ``chunk_bytes`` goes eagerly."""
    return max(OPEN_MPI_EAGER_LIMIT, chunk_bytes + _HEADER_BYTES)


def apply(chunk_bytes: int, environ=os.environ) -> bool:
    """Default this process's TCP eager limit for ``chunk_bytes`` chunks; return True if set.

    Only before MPI starts (mpi4py.MPI not yet imported), and only where the user set none.
    """
    if "mpi4py.MPI" in sys.modules or EAGER_LIMIT_VARIABLE in environ:
        return False
    environ[EAGER_LIMIT_VARIABLE] = str(tcp_eager_limit(chunk_bytes))
    return True
