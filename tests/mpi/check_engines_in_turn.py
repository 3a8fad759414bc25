"""Engines in turn in one process: each one's results stay NumPy's, and none hangs.

An engine frees its communicators at shutdown, and MPI gives the next engine's the same
context ids. A control message that a rank sent after its last one (a heartbeat from the
waits of the shutdown) reached a later engine's channel as its own, out of its order, and
hung that engine: at -np 4 on pretend hosts of two, about one launch in two of four engines.
Here ``ENGINES`` engines run in turn, ``STEPS`` steps each, and each idles for a second
before its shutdown, as a job does after its last step, so that heartbeats go near the
shutdown: hierarchical on pretend hosts of two at -np 3 and 4, flat on this host at -np 2.
Each step is check_autotune's: named allreduces of lengths 0, 1 and uneven, a fused few
and one past the shared-memory calls, every rank its own data, checked against NumPy.
"""

import time

from check_autotune import run_step
from common import main, pretend_hosts
from mpi4py import MPI

from ringtrain import settings
from ringtrain.engine.core import Engine
from ringtrain.topology import discover

ENGINES, STEPS = 5, 6


def body():
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topology = discover(comm) if n == 2 else pretend_hosts(comm, 2)
    chosen = settings.read(hierarchical_allreduce=n > 2)
    for _ in range(ENGINES):
        engine = Engine.over(comm, chosen, topology)
        assert engine.transport.capabilities.hierarchical == (n > 2)
        for step in range(STEPS):
            run_step(engine, comm, step)
        time.sleep(1.0)  # idle engines beat every second
        engine.shutdown()


if __name__ == "__main__":
    main(body)
