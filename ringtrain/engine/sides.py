"""The two sides of negotiation behind one interface: the coordinator's (rank 0) and a worker's.

An engine holds one side, chosen once by its rank, and never asks its rank again: the side
hands this rank's submissions to the coordinator, counts its cached ones up the agreement
tree (``engine.agreement``), returns the responses this rank must run, beats, and says whom
this rank waits for and which of them has fallen silent.
"""

import sys
import time

from ringtrain.engine import messages

# The coordinator looks for stalled tensors and drifted unnamed calls this often (seconds).
_CHECK_EVERY = 1.0


class _Side:
    """What both sides share: the tree that counts cached submissions."""

    def __init__(self, channel, liveness, tree):
        self._channel = channel
        self._liveness = liveness
        self._tree = tree
        self._finished: set[int] = set()  # children whose last counts came (``finish``)
        # This rank has sent its last control message: it beats no more (``finish``).
        self._ended = False

    def count(self, ident: int) -> int:
        """Count a submission of this rank under cache id ``ident``; return its round."""
        return self._tree.submit(ident)

    def forget(self, ident: int) -> None:
        """Drop the counts of the evicted cache id ``ident``."""
        self._tree.forget(ident)

    def finish(self, last) -> None:
        """Leave no control message unmatched before the channel is freed (``finish``).

        No heartbeat follows ``last``, not even from the waits of the drain: a message sent
        after it is never received, and a later engine's channel, given the freed one's
        context id by MPI, would take it for its own and lose its order.
        """
        self._ended = True
        children = [c for c in self._tree.children if c not in self._finished]
        self._channel.finish(last, self._tree.parent, children)

    def _counted(self) -> list:
        """Take the children's counts; return the (id, count) pairs risen in the subtree."""
        tree = self._tree
        if tree.children:
            for child, pairs in self._channel.counts():
                self._liveness.heard(child)
                if pairs == messages.FINISHED:  # it stopped before this rank did
                    self._finished.add(child)
                else:
                    tree.heard(child, pairs)
        return tree.risen()


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
        tree,
        clock=time.monotonic,
        tuner=None,
        cache_capacity=0,
    ):
        super().__init__(channel, liveness, tree)
        self.coordinator = coordinator
        self._clock = clock
        self._next_check = 0.0
        self._tuner = tuner
        self._cache_capacity = cache_capacity
        self._switch: dict | None = None  # settings the tuner picked, to send

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

    def receive(self) -> list:
        """Take every rank's submissions and counts, decide, send the responses, return them."""
        coordinator = self.coordinator
        tuned = self._switch
        if tuned is not None:  # planned from here on with the new settings, on every rank
            # Before the counts: a cache turned off makes them void, as evicted ids' are.
            self._switch = None
            capacity = self._cache_capacity if tuned["response_cache"] else 0
            coordinator.retune(tuned["fusion_threshold"], capacity)
        for source, entries in self._channel.submissions():
            self._liveness.heard(source)
            coordinator.add(source, entries)
        risen = self._counted()
        if risen:
            coordinator.agree(risen)
        responses = coordinator.responses()
        if tuned is not None:
            responses.insert(0, messages.Response(messages.TUNED, [], settings=tuned))
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + _CHECK_EVERY
            responses.extend(self._checked())
        if responses:
            self._channel.respond(messages.to_wire(responses))
            if any(response.kind == messages.STOP for response in responses):
                self._ended = True  # the last response any rank takes (``_Side.finish``)
        return responses

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
        """Send a heartbeat: an empty list of responses to every rank (none after a STOP)."""
        if not self._ended:
            self._channel.respond([])

    def pending(self) -> bool:
        """Return True while some tensor waits for ranks that have not submitted it."""
        return self.coordinator.pending()

    def silent(self, in_flight, shutdown_sent):
        """Return the silent ranks that tensors wait for, and what waits for them."""
        if not self.coordinator.pending():
            return [], ""
        silent = self._liveness.silent(range(1, self._liveness.size))
        return silent, "tensors waited for it to submit them"

    def awaited(self, in_flight, shutdown_sent):
        """Return the ranks this rank's engine waits for, and what for (for an error)."""
        names, ranks = self.coordinator.awaited()
        if not names and in_flight:  # counted up the tree: any other rank may be missing
            return _awaited(list(range(1, self._liveness.size)), in_flight)
        return _awaited([r for r in ranks if r != 0], names)


class WorkerSide(_Side):
    """Any other rank: submissions go to rank 0, counts to its parent in the tree."""

    def send(self, entries) -> None:
        """Send this rank's ``entries`` to the coordinator."""
        self._channel.submit(entries)

    def ran(self, requests) -> None:
        """Do nothing: only the coordinator tunes."""

    def receive(self) -> list:
        """Pass the subtree's risen counts up; return the coordinator's responses that came."""
        risen = self._counted()
        if risen:
            self._channel.send_counts(self._tree.parent, risen)
        responses = []
        for wire in self._channel.responses():
            responses.extend(messages.from_wire(wire))
            self._liveness.heard(0)
        return responses

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
