"""The background engine: one thread per rank that runs ringtrain's collectives.

Each rank's thread sends its new submissions to the coordinator (rank 0) as small pickled
metas (never tensor data) over the control channel (``transport.control``). Rank 0 matches
them across ranks and sends every rank the same ordered batches of responses. Those that
every rank has run before under a cache id go to no one: every rank marks them ready in
its agreement rounds (``rounds``), a bitwise AND among all ranks, and runs what all have
ready in the same order, between the batches. Each rank plans (``planner``) and runs
(``executor``) what it runs through its transport (``transport.router``): the engine makes
no MPI call of its own. The thread sleeps between checks, but a local
submission wakes it at once, so latency is not rounded up to the cycle time.

The engine works in turns, and one thread at a time takes them: in a job of two ranks or
more, a blocking call's caller takes them itself while the engine thread is between turns
(``ringtrain.engine.turns`` owns that, and states its invariants).
"""

import sys
import threading
import time
import traceback
import zlib

from ringtrain.buffers import BufferPool
from ringtrain.engine import fusion, messages
from ringtrain.engine import timeline as tl
from ringtrain.engine.executor import Executor
from ringtrain.engine.handle import Request, complete_all
from ringtrain.engine.liveness import Liveness, PeerWatch
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.rounds import Rounds, slot_count
from ringtrain.engine.sides import CoordinatorSide, WorkerSide, listed
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.tuning import tuner as tuning
from ringtrain.engine.turns import LONE_SPIN_SECONDS, SPIN_SECONDS, Turns
from ringtrain.errors import (
    CollectiveTimeoutError,
    DuplicateNameError,
    EngineStoppedError,
    MismatchError,
    RingtrainError,
    StallError,
)
from ringtrain.transport.control import ControlChannel
from ringtrain.transport.router import Transport

# A submission counted for the agreement rounds that has waited this long goes to rank 0
# whole (``Engine._suspect_late``); at most half the collective timeout.
SUSPECT_SECONDS = 2.0
# A round that agreed none of this rank's ready tensors is tried again after this long,
# doubling up to ``RETRY_MOST`` while rounds keep agreeing none: ranks whose ready tensors
# differ wait for each other's next submission without a round every few microseconds.
RETRY_FIRST = 20e-6
RETRY_MOST = 1e-3
# A round's fingerprint is a hash of its metas' digests (hashes of ints and tuples of them
# are the same in every process, unlike those of strings), cut to the bits a round carries.
_FINGERPRINT_BITS = (1 << 64) - 1


class Engine:
    """Queue, negotiation and execution for one rank, run by a background thread.

    A blocking call's caller runs them itself while it waits, when it can (``wait``). The
    engine takes its collaborators: ``transport`` (``router.Transport``, or any object with
    its collectives, ``waiter``, ``cache_capacity`` and ``free``), ``channel``
    (``control.ControlChannel``'s calls), the scratch ``pool`` that the transport shares,
    and the ``clock`` of its negotiation and heartbeats. ``Engine.over`` builds them on a
    communicator.
    """

    def __init__(self, settings, topology, transport, channel, pool, clock=time.monotonic):
        self.settings = settings
        self.rank = topology.rank
        self.size = topology.size
        self.transport = transport
        self._pool = pool
        self._control = channel
        # The timeout that the transport agreed on (rank 0's): every rank beats alike.
        liveness = Liveness(transport.waiter.timeout, self.size, clock)
        self._liveness = liveness
        self._clock = clock
        # The cache's capacity that the transport agreed on (rank 0's) sizes every rank's rounds.
        slots = slot_count(transport.cache_capacity)
        rounds = Rounds(slots, channel.start_and, self.rank == 0)
        self._rounds = rounds
        self._tuned = settings.autotune  # the transport then has ``retune``
        self.tuner = None  # rank 0's autotune run (``engine.tuning``), kept once it ends
        if self.rank == 0:
            stall = StallInspector(settings.stall_check_seconds, settings.stall_shutdown_seconds)
            coordinator = Coordinator(
                self.size,
                settings.fusion_threshold,
                settings.cache_capacity,
                stall,
                settings.unnamed_drift_seconds,
                clock,
                rounds.slots,
            )
            if self._tuned:
                self.tuner = tuning.tuner_for(settings, topology, transport, clock)
            self._side = CoordinatorSide(
                coordinator, channel, liveness, rounds, clock, self.tuner, settings.cache_capacity
            )
        else:
            self._side = WorkerSide(channel, liveness, rounds)
        self._watch = PeerWatch(liveness, self._side, channel, transport.waiter, topology)
        self._timeline_path = settings.timeline or None
        self._timeline = _open_timeline(settings.timeline, self.rank)
        self._executor = Executor(transport, pool, self._timeline)
        self._lock = threading.Lock()
        self._outbox: list[Request] = []
        self._withdrawals: list[str] = []  # names to take back from the coordinator
        self._inflight: dict[str, Request] = {}
        # name -> (meta, cache id, the meta's digest for the rounds' fingerprints)
        self._cache: dict[str, tuple[messages.Meta, int, int]] = {}
        self._slot_names: dict[int, str] = {}  # round slot -> the cached name it stands for
        # Submissions counted under their cache ids and not run yet: name -> (slot, when).
        self._counted: dict[str, tuple[int, float]] = {}
        self._batches: list[tuple[int, list]] = []  # (tag, responses) not run yet, in order
        self._fusion_threshold = settings.fusion_threshold  # as rank 0's, tuned alike
        self._retry_after = RETRY_FIRST
        self._retry_at = 0.0
        # What this rank ran in its last round: its names and their fingerprint, which the
        # next round compares across ranks (``_check_round``).
        self._last_ran: tuple[list[str], int] = ([], 0)
        self._withdrawing: set[str] = set()  # names whose withdrawal has gone, unanswered
        self._next_suspect_check = 0.0
        # How long a counted submission waits before this rank suspects it (``_suspect_late``).
        timeout = liveness.timeout
        self._suspect_seconds = min(SUSPECT_SECONDS, timeout / 2) if timeout else SUSPECT_SECONDS
        self._stop_error: BaseException | None = None
        self._shutdown_asked = False
        self._shutdown_sent = False  # this rank has asked the coordinator to stop every engine
        self._stopped = False  # a STOP response has been run, or the job is ending
        self._turns = Turns(
            self._turn_once,
            lambda: self._stopped,
            self._waiting,
            self._side.pending,
            self._abort,
            settings.cycle_time_ms / 1000,
            self.size,
            LONE_SPIN_SECONDS if topology.alone_on_host else SPIN_SECONDS,
            liveness.idle_seconds,
        )
        self._turns.start()

    @classmethod
    def over(cls, comm, settings, topology):
        """Return an engine over ``comm``, whose ``topology`` it is (collective over ``comm``)."""
        pool = BufferPool()
        transport = Transport(comm, topology, settings, pool)
        return cls(settings, topology, transport, ControlChannel(comm, transport.waiter), pool)

    @property
    def thread_id(self) -> int | None:
        """Return the OS id of this engine's thread: to count its wake-ups in ``/proc``."""
        return self._turns.thread_id

    def submit(self, meta, array, out=None, read_only=False, wake=True) -> Request:
        """Queue one collective; return its request, whose handle completes later.

        ``read_only``: the caller never writes to the result (see ``Request``). With ``wake``
        False the engine thread is not woken: for a caller that calls ``wait`` at once.
        """
        request = Request(meta, array, out, tl.now_ns(), read_only)
        with self._lock:
            if self._stop_error is not None:
                if isinstance(self._stop_error, EngineStoppedError):
                    raise EngineStoppedError(str(self._stop_error))
                raise EngineStoppedError(f"the ringtrain engine has stopped: {self._stop_error}")
            if meta.name in self._inflight:
                raise DuplicateNameError(
                    f"tensor name {meta.name!r} was submitted again while its first submission "
                    "is still in flight; use distinct names or synchronize first"
                )
            self._inflight[meta.name] = request
            self._outbox.append(request)
        timeline = self._timeline  # read once: stop_timeline may clear it meanwhile
        if timeline is not None:
            timeline.instant(meta.name, tl.ENQUEUE, request.submitted_ns)
        if wake:
            self._turns.wake()
        return request

    def switch_settings(self, values) -> None:
        """Have every rank run under ``values`` from the next responses on, as autotune does.

        On rank 0 of an engine started with autotune, once it has tuned (``Tuner.switch``
        checks ``values``): for a benchmark that times several settings in one launch. Call
        it between collectives: a switch made while the last is still pending may be lost.
        Raises ValueError elsewhere.
        """
        if self.tuner is None:
            raise ValueError(
                "switch_settings is for rank 0 of an engine started with autotune; this is "
                f"rank {self.rank}, with autotune {'on' if self._tuned else 'off'}"
            )
        self._side.switch(self.tuner.switch(values))

    def withdraw(self, handles) -> None:
        """Take back the submissions of ``handles`` whose caller will never wait for them.

        For a call that fails partway, such as a step whose gradients ranks disagree on: its
        other submissions would otherwise stay in flight and collide with the next step's.
        One not sent yet is dropped here; a sent one is taken back from the coordinator,
        unless a response has taken it already (then it runs as usual). Returns once each
        is settled, so that its name is free for the caller's next submission.
        """
        sent = []
        with self._lock:
            for handle in handles:
                request = self._inflight.get(handle.name)
                if request is None or request.handle is not handle or handle.done():
                    continue
                if request in self._outbox:
                    self._outbox.remove(request)
                    del self._inflight[handle.name]
                    handle.fail(_withdrawn_error(handle.name))
                else:
                    self._withdrawals.append(handle.name)
                    sent.append(handle)
        self._turns.wake()
        for handle in sent:
            # The coordinator answers every withdrawal: it confirms it, or the response that
            # had taken the tensor runs here as on every rank.
            try:
                self.wait(handle)
            except RingtrainError:
                pass

    def start_timeline(self, path: str) -> None:
        """Start writing a timeline to ``path`` (this rank's part; see ``RINGTRAIN_TIMELINE``).

        Raises ValueError while one is being written.
        """
        with self._lock:
            if self._timeline_path is not None:
                raise ValueError(
                    f"a timeline is already being written to {self._timeline_path!r}; "
                    "call stop_timeline() first"
                )
            self._timeline = _open_timeline(path, self.rank)  # may raise OSError: nothing set
            self._timeline_path = path
            self._executor.timeline = self._timeline

    def stop_timeline(self) -> None:
        """Close the timeline being written, if any; later events are not recorded."""
        with self._lock:
            timeline, self._timeline, self._timeline_path = self._timeline, None, None
            self._executor.timeline = None
        if timeline is not None:
            timeline.close()  # an event still being recorded on it is dropped

    def shutdown(self) -> None:
        """Stop every rank's engine (any rank may ask), wait for this thread, free comms.

        Raises ``CollectiveTimeoutError`` where a peer was lost meanwhile (the job then ends).
        """
        with self._lock:
            self._shutdown_asked = True
        self._turns.join()
        if isinstance(self._stop_error, CollectiveTimeoutError):
            raise self._stop_error  # a peer was lost meanwhile: the job is ending (``_abort``)
        # Every control message has been matched (ControlChannel.finish): a wait here is for
        # the last sends to complete, and fails naming a peer that no longer takes them.
        self._control.close()
        self.transport.free()
        self.stop_timeline()

    def wait(self, handle):
        """Return ``handle``'s result (or raise its error) once it is in: for blocking calls.

        The waiting thread may run the engine's turns itself meanwhile (``turns``).
        """
        return self._turns.wait(handle)

    # -- the turns ---------------------------------------------------------------------

    def _abort(self, err, where):
        """Fail every pending handle and end the job: a rank lost mid-collective hangs the rest.

        A rank that found a peer lost tells every other rank first, and each gives up with
        its own error (``PeerWatch.give_up``).
        """
        self._stopped = True  # no thread takes another turn while this one ends the job
        if isinstance(err, CollectiveTimeoutError):
            self._watch.give_up(err)
            # Every rank that can still act gets here at about the same time (``give_up``):
            # each caller raises its own error now, this thread's too if it is a caller's,
            # and a thread of its own ends the job once they have had time to say so.
            self._stop(err)
            # Not a daemon (as a thread started by the engine's would be): an exiting
            # interpreter waits for it before it finalizes MPI, which would wait for the lost.
            ending = threading.Thread(
                target=self._watch.end_job, name="ringtrain-end-job", daemon=False
            )
            ending.start()
            return
        what = "was interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        sys.stderr.write(
            f"ringtrain: rank {self.rank}: the engine {what} in {where}; aborting the job "
            f"so no rank hangs in a collective:\n{traceback.format_exc()}"
        )
        sys.stderr.flush()
        self._stop(EngineStoppedError(f"engine failed: {err!r}"))
        self._control.abort(1)

    def _waiting(self) -> bool:
        """Return True while this rank waits for others: its submissions, rounds or batches."""
        rounds = self._rounds
        return (
            bool(self._inflight)
            or rounds.in_flight()
            or rounds.result is not None
            or bool(self._batches)
        )

    def _turn_once(self) -> bool:
        """Send new submissions, take rank 0's batches (deciding them on rank 0), run rounds.

        Returns True if anything happened.
        """
        active = self._send_submissions()
        batches = self._side.receive()
        if batches:
            self._batches.extend(batches)
        self._watch.beat(self._inflight, self._shutdown_sent)
        progressed = self._advance()
        if self._counted and not self._stopped:
            self._suspect_late()
        return active or progressed or bool(batches)

    def _advance(self) -> bool:
        """Run rounds and batches in the one order of every rank; start a round when due.

        A batch tagged ``n`` runs after round ``n`` and before round ``n + 1``; a round's
        tensors run once every batch that rank 0 had sent when the round started is in
        (``engine.rounds``). Returns True if anything happened.
        """
        rounds = self._rounds
        progressed = rounds.poll()
        while not self._stopped:
            if rounds.result is not None:
                self._run_batches(rounds.completed - 1)
                slots, batches = rounds.result
                if self._stopped or self._side.batches < batches:
                    break  # rank 0's batches before the round are still on their way
                rounds.result = None
                self._check_round(rounds.fingerprints)
                self._run_round(slots)
                self._side.round_ran(batches)
                progressed = True
            self._run_batches(rounds.completed)
            if self._stopped:
                break
            needed = self._batches[-1][0] if self._batches else 0
            if not (rounds.wants_round(needed) or self._retry_due()):
                break
            rounds.start(self._side.batches, self._last_ran[1])
            progressed = True
            if not rounds.poll():
                break
        return progressed

    def _retry_due(self) -> bool:
        """Return True where this rank's ready tensors, unchanged, should try another round.

        The wait between such tries doubles from ``RETRY_FIRST`` to ``RETRY_MOST``.
        """
        rounds = self._rounds
        if rounds.in_flight() or rounds.result is not None or not rounds.has_ready():
            return False
        now = self._clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self._retry_after
        self._retry_after = min(self._retry_after * 2, RETRY_MOST)
        return True

    def _check_round(self, fingerprints) -> None:
        """Fail the job if the ranks ran different tensors in their last round.

        ``fingerprints``: the AND and the OR of every rank's fingerprint of it. Every rank
        finds the difference in the same round, and each names what it ran.
        """
        every, some = fingerprints
        if every == some:
            return
        names, mine = self._last_ran
        rounds = self._rounds
        raise MismatchError(
            f"rank {self.rank}: the ranks ran different tensors in agreement round "
            f"{rounds.completed - 1}: this rank ran {listed(names) or 'none'} (fingerprint "
            f"{mine:#x}), and the fingerprints of all ranks AND to {every:#x} and OR to "
            f"{some:#x}; their caches of names disagree, so the job cannot go on"
        )

    def _run_round(self, slots) -> None:
        """Run the cached tensors that every rank had ready in the round: ``slots``."""
        if not slots:
            self._last_ran = ([], 0)
            return
        self._retry_after = RETRY_FIRST
        self._retry_at = 0.0
        cache, slot_names = self._cache, self._slot_names
        metas = sorted((cache[slot_names[slot]] for slot in slots), key=lambda entry: entry[1])
        names = [meta.name for meta, _, _ in metas]
        fingerprint = hash(tuple(digest for _, _, digest in metas)) & _FINGERPRINT_BITS
        self._last_ran = (names, fingerprint)
        allreduces = []
        for meta, _, _ in metas:
            if meta.kind == messages.ALLREDUCE:
                allreduces.append(meta)
            else:
                self._execute(messages.Response(meta.kind, [meta.name], [meta]))
                self._liveness.heard_all()
        for fused in fusion.plan(allreduces, self._fusion_threshold):
            self._execute(messages.Response(messages.ALLREDUCE, [meta.name for meta in fused]))
            self._liveness.heard_all()  # every rank took part in it

    def _run_batches(self, last_round) -> None:
        """Run the batches from rank 0 tagged ``last_round`` or earlier, in order."""
        batches = self._batches
        while batches and batches[0][0] <= last_round and not self._stopped:
            tag, responses = batches.pop(0)
            for response in responses:
                self._run_response(response, tag)
                if self._stopped:
                    return

    def _run_response(self, response, tag) -> None:
        """Carry out one of rank 0's responses, from a batch tagged ``tag``."""
        if response.kind == messages.WITHDRAWN:
            self._forget(response)
        elif response.kind == messages.STALLED:
            self._fail_listed(response, StallError)
        elif response.kind == messages.DRIFTED:
            self._fail_listed(response, MismatchError)
        elif response.kind == messages.EVICTED:
            self._evict(response)
        elif response.kind == messages.TUNED:
            self._retune(response.settings)
        elif response.kind == messages.STOP:
            self._stop(_stop_error(response))
            self._last_round(tag)
            self._side.finish(messages.FINISHED)
            self._stopped = True
        else:
            self._execute(response)
            self._liveness.heard_all()  # every rank took part in it

    def _last_round(self, tag) -> None:
        """Complete round ``tag + 1`` on every rank before the channel goes: rank 0's last.

        No rank can have started a later one, and a round left in flight on a freed
        communicator would reach the next engine's channel.
        """
        rounds = self._rounds
        if not rounds.in_flight() and rounds.started == tag:
            rounds.start(self._side.batches)
        if rounds.in_flight():
            peers = [r for r in range(self.size) if r != self.rank]
            what = "the engine's shutdown (its last agreement round)"
            self.transport.waiter.until(rounds.poll, peers, what)

    def _retune(self, values):
        """Run every response from here on under the tuned ``values`` (``engine.tuning``)."""
        self._fusion_threshold = values["fusion_threshold"]
        self._turns.retune(values["cycle_time_ms"] / 1000)
        self.transport.retune(values["ring_chunk_bytes"], values["hierarchical_allreduce"])

    def _suspect_late(self):
        """Tell rank 0 of counted submissions that have waited ``_suspect_seconds``.

        Rank 0 then evicts their ids, and every rank sends its submissions of them whole:
        a rank that never submits one is named by the stall check, a silent one by the
        silence check, as for any tensor sent whole.
        """
        now = self._clock()
        if now < self._next_suspect_check:
            return
        self._next_suspect_check = now + self._suspect_seconds / 4
        late = self._suspect_seconds
        suspects = [
            messages.Suspect(name)
            for name, (_, counted_at) in self._counted.items()
            if now - counted_at > late
        ]
        if suspects:
            self._side.send(suspects)

    def _evict(self, response):
        """Forget the evicted cache ids; send this rank's submissions counted under them whole.

        Not those whose withdrawal has gone: rank 0 answers those.
        """
        resend = []
        for name, ident in response.cache_ids.items():
            cached = self._cache.get(name)
            if cached is not None and cached[1] == ident:
                del self._cache[name]
                self._slot_names.pop(ident % self._rounds.slots, None)
            counted = self._counted.pop(name, None)
            if counted is None:
                continue
            self._rounds.unready(counted[0])
            if name not in self._withdrawing:
                request = self._inflight.get(name)
                if request is not None:
                    resend.append(request.meta)
        if resend:
            self._side.send(resend)

    def _send_submissions(self) -> bool:
        if not self._outbox and not self._shutdown_asked and not self._withdrawals:
            return False  # the common empty turn; a submission made meanwhile waits one turn
        with self._lock:
            new, self._outbox = self._outbox, []
            shutdown, self._shutdown_asked = self._shutdown_asked, False
            withdrawals, self._withdrawals = self._withdrawals, []
        # Withdrawals first: each takes back a submission sent earlier, and must not take back
        # a new one of the same name, made once the withdrawn handle had failed or completed.
        counted = self._counted
        entries: list = self._withdrawn_entries(withdrawals) if withdrawals else []
        cache, now, rounds = self._cache, None, self._rounds
        for request in new:
            meta = request.meta
            cached = cache.get(meta.name)
            if cached is not None and cached[0] == meta:  # seen before: counted, not sent
                if now is None:
                    now = self._clock()
                slot = cached[1] % rounds.slots
                counted[meta.name] = (slot, now)
                rounds.ready(slot)
            else:
                entries.append(meta)
        if self._timeline is not None:
            sent = tl.now_ns()
            for request in new:
                request.sent_ns = sent
        if shutdown:
            entries.append(messages.SHUTDOWN_REQUEST)
            self._shutdown_sent = True
        if entries:
            self._side.send(entries)
        return bool(entries) or bool(new)

    def _withdrawn_entries(self, names) -> list:
        """Return the withdrawals of ``names`` to send rank 0 now; hold the rest for later.

        A counted submission leaves this rank's rounds at once, but one that a round in
        flight (or not yet run) carries may still be agreed: its withdrawal waits for that
        round, and is dropped if the round runs it.
        """
        entries, held, rounds = [], [], self._rounds
        for name in names:
            if name not in self._inflight:
                continue  # it ran meanwhile, as a taken one does
            counted = self._counted.get(name)
            if counted is not None:
                rounds.unready(counted[0])
                if rounds.offered(counted[0]):
                    held.append(name)
                    continue
            entries.append(messages.Withdrawal(name, counted is not None))
            self._withdrawing.add(name)
        if held:
            with self._lock:
                self._withdrawals.extend(held)
        return entries

    def _take(self, names) -> list:
        """Return this rank's requests of ``names`` (None where it has none), out of flight."""
        with self._lock:
            requests = [self._inflight.pop(name, None) for name in names]
        if self._counted or self._withdrawing:
            for name in names:
                counted = self._counted.pop(name, None)
                if counted is not None:
                    self._rounds.unready(counted[0])
                self._withdrawing.discard(name)
        return requests

    def _execute(self, response):
        requests = self._take(response.names)
        received = tl.now_ns()
        timeline = self._timeline
        if timeline is not None:
            for request in requests:
                if request is not None:
                    name = request.meta.name
                    timeline.span(name, tl.NEGOTIATE, request.submitted_ns, request.sent_ns)
                    timeline.span(name, tl.WAIT_FOR_OTHER_RANKS, request.sent_ns, received)
        if response.error is not None:
            for request in requests:
                if request is not None:
                    request.handle.fail(MismatchError(response.error))
            return
        for request in requests if response.cache_ids else ():
            ident = response.cache_ids.get(request.meta.name) if request is not None else None
            if ident is not None:
                digest = zlib.crc32(repr(request.meta).encode())
                self._cache[request.meta.name] = (request.meta, ident, digest)
                self._slot_names[ident % self._rounds.slots] = request.meta.name
        if self._tuned and response.kind == messages.ALLREDUCE:
            self._side.ran(requests)
        try:
            results = self._executor.run(response, requests)
        except CollectiveTimeoutError as err:
            with self._lock:  # back in flight, so that ``_stop`` fails them for their callers
                self._inflight.update((r.meta.name, r) for r in requests if r is not None)
            running = f"{response.kind} of {listed(response.names)}"
            raise CollectiveTimeoutError(
                f"{err}; it was running {running}", err.peers, err.reported_by
            ) from None
        complete_all([r.handle if r is not None else None for r in requests], results)

    def _forget(self, response):
        """Drop this rank's requests that the coordinator confirms as withdrawn."""
        if response.withdrawn_by != self.rank:
            return
        requests = self._take(response.names)
        for name, request in zip(response.names, requests, strict=True):
            if request is not None:
                request.handle.fail(_withdrawn_error(name))

    def _fail_listed(self, response, error_class):
        """Fail this rank's requests of ``response.names`` if it is among ``response.ranks``.

        For the stall shutdown and the drift check, which fail names some ranks miss.
        """
        if self.rank not in response.ranks:
            return  # this rank has no such request: its next one is failed as late, by rank 0
        requests = self._take(response.names)
        for request in requests:
            if request is not None:
                request.handle.fail(error_class(response.error))

    def _stop(self, error):
        with self._lock:
            self._stop_error = error
            pending, self._inflight, self._outbox = self._inflight, {}, []
        for request in pending.values():
            request.handle.fail(error)


def _withdrawn_error(name):
    return RingtrainError(
        f"tensor {name!r} was withdrawn: the call that submitted it failed on another tensor"
    )


def _stop_error(response):
    return EngineStoppedError(f"the ringtrain engine has stopped: {response.error}")


def _open_timeline(path, rank):
    if not path:
        return None
    if "{rank}" in path:
        return tl.Timeline(path.format(rank=rank), rank)
    return tl.Timeline(path, rank) if rank == 0 else None
