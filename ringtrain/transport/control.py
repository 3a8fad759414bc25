"""The engine's control channel: small pickled messages between the ranks and rank 0.

Each rank sends its new submissions (metas, never tensor data) to the coordinator, rank 0,
which sends every other rank the same ordered responses; the rounds that agree on cached
tensors (``engine.rounds``) are non-blocking bitwise-AND allreduces among all ranks. All of
it runs on a private duplicate of the engine's communicator, apart from the tensor data's,
and every send is non-blocking: the engine polls for what has arrived and never waits here,
except at ``finish`` and ``close``, whose waits go through the transport's ``Waiter``: a
peer frozen during shutdown fails them with an error that names it, instead of hanging. A
rank that finds a peer lost tells every other rank on it too (``tell_lost``), rank 0 or not,
before it ends the job.
"""

import pickle

import numpy as np
from mpi4py import MPI

_TAG_REQUEST = 11
_TAG_RESPONSE = 12
_TAG_LOST = 13


class ControlChannel:
    """One rank's end of the control channel over a duplicate of ``comm`` (collective)."""

    def __init__(self, comm: MPI.Comm, waiter):
        self._comm = comm.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._waiter = waiter  # ``progress.Waiter`` over ``comm``'s ranks
        self._sends: list[MPI.Request] = []
        self._status = MPI.Status()  # reused by every probe

    def submit(self, entries) -> None:
        """Send ``entries`` (a list of metas, withdrawals, suspects...) to the coordinator."""
        send = self._comm.isend(entries, 0, _TAG_REQUEST)
        self._settle_sends()  # after the send: it waits for nothing older
        self._sends.append(send)

    def submissions(self):
        """Return (rank, entries) for every submission that has reached the coordinator."""
        comm, status = self._comm, self._status
        message = comm.improbe(MPI.ANY_SOURCE, _TAG_REQUEST, status)
        if message is None:
            return ()  # the common empty turn, without a list to make
        received = []
        while message is not None:
            received.append((status.Get_source(), message.recv()))
            message = comm.improbe(MPI.ANY_SOURCE, _TAG_REQUEST, status)
        return received

    def respond(self, wire) -> None:
        """Send ``wire`` (responses in their wire form) to every other rank, pickled once."""
        payload = pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)
        sends = [self._comm.isend(payload, dest, _TAG_RESPONSE) for dest in range(1, self.size)]
        self._settle_sends()  # after the sends: they wait for nothing older
        self._sends += sends

    def responses(self):
        """Return the wire forms of every response that has reached this rank, in order."""
        message = self._comm.improbe(0, _TAG_RESPONSE)
        if message is None:
            return ()  # the common empty turn, without a list to make
        received = []
        while message is not None:
            received.append(pickle.loads(message.recv()))
            message = self._comm.improbe(0, _TAG_RESPONSE)
        return received

    def start_and(self, vector) -> "RoundRequest":
        """Start the bitwise AND of every rank's ``vector`` (uint64); return its request."""
        result = np.empty_like(vector)
        return RoundRequest(self._comm.Iallreduce(vector, result, op=MPI.BAND), result)

    def tell_lost(self, notice, ranks) -> list[MPI.Request]:
        """Send ``notice`` (a ``progress.LostNotice``) to each of ``ranks``; return the sends."""
        payload = pickle.dumps(notice, protocol=pickle.HIGHEST_PROTOCOL)
        return [self._comm.isend(payload, dest, _TAG_LOST) for dest in ranks]

    def lost_notices(self) -> list:
        """Return the ``LostNotice``s that other ranks have sent this one since the last call."""
        received = []
        message = self._comm.improbe(MPI.ANY_SOURCE, _TAG_LOST)
        while message is not None:
            received.append(pickle.loads(message.recv()))
            message = self._comm.improbe(MPI.ANY_SOURCE, _TAG_LOST)
        return received

    def _settle_sends(self) -> None:
        """Forget the sends that have completed (at each new one: the list stays short)."""
        if self._sends:
            self._sends = [r for r in self._sends if not r.Test()]

    def finish(self, last) -> None:
        """Leave no control message unmatched, so a freed communicator carries nothing stale.

        A message left in flight on a freed communicator can corrupt the next communicator
        that MPI builds with the same context id. Each rank sends the coordinator ``last``
        after all its other messages, and the coordinator drains submissions until it has
        every rank's. So nothing may be sent after ``last``, nor by the coordinator after its
        STOP response: the engine's sides beat no more from then on (``engine.sides``). The
        engine completes its last agreement round before (``Engine._last_round``).
        """
        if self.rank != 0:
            self._sends.append(self._comm.isend(last, 0, _TAG_REQUEST))
        else:
            self._drain(_TAG_REQUEST, range(1, self.size), last, "each rank's last submission")

    def _drain(self, tag, sources, last, what) -> None:
        """Receive ``tag`` messages until every one of ``sources`` has sent ``last``."""
        status, arrived = MPI.Status(), [None]  # the message found by the last probe

        def message_in():
            arrived[0] = self._comm.improbe(MPI.ANY_SOURCE, tag, status)
            return arrived[0] is not None

        waiting = set(sources)
        what = f"the engine's shutdown ({what})"
        while waiting:
            self._waiter.until(message_in, sorted(waiting), what)
            if arrived[0].recv() == last:
                waiting.discard(status.Get_source())

    def close(self) -> None:
        """Wait for this rank's sends (all matched after ``finish``) and free the channel."""
        peers = set(range(1, self.size) if self.rank == 0 else [0])
        what = "the engine's shutdown (this rank's last control messages)"
        self._waiter.wait_all(self._sends, sorted(peers), what)
        self._comm.Free()

    def abort(self, status: int) -> None:
        """End the whole job with ``status`` (Open MPI ends every process, not this group)."""
        self._comm.Abort(status)


class RoundRequest:
    """An agreement round's AND in flight: ``test()`` returns its result once it is in."""

    __slots__ = ("_request", "_result")

    def __init__(self, request, result):
        self._request = request
        self._result = result

    def test(self):
        """Return the AND of every rank's vector if the round is complete, else None."""
        return self._result if self._request.Test() else None
