"""The two sides of negotiation behind one interface: the coordinator's (rank 0) and a worker's.

An engine holds one side, chosen once by its rank, and never asks its rank again: the side
hands this rank's submissions to the coordinator, returns the batches of responses this
rank must run (each tagged with the agreement round it follows, ``engine.rounds``), counts
them, beats, and says whom this rank waits for and which of them has fallen silent.
"""

import sys
import time

from ringtrain.engine import messages

# The coordinator looks for stalled tensors and drifted unnamed calls this often (seconds).
_CHECK_EVERY = 1.0


class _Side:
    """What both sides share: the batches counted and the end of the channel.

    ``rounds`` (``engine.rounds.Rounds``): the number of rounds it has started tags each
    batch that rank 0 sends. ``batches``: the batches sent (rank 0) or received (the rest),
    heartbeats included, which a round's word 0 is compared with.
    """

    def __init__(self, channel, liveness, rounds):
        self._channel = channel
        self._liveness = liveness
        self._rounds = rounds
        self.batches = 0
        # This rank has sent its last control message: it beats no more (``finish``).
        self._ended = False

    def finish(self, last) -> None:
        """Leave no control message unmatched before the channel is freed (``finish``).

        No heartbeat follows ``last``, not even from the waits of the drain: a message sent
        after it is never received, and a later engine's channel, given the freed one's
        context id by MPI, would take it for its own and lose its order.
        """
        self._ended = True
        self._channel.finish(last)

    def round_ran(self, batches: int) -> None:
        """Note that a round ran whose word 0 was rank 0's ``batches``: only rank 0 cares."""


class CoordinatorSide(_Side):
    """Rank 0: its submissions go straight to the ``Coordinator``, which answers every rank.

    With a ``tuner`` (``engine.tuning.tuner.Tuner``), the allreduces this rank runs feed
    it, and the settings it picks go to every rank ahead of the next responses.
    ``cache_capacity`` is the cache's size where the tuner turns it on.
    """

    def __init__(
        self,
        coordinator,
        channel,
        liveness,
        rounds,
        clock=time.monotonic,
        tuner=None,
        cache_capacity=0,
    ):
        super().__init__(channel, liveness, rounds)
        self.coordinator = coordinator
        self._clock = clock
        self._next_check = 0.0
        self._tuner = tuner
        self._cache_capacity = cache_capacity
        self._switch: dict | None = None  # settings the tuner picked, to send
        # (batch number, slots) of each batch that evicted ids, until every rank has run it.
        self._cooling: list[tuple[int, list[int]]] = []

    def ran(self, requests) -> None:
        """Give the tuner, while it runs, an allreduce of this rank's ``requests``."""
        tuner = self._tuner
        if tuner is None:
            return
        metas = [request.meta for request in requests if request is not None]
        try:
            values = tuner.ran(metas) if metas else None
        except Exception as err:  # noqa: BLE001 - a failed tuner must not end the job
            sys.stderr.write(
                f"ringtrain: warning: autotune stopped ({err!r}); every rank goes back to the "
                "settings it started with\n"
            )
            values, tuner.done = dict(tuner.start), True
        if tuner.done:
            self._tuner = None
        if values is not None:
            self._switch = values

    def switch(self, values) -> None:
        """Have every rank run under ``values`` (every tunable field) from the next responses."""
        self._switch = dict(values)

    def send(self, entries) -> None:
        """Hand this rank's ``entries`` (metas, withdrawals...) to the coordinator."""
        self.coordinator.add(0, entries)

    def round_ran(self, batches: int) -> None:
        """Free the slots evicted in batches before ``batches``: every rank has run those."""
        cooling = self._cooling
        while cooling and cooling[0][0] < batches:
            self.coordinator.free(cooling.pop(0)[1])

    def receive(self) -> list:
        """Take every rank's submissions, decide, send the responses; return [(tag, them)].

        The tag is the rounds this rank has started: every rank runs the batch after them.
        """
        coordinator = self.coordinator
        tuned = self._switch
        if tuned is not None:  # planned from here on with the new settings, on every rank
            self._switch = None
            capacity = self._cache_capacity if tuned["response_cache"] else 0
            coordinator.retune(tuned["fusion_threshold"], capacity)
        for source, entries in self._channel.submissions():
            self._liveness.heard(source)
            coordinator.add(source, entries)
        responses = coordinator.responses()
        if tuned is not None:
            responses.insert(0, messages.Response(messages.TUNED, [], settings=tuned))
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + _CHECK_EVERY
            responses.extend(self._checked())
        if not responses:
            return ()
        tag = self._rounds.started
        self._channel.respond((tag, messages.to_wire(responses)))
        for response in responses:
            if response.kind == messages.EVICTED:
                slots = [ident % coordinator.slots for ident in response.cache_ids.values()]
                self._cooling.append((self.batches, slots))
            elif response.kind == messages.STOP:
                self._ended = True  # the last response any rank takes (``_Side.finish``)
        self.batches += 1
        return [(tag, responses)]

    def _checked(self) -> list:
        """Return the responses that fail stalled tensors and drifted calls, saying why."""
        coordinator = self.coordinator
        warnings, stalled = coordinator.check_stalls()
        for text in warnings:
            sys.stderr.write(f"ringtrain: warning: {text}\n")
        for response in stalled:
            sys.stderr.write(f"ringtrain: error: failing a stalled tensor: {response.error}\n")
        drifted = coordinator.check_drift()
        if drifted:
            sys.stderr.write(f"ringtrain: error: {drifted[0].error}\n")
        sys.stderr.flush()
        return stalled + drifted

    def beat(self) -> None:
        """Send a heartbeat: an empty batch of responses to every rank (none after a STOP)."""
        if not self._ended:
            self._channel.respond((self._rounds.started, []))
            self.batches += 1

    def pending(self) -> bool:
        """Return True while some tensor waits for ranks that have not submitted it."""
        return self.coordinator.pending()

    def silent(self, in_flight, shutdown_sent):
        """Return the silent ranks that tensors wait for, and what waits for them.

        Tensors wait for every rank while the coordinator waits for submissions, or while
        this rank's agreement round waits for every rank to start it.
        """
        if not self.coordinator.pending() and not self._rounds.in_flight():
            return [], ""
        silent = self._liveness.silent(range(1, self._liveness.size))
        return silent, "tensors waited for it to submit them"

    def awaited(self, in_flight, shutdown_sent):
        """Return the ranks this rank's engine waits for, and what for (for an error)."""
        names, ranks = self.coordinator.awaited()
        if not names and in_flight:  # agreed in rounds: any other rank may be missing
            return _awaited(list(range(1, self._liveness.size)), in_flight)
        return _awaited([r for r in ranks if r != 0], names)


class WorkerSide(_Side):
    """Any other rank: submissions go to rank 0, whose batches come back."""

    def send(self, entries) -> None:
        """Send this rank's ``entries`` to the coordinator."""
        self._channel.submit(entries)

    def ran(self, requests) -> None:
        """Do nothing: only the coordinator tunes."""

    def receive(self) -> list:
        """Return the coordinator's batches that came, as [(tag, responses)], counting them."""
        batches = []
        for tag, wire in self._channel.responses():
            self.batches += 1
            self._liveness.heard(0)
            if wire:
                batches.append((tag, messages.from_wire(wire)))
        return batches

    def beat(self) -> None:
        """Send a heartbeat: an empty submission (none after this rank's last message)."""
        if not self._ended:
            self._channel.submit([])

    def pending(self) -> bool:
        """Return False: a worker decides nothing that waits for other ranks."""
        return False

    def silent(self, in_flight, shutdown_sent):
        """Return the coordinator, if silent while this rank waits for it, and what waits."""
        if not in_flight and not shutdown_sent:
            return [], ""
        silent = self._liveness.silent([0])
        return silent, f"this rank waited for the coordinator's {_responses(in_flight)}"

    def awaited(self, in_flight, shutdown_sent):
        """Return the ranks this rank's engine waits for, and what for (for an error)."""
        if shutdown_sent and not in_flight:
            return [0], f"the coordinator's {_responses(in_flight)}"
        return _awaited([0], in_flight)


def _awaited(ranks, names):
    if not names:
        return [], "in no collective"
    return ranks, f"the negotiation of {listed(names)}"


def _responses(in_flight):
    """Return what a worker waits for the coordinator to answer."""
    if in_flight:
        return f"responses ({listed(in_flight)})"
    return "answer to this rank's shutdown"


def listed(names, shown=4):
    """Return the first ``shown`` of ``names``, quoted, and how many more there are."""
    names = list(names)
    shown_names = ", ".join(repr(name) for name in names[:shown])
    return f"{shown_names} and {len(names) - shown} more" if len(names) > shown else shown_names
