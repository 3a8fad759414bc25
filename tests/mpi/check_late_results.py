"""Split hierarchical allreduce: results within a host whose receives are posted only at the end.

A rank posts the receive of a finished piece from its owner once its own input from the
same place has gone (``owners.Exchange.advance``), and that input goes only when the owner
takes it: timing decides whether that happens during the rings or after them. Here it is
always after them (as when the host's other ranks are a little late), so that each rank's
wait for its own results to go must not come before it posts the receives of the others'.
Pieces of 80 KiB: above Open MPI's shared-memory eager limit, a send completes only once
received. Run on pretend hosts of 2 (-np 4) and 3 (-np 6).
"""

import types

import numpy as np
from common import assert_equal, expected, main, pretend_hosts, rank_data
from mpi4py import MPI

import ringtrain
from ringtrain import settings
from ringtrain.buffers import BufferPool
from ringtrain.transport import owners
from ringtrain.transport.router import Transport

ADVANCE, FINISH = owners.Exchange.advance, owners.Exchange.finish


def _posts_only_at_the_end(exchange):
    exchange.advance = types.MethodType(ADVANCE, exchange)
    FINISH(exchange)


def body():
    owners.Exchange.advance = lambda exchange: False  # as if no input had gone yet
    owners.Exchange.finish = _posts_only_at_the_end
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    topology = pretend_hosts(comm, n // 2)
    chosen = settings.read(hierarchical_allreduce=True, collective_timeout=10)
    transport = Transport(comm, topology, chosen, BufferPool())
    for length in (20480 * n, 20480 * n + 3):
        data = [rank_data(k, (length,), np.float32, salt=length) for k in range(n)]
        got = np.empty(length, np.float32)
        transport.allreduce(data[r], got, ringtrain.Sum, 1.0)
        assert_equal(got, expected(ringtrain.Sum, data, np.float32), f"{length} on {n} ranks")
    transport.free()


main(body)
