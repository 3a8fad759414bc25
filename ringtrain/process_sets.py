"""Process sets: subsets of the job's ranks that run collectives among themselves.

Horovod's names: make a ``ProcessSet`` from a list of ranks, register it with
``init(process_sets=[...])`` or ``add_process_set``, and pass it as ``process_set=`` to a
collective. Every rank must register and remove the same sets in the same order: a set's id
is its place in that order. The ranks of a set run its collectives on an engine of their
own (its own thread and communicators); the other ranks hold none. ``global_process_set``
stands for every rank. A ``ProcessSetRegistry`` holds the sets registered with one runtime.
"""

import operator


class ProcessSet:
    """A set of ranks that run collectives together; ranks are those of ``init()``'s job."""

    def __init__(self, ranks):
        try:
            listed = list(ranks)
        except TypeError:
            raise TypeError(f"a process set takes a list of ranks, got {ranks!r}") from None
        try:
            if any(isinstance(r, bool) for r in listed):
                raise TypeError
            listed = [operator.index(r) for r in listed]  # ints, NumPy's too
        except TypeError:
            raise TypeError(f"a process set's ranks must be ints, got {listed!r}") from None
        if not listed or len(set(listed)) != len(listed):
            raise ValueError(f"a process set needs distinct ranks, at least one; got {listed}")
        self.ranks = sorted(listed)
        self.process_set_id = None  # set while registered
        self.engine = None  # this rank's engine for the set while registered, if it is in it
        self._rank = None

    def size(self):
        """Return the number of ranks in the set, or None while it is not registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """Return this process's index in ``ranks``; None if not in it or not registered.

        As in Horovod, ``root_rank`` arguments stay ranks of the whole job, not this index.
        """
        return self._rank

    def included(self):
        """Return whether this process is in the set; None while it is not registered."""
        return None if self.process_set_id is None else self._rank is not None

    def bind(self, process_set_id, rank, engine) -> None:
        """Mark the set registered under ``process_set_id``; ``engine`` is None outside it."""
        self.process_set_id = process_set_id
        self._rank = self.ranks.index(rank) if rank in self.ranks else None
        self.engine = engine

    def unbind(self) -> None:
        """Mark the set no longer registered."""
        self.process_set_id, self._rank, self.engine = None, None, None

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([0])  # its ranks and engine are the job's while initialised


def resolve(process_set) -> ProcessSet:
    """Return ``process_set``, or ``global_process_set`` for None."""
    return global_process_set if process_set is None else process_set


class ProcessSetRegistry:
    """The process sets registered with one runtime (not ``global_process_set``), by id.

    It also counts the sets added and the removals begun: their agreements are collectives
    over the whole job, named by these counts.
    """

    def __init__(self):
        self._sets: dict[int, tuple[ProcessSet, object]] = {}  # id -> (set, comm or COMM_NULL)
        self.added = 0
        self._removals = 0

    def add(self, process_set, rank, comm, engine) -> None:
        """Register ``process_set`` under the next id; ``comm`` and ``engine`` are this rank's.

        Outside the set, ``comm`` is ``COMM_NULL`` and ``engine`` None.
        """
        self.added += 1  # ids start at 1: 0 is the whole job's
        process_set.bind(self.added, rank, engine)
        self._sets[self.added] = (process_set, comm)

    def begin_removal(self) -> int:
        """Count a removal that ranks are about to agree on; return its number."""
        self._removals += 1
        return self._removals - 1

    def remove(self, process_set) -> None:
        """Stop this rank's engine of ``process_set``, free its communicator, forget it."""
        _, comm = self._sets.pop(process_set.process_set_id)
        if process_set.engine is not None:
            process_set.engine.shutdown()
            comm.Free()
        process_set.unbind()

    def clear(self) -> None:
        """Remove every registered set."""
        for process_set, _ in list(self._sets.values()):
            self.remove(process_set)

    def holds(self, process_set) -> bool:
        """Return whether ``process_set`` is registered here (itself, not one of its ranks)."""
        registered = self._sets.get(getattr(process_set, "process_set_id", None))
        return registered is not None and registered[0] is process_set

    def with_ranks(self, ranks) -> ProcessSet | None:
        """Return the registered set of exactly ``ranks`` (sorted), or None."""
        return next((known for known, _ in self._sets.values() if known.ranks == ranks), None)

    def by_id(self, process_set_id) -> ProcessSet:
        """Return the set registered as ``process_set_id`` (0: ``global_process_set``)."""
        if process_set_id == 0:
            return global_process_set
        registered = self._sets.get(process_set_id)
        if registered is None:
            known = [0, *sorted(self._sets)]
            raise ValueError(f"no process set has id {process_set_id!r}; registered: {known}")
        return registered[0]
