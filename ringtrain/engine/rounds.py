"""Agreement rounds on cached tensors among all ranks: one bitwise AND, no rank 0.

A tensor that the coordinator has negotiated whole once, with the same meta on every rank,
gets a cache id, and the id a slot: ``id % slots``. From then on a rank that submits it again
sends rank 0 nothing; it sets the slot's bit in its ready vector. When a rank has ready
bits it starts a round: a non-blocking bitwise-AND allreduce of every rank's vector on the
control channel (log-depth in MPI), whose result tells every rank the same set of slots
that every rank has ready. Each rank then runs those tensors itself, in the order of their
ids, fused as the coordinator would fuse them. Rank 0 is special in no way here.

Rounds are matched by their number, not by a clock: a rank that has nothing ready starts
no round, and a round that others started waits for it (it cannot agree on anything
without it anyway). The coordinator still decides everything else (new names, changed
shapes, withdrawals, joins, stalls, settings, the stop), in batches of responses that it
sends every rank. Those batches and the rounds must run in one order on every rank:

- rank 0 tags each batch with the number of rounds it has started, and runs it only once
  that round has run; every rank runs a batch tagged ``n`` after round ``n``'s tensors and
  before round ``n + 1``'s;
- word 0 of every round carries the number of batches rank 0 had sent when it started the
  round (every other rank puts all ones there, so the AND is rank 0's number); a rank runs
  a round's tensors only once it has received and run that many batches;
- a rank that receives a batch tagged with a round it has not started starts it, ready
  bits or not, so that no rank waits on a round that another will never start.

A slot whose id is evicted (a changed shape, a withdrawal, a join, a suspect) may hold a
stale bit on a rank that has not run the eviction yet, so the coordinator gives the slot
a new id only after a round whose word 0 shows that every rank had run the eviction's
batch (``CoordinatorSide.round_ran``, ``Coordinator.free``).

Words 1 and 2 carry a fingerprint of what the rank ran in its last round, and its inverse:
their ANDs give the AND and the OR of every rank's fingerprint, equal only where every
rank ran the same tensors, so that every rank finds a disagreement in the same round.
Pure bookkeeping over the ``start`` it is given: MPI's ``Iallreduce`` with ``BAND``
(``transport.control``) or an in-memory one in tests.
"""

import numpy as np

from ringtrain.errors import RingtrainError

_ALL_ONES = (1 << 64) - 1
_HEAD = 3  # words before the slots: rank 0's batches, a fingerprint, and its inverse
# A result with more slots than this is read with NumPy; fewer, bit by bit in Python.
_FEW = 24


def slot_count(cache_capacity: int) -> int:
    """Return the slots of a round for ``cache_capacity`` cache ids: a multiple of 64."""
    return -(-cache_capacity // 64) * 64


class Rounds:
    """One rank's agreement rounds: its ready slots, the round in flight, the last result.

    ``start(vector)`` starts the AND of every rank's ``vector`` (uint64) and returns an
    object whose ``test()`` returns the result once every rank has started the same round,
    None before. ``coordinator``: this is rank 0, whose word 0 counts its batches. The
    vector is three words and ``slots`` bits: ``slots`` a multiple of 64 (``slot_count``).
    """

    def __init__(self, slots: int, start, coordinator: bool):
        self.slots = slots
        self._start = start
        self._coordinator = coordinator
        self.started = 0  # rounds this rank has started
        self.completed = 0  # of them, those whose result is in
        # The round in flight: (request, this rank's ready bits, its vector, its word 0).
        self._flight = None
        self._ready: set[int] = set()  # slots of this rank's submissions ready to run
        self._changed = True  # the ready slots changed since the last round started
        self.result: tuple[list[int], int] | None = None  # the last round's, until run
        # With it: the AND and the OR of every rank's fingerprint of its round before.
        self.fingerprints: tuple[int, int] = (0, 0)

    def ready(self, slot: int) -> None:
        """Mark this rank's submission counted under cache slot ``slot`` ready to run."""
        self._ready.add(slot)
        self._changed = True

    def unready(self, slot: int) -> None:
        """Take ``slot`` out of this rank's next rounds (run, evicted or withdrawn)."""
        if slot in self._ready:
            self._ready.discard(slot)
            self._changed = True

    def has_ready(self) -> bool:
        """Return True if this rank has submissions ready for a round."""
        return bool(self._ready)

    def in_flight(self) -> bool:
        """Return True while a round this rank started has no result yet."""
        return self._flight is not None

    def offered(self, slot: int) -> bool:
        """Return True if a round may still agree ``slot`` with this rank's bit.

        That is the round in flight, where this rank's vector had the bit, or the last
        round, whose result has not run yet and has the slot.
        """
        if self.result is not None and slot in self.result[0]:
            return True
        return self._flight is not None and bool(self._flight[1] >> slot & 1)

    def wants_round(self, needed: int) -> bool:
        """Return True if this rank should start a round now.

        It should where none is in flight and it has ready slots that changed since its
        last round, or a batch tagged with round ``needed`` or later has come (the ranks
        that started that round wait for this one).
        """
        if self._flight is not None or self.result is not None:
            return False
        return needed > self.started or (bool(self._ready) and self._changed)

    def start(self, batches_sent: int = 0, fingerprint: int = 0) -> None:
        """Start the next round with this rank's ready slots.

        ``batches_sent``: rank 0's count of its batches; ``fingerprint``: 64 bits that
        stand for what this rank ran in its last round (``fingerprints``).
        """
        bits = 0
        for slot in self._ready:
            bits |= 1 << slot
        first = batches_sent if self._coordinator else _ALL_ONES
        head = first | fingerprint << 64 | (fingerprint ^ _ALL_ONES) << 128
        wire = head.to_bytes(24, "little") + bits.to_bytes(self.slots // 8, "little")
        vector = np.frombuffer(wire, np.uint64)
        # The vector stays referenced until the round ends: MPI reads it meanwhile.
        self._flight = (self._start(vector), bits, vector, first)
        self.started += 1
        self._changed = False

    def poll(self) -> bool:
        """Take the result of the round in flight if it is in; return True if it came.

        ``result`` then holds the slots agreed (ascending) and rank 0's batch count.
        """
        if self._flight is None:
            return False
        out = self._flight[0].test()
        if out is None:
            return False
        first = self._flight[3]
        self._flight = None
        if self._coordinator and int(out[0]) != first:
            raise RingtrainError(
                f"agreement round {self.completed + 1}: word 0 came back as {int(out[0])}, not "
                f"the {first} batches rank 0 gave (the others give all ones): the round's "
                "vectors were overwritten in flight"
            )
        self.completed += 1
        bits = int.from_bytes(out[_HEAD:].tobytes(), "little")
        if bits.bit_count() > _FEW:
            ones = np.unpackbits(out[_HEAD:].view(np.uint8), bitorder="little")
            slots = np.flatnonzero(ones).tolist()
        else:
            slots = []
            while bits:
                low = bits & -bits
                slots.append(low.bit_length() - 1)
                bits ^= low
        self.result = (slots, int(out[0]))
        self.fingerprints = (int(out[1]), int(out[2]) ^ _ALL_ONES)
        return True
