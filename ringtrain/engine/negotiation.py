"""The coordinator's bookkeeping (rank 0): who submitted what, and what to run next.

Pure logic with no MPI: the engine feeds it each rank's submissions and ships the responses
it returns to every rank, which run them in the same order. Cached tensors do not come here:
every rank agrees on those in rounds of its own (``engine.rounds``).
"""

import time

from ringtrain.engine import fusion, messages
from ringtrain.engine.messages import Meta, Response
from ringtrain.engine.rounds import slot_count
from ringtrain.engine.stall import StallInspector, describe
from ringtrain.ops import ReduceOp

_JOIN_UNSUPPORTED = (messages.ALLTOALL, messages.REDUCESCATTER)
# Kinds whose response needs nothing of any rank's meta but the one they agree on: these
# get cache ids, and are agreed in rounds (``engine.rounds``) once every rank sent the same meta.
_CACHEABLE = (messages.ALLREDUCE, messages.BROADCAST, messages.REDUCESCATTER)


class Coordinator:
    """Matches submissions across ranks, checks they agree, and plans fused responses."""

    def __init__(
        self,
        size,
        fusion_threshold,
        cache_capacity,
        stall,
        drift_after=0.0,
        clock=time.monotonic,
        slots=None,
    ):
        """``drift_after``: seconds without a submission before ``check_drift`` fails (0: off).

        ``slots``: the slots of an agreement round (None: ``rounds.slot_count`` of the cache).
        """
        self.size = size
        self.fusion_threshold = fusion_threshold
        self.cache_capacity = cache_capacity
        self.stall: StallInspector = stall
        self.drift_after = drift_after
        self._clock = clock
        self._submitted_at = clock()  # the last submission's time, for the drift check
        self._table: dict[str, dict[int, Meta]] = {}
        self._ready: list[str] = []
        self._ready_at: dict[str, float] = {}
        self._joined: list[int] = []
        self._shutdown_by: int | None = None
        # The cache: id -> the meta it stands for, and name -> its id (``engine.rounds``).
        self._cache_meta: dict[int, Meta] = {}
        self._cache_id: dict[str, int] = {}
        self._next_id = 0  # ids are never reused; each takes the round slot id % slots
        self.slots = slot_count(cache_capacity) if slots is None else slots
        self._live_slots: set[int] = set()  # slots of the ids that stand for a name
        # Slots of evicted ids that some rank may still offer in a round: not given again
        # until ``free`` says every rank has run the eviction.
        self._cooling_slots: set[int] = set()
        self._evicted: dict[str, int] = {}  # name -> id evicted since the last responses
        self._withdrawn: dict[int, list[str]] = {}  # rank -> names it took back, to confirm
        # A name failed on the ranks that had submitted it (by the stall shutdown or the drift
        # check) -> (the ranks that had not, what failed it, the response kind): each one's
        # next submission of it is its late one for the failed round, and fails too.
        self._owed: dict[str, tuple[set[int], str, str]] = {}
        self._late: list[Response] = []  # failures of late submissions, to send

    def pending(self) -> bool:
        """Return True while some name waits for ranks that have not submitted it."""
        return bool(self._table)

    def awaited(self) -> tuple[list[str], list[int]]:
        """Return the names that wait for ranks to submit them, and all the ranks they wait for."""
        missing = {name: self._missing(name) for name in self._table}
        names = [name for name, ranks in missing.items() if ranks]
        return names, sorted({rank for name in names for rank in missing[name]})

    def decided(self) -> bool:
        """Return True if ``responses`` has something to return."""
        return (
            bool(self._ready)
            or bool(self._evicted)
            or bool(self._withdrawn)
            or bool(self._late)
            or len(self._joined) == self.size
            or self._shutdown_by is not None
        )

    def add(self, rank: int, entries) -> None:
        """Take one message of ``rank``: metas, withdrawals, suspects, or the shutdown request."""
        now = self._clock()
        for entry in entries:
            if entry == messages.SHUTDOWN_REQUEST:
                if self._shutdown_by is None:
                    self._shutdown_by = rank
                continue
            if isinstance(entry, messages.Withdrawal):
                if entry.counted:
                    self._withdraw_counted(rank, entry)
                else:
                    self._withdraw(rank, entry.name)
                continue
            if isinstance(entry, messages.Suspect):
                # Evicted even if a round agrees it meanwhile: it runs on every rank before
                # the eviction, which then finds nothing counted to send whole.
                self._evict(entry.name)
                continue
            meta = entry
            self._submitted_at = now
            # Sent whole while cached: its meta changed on that rank, so the others' counted
            # submissions of it are sent whole too, and checked against it.
            self._evict(meta.name)
            if meta.name in self._owed and self._late_submission(rank, meta.name):
                continue
            if meta.kind == messages.JOIN:
                if rank not in self._joined:
                    self._joined.append(rank)
                    self._forgive(rank)
                    for name in list(self._cache_id):  # counts cannot say a rank has joined
                        self._evict(name)
                    for name in list(self._table):
                        self._note_if_ready(name, now)
                continue
            self._table.setdefault(meta.name, {})[rank] = meta
            self.stall.seen(meta.name, now)
            self._note_if_ready(meta.name, now)

    def retune(self, fusion_threshold: int, cache_capacity: int) -> None:
        """Plan from now on with ``fusion_threshold``, and a cache of ``cache_capacity`` ids.

        A cache turned off forgets every id, as a join does: the ranks send their counted
        submissions whole.
        """
        self.fusion_threshold = fusion_threshold
        self.cache_capacity = cache_capacity
        if not cache_capacity:
            for name in list(self._cache_id):
                self._evict(name)

    def _withdraw(self, rank, name):
        """Forget ``rank``'s submission of ``name`` unless a response has taken it already.

        A taken one runs on every rank as usual (its result goes unread); a forgotten one is
        confirmed to the rank, which keeps its request until one or the other happens.
        """
        metas = self._table.get(name)
        if metas is None or rank not in metas or name in self._ready_at:
            return
        del metas[rank]
        if not metas:
            del self._table[name]
            self.stall.done(name)
        self._withdrawn.setdefault(rank, []).append(name)

    def _withdraw_counted(self, rank, withdrawal):
        """Forget ``rank``'s counted submission, which no round has agreed (``Engine``).

        The rank has taken its bit out of every round before it sent this, so the others'
        counted submissions would wait for it for ever: the name's id is evicted, every
        other rank sends its submission whole, and this one's is confirmed as withdrawn.
        """
        self._evict(withdrawal.name)
        self._withdrawn.setdefault(rank, []).append(withdrawal.name)

    def _evict(self, name):
        """Make ``name``'s cache id, if it has one, stand for nothing from now on."""
        ident = self._cache_id.pop(name, None)
        if ident is not None:
            del self._cache_meta[ident]
            slot = ident % self.slots
            self._live_slots.discard(slot)
            self._cooling_slots.add(slot)
            self._evicted[name] = ident

    def free(self, slots) -> None:
        """Let ``slots``, whose evictions every rank has run, stand for new ids again."""
        self._cooling_slots.difference_update(slots)

    def _late_submission(self, rank, name):
        """Return True, failing it, if this submission of ``name`` is ``rank``'s late one.

        That is the first one since the stall shutdown or the drift check failed ``name``
        without ``rank``: it belongs to the failed round, so it must not pair with other
        ranks' next submissions.
        """
        owing, why, kind = self._owed[name]
        if rank not in owing:
            return False
        owing.discard(rank)
        if not owing:
            del self._owed[name]
        error = (
            f"tensor {name!r}: rank {rank} submitted it after {why}; this late submission "
            "fails too, and the name's next submission starts afresh"
        )
        self._late.append(Response(kind, [name], error=error, ranks=(rank,)))
        return True

    def _forgive(self, rank):
        """Expect no late submission from ``rank``, which has joined: it submits no more."""
        for name, (owing, _, _) in list(self._owed.items()):
            owing.discard(rank)
            if not owing:
                del self._owed[name]

    def _note_if_ready(self, name, now):
        if name in self._ready_at or len(self._table[name]) + len(self._joined) < self.size:
            return
        if not self._missing(name):
            self._ready.append(name)
            self._ready_at[name] = now
            self.stall.done(name)

    def _missing(self, name):
        have = self._table.get(name, {})
        return [r for r in range(self.size) if r not in have and r not in self._joined]

    def responses(self) -> list[Response]:
        """Return what every rank must run now, in order, and forget it."""
        if not self.decided():
            return []  # the engine's common empty turn: nothing to plan
        out: list[Response] = []
        if self._evicted:  # first: the ranks resend what they counted under these ids
            evicted, self._evicted = self._evicted, {}
            out.append(Response(messages.EVICTED, list(evicted), cache_ids=evicted))
        allreduces = []
        ids = {}
        for name in self._ready:
            meta = self._canonical(name)
            error = self._disagreement(name, meta)
            if error:
                out.append(Response(meta.kind, [name], [meta], error=error))
                continue
            ident = self._assign_id(name, meta)
            if ident is not None:
                ids[name] = ident
            if meta.kind == messages.ALLREDUCE:
                allreduces.append(meta)
            else:
                out.append(self._response(meta.kind, [meta], ids))
        for fused in fusion.plan(allreduces, self.fusion_threshold):
            out.append(self._response(messages.ALLREDUCE, fused, ids))
        for name in self._ready:
            del self._table[name]
            del self._ready_at[name]
        self._ready = []
        if len(self._joined) == self.size:
            out.append(Response(messages.JOIN, [messages.JOIN_NAME], last_joined=self._joined[-1]))
            self._joined = []
        for rank, names in self._withdrawn.items():
            reason = "withdrawn: the call that submitted it failed on another tensor"
            out.append(Response(messages.WITHDRAWN, names, error=reason, withdrawn_by=rank))
        self._withdrawn = {}
        out.extend(self._late)
        self._late = []
        if self._shutdown_by is not None:
            # Ends every rank's engine, failing what is pending.
            reason = f"rank {self._shutdown_by} shut ringtrain down (shutdown() or its exit)"
            out.append(Response(messages.STOP, sorted(self._table), error=reason))
        return out

    def check_stalls(self) -> tuple[list[str], list[Response]]:
        """Return (one-line warnings, responses that fail the names past the shutdown time).

        Each such name is forgotten here, and its response fails it on the ranks that
        submitted it; the others' next submission of it is their late one (``add``).
        """
        warn, fatal = self.stall.check(self._clock(), self._ranks_of)
        return [describe(s) for s in warn], [self._fail_stalled(s) for s in fatal]

    def _ranks_of(self, name):
        return sorted(self._table[name]), self._missing(name)

    def _fail_stalled(self, stall):
        error = (
            f"stall shutdown after {self.stall.shutdown_after:g} s "
            f"(RINGTRAIN_STALL_SHUTDOWN_SECONDS): {describe(stall)}"
        )
        why = (
            f"the stall shutdown had failed it on ranks {list(stall.submitted)}, which had "
            f"waited {stall.age:.1f} s for it"
        )
        return self._fail_unmatched(stall.name, messages.STALLED, error, why)

    def check_drift(self) -> list[Response]:
        """Return responses that fail every pending unnamed call, if the ranks have drifted.

        They have when every rank that has not joined waits for unnamed calls, none of which
        every rank has submitted, and no submission has come in for ``drift_after`` seconds.
        Unnamed calls are named by call site and count (``messages.unnamed_name``), so such
        ranks are at different calls and would wait for each other forever. Each name fails
        on the ranks that submitted it; the others' next submission of it fails as late.
        """
        if not self.drift_after or self._ready or not self._table:
            return []
        if self._clock() - self._submitted_at < self.drift_after:
            return []
        waiting: dict[int, list[str]] = {}  # rank -> the unnamed calls it waits for
        for name, metas in self._table.items():
            call = messages.unnamed_call(name)
            if call is not None:
                for rank in metas:
                    waiting.setdefault(rank, []).append(call)
        if any(r not in waiting for r in range(self.size) if r not in self._joined):
            return []  # a rank that waits for named calls only may still submit the others
        parts = "; ".join(f"rank {r} at {_listed(waiting[r])}" for r in sorted(waiting))
        error = (
            f"unnamed collectives drifted apart across ranks ({parts}): every rank waits for "
            "unnamed calls that some other rank has not made, and no rank has submitted "
            f"anything for {self.drift_after:g} s (RINGTRAIN_UNNAMED_DRIFT_SECONDS). Unnamed "
            "calls pair by call site and count, so every rank must make them from the same "
            "lines, as many times; name the calls that ranks skip or make from different lines"
        )
        drifted = [n for n in self._table if messages.unnamed_call(n) is not None]
        why = "the drift check of unnamed calls had failed it on the ranks that had made it"
        return [self._fail_unmatched(n, messages.DRIFTED, error, why) for n in drifted]

    def _fail_unmatched(self, name, kind, error, why):
        """Forget ``name``, which some ranks miss; return a ``kind`` response failing it.

        The ranks that submitted it fail it; the others' next submission of it is their late
        one for this failed round, which fails too (``_late_submission``), with ``why``.
        """
        submitted, missing = self._ranks_of(name)
        del self._table[name]
        self.stall.done(name)
        self._owed[name] = (set(missing), why, kind)
        return Response(kind, [name], error=error, ranks=tuple(submitted))

    def _response(self, kind, metas, ids):
        """Return the response running ``metas``, with the new cache ids among ``ids``."""
        names = [m.name for m in metas]
        per_rank = None
        if kind in (messages.ALLGATHER, messages.ALLTOALL):
            per_rank = [[self._table[n].get(r) for r in range(self.size)] for n in names]
        joined = tuple(sorted(self._joined))
        if kind == messages.ALLREDUCE and not joined:
            metas = []  # every rank has its own metas; keep the steady-state message small
        cache_ids = {name: ids[name] for name in names if name in ids} if ids else {}
        return Response(kind, names, metas, per_rank, joined, cache_ids=cache_ids)

    def _assign_id(self, name, meta):
        """Return a new cache id for ``name``, negotiated whole, or None where it gets none.

        It gets one where every rank sent the same ``meta`` of a cacheable kind, no rank has
        joined, and the cache has room.
        """
        if (
            meta.kind not in _CACHEABLE
            or self._joined
            or len(self._cache_meta) >= self.cache_capacity
            or any(m != meta for m in self._table[name].values())
        ):
            return None
        taken = self._live_slots | self._cooling_slots
        if len(taken) >= self.slots:
            return None
        ident = self._next_id
        while ident % self.slots in taken:
            ident += 1
        self._next_id = ident + 1
        self._live_slots.add(ident % self.slots)
        self._cache_id[name] = ident
        self._cache_meta[ident] = meta
        return ident

    def _canonical(self, name):
        metas = self._table[name]
        return metas[0] if 0 in metas else metas[min(metas)]

    def _disagreement(self, name, first):
        by_rank = self._table[name]
        if not self._joined and all(m == first for m in by_rank.values()):
            return None  # the steady-state case: every rank sent the same meta
        if len({m.kind for m in by_rank.values()}) > 1:
            return _mismatch(name, "operation", by_rank, lambda m: m.kind)
        if self._joined:
            if first.kind in _JOIN_UNSUPPORTED:
                return (
                    f"{first.kind} of tensor {name!r} cannot run while ranks {self._joined} "
                    "have joined"
                )
            if first.kind == messages.ALLREDUCE and first.op == ReduceOp.Adasum:
                return (
                    f"Adasum allreduce of tensor {name!r} cannot run while ranks "
                    f"{self._joined} have joined"
                )
            if first.kind == messages.BROADCAST and first.root in self._joined:
                return f"broadcast of tensor {name!r}: root rank {first.root} has joined"
        if all(m == first for m in by_rank.values()):
            return None
        for field in messages.AGREED_FIELDS[first.kind]:
            values = {messages.field_value(m, field) for m in by_rank.values()}
            if len(values) > 1 and field == "group":
                return _group_mismatch(name, by_rank)
            if len(values) > 1:
                return _mismatch(
                    name, field, by_rank, lambda m, f=field: messages.field_value(m, f)
                )
        return None


def _listed(calls, most=3):
    """Return ``calls`` joined for a message, the first ``most`` of them, counting the rest."""
    more = f" and {len(calls) - most} more" if len(calls) > most else ""
    return ", ".join(calls[:most]) + more


def _mismatch(name, field, by_rank, value_of):
    def show(value):
        if field == "compression":
            return value or "none (float32)"
        return ReduceOp(value).name if field == "op" else str(value)

    parts = ", ".join(f"rank {r}: {show(value_of(by_rank[r]))}" for r in sorted(by_rank))
    return f"tensor {name!r}: {field} differs across ranks ({parts})"


def _group_mismatch(name, by_rank):
    """Describe how ranks' groups under ``name`` differ: in kind, in size, or in a member."""

    def kind(meta):
        return "a single tensor" if meta.group is None else f"a group of {len(meta.group)}"

    kinds = {r: kind(m) for r, m in by_rank.items()}
    if len(set(kinds.values())) > 1:
        parts = ", ".join(f"rank {r}: {kinds[r]}" for r in sorted(kinds))
        return f"tensor {name!r}: submitted as different groups across ranks ({parts})"
    members = len(next(iter(by_rank.values())).group)
    for i in range(members):
        if len({m.group[i] for m in by_rank.values()}) > 1:
            parts = ", ".join(f"rank {r}: {by_rank[r].group[i]}" for r in sorted(by_rank))
            return (
                f"tensor '{name}.{i}' (member {i} of group {name!r}): shape differs across "
                f"ranks ({parts})"
            )
    raise AssertionError(f"groups under {name!r} differ, yet no member does")
