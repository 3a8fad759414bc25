"""After ``init()``, Open MPI sends a ring chunk over TCP eagerly: before its receive is posted.

Run with TCP alone (``OMPI_MCA_btl=tcp,self``) at 2 ranks. Rank 0 sends one chunk, and
rank 1 posts its receive only once rank 0 has seen that send complete. Above the eager limit
the send could not complete first: Open MPI would wait for the receive. argv[1]: "eager" or
"default" (the user's own limit, Open MPI's 64 KiB, must win: the send then waits). It
imports nothing that imports mpi4py.MPI before ``init()``, as a user's script would not, and
not ``common``, which sets the limit itself and would hide whether ``init()`` did.
"""

import os
import sys
import time
import traceback

import numpy as np

import ringtrain
from ringtrain.api import active_settings
from ringtrain.mpi_tuning import EAGER_LIMIT_VARIABLE, tcp_eager_limit

_SECONDS = 5.0


def body():
    ringtrain.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.Get_size() == 2, "run at 2 ranks"
    expect_eager = sys.argv[1] == "eager"
    chunk = np.arange(active_settings().ring_chunk_bytes // 4, dtype=np.float32)
    if expect_eager:
        assert os.environ[EAGER_LIMIT_VARIABLE] == str(tcp_eager_limit(chunk.nbytes))
    if comm.Get_rank() == 0:
        request = comm.Isend(chunk, 1, tag=1)
        deadline = time.monotonic() + _SECONDS
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
        done = request.Test()
        comm.send(done, 1, tag=2)
        request.Wait()
        assert done == expect_eager, f"the chunk's send completed early: {done}"
    else:
        done = comm.recv(source=0, tag=2)
        received = np.empty_like(chunk)
        comm.Recv(received, 0, tag=1)
        assert np.array_equal(received, chunk)
    ringtrain.shutdown()


try:
    body()
except BaseException:
    sys.stderr.write(f"FAILED\n{traceback.format_exc()}")
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(1)
