"""Process sets: subsets of the job's ranks that run collectives among themselves.

Horovod's names: make a ``ProcessSet`` from a list of ranks, register it with
``init(process_sets=[...])`` or ``add_process_set``, and pass it as ``process_set=`` to a
collective. Every rank must register and remove the same sets in the same order: a set's id
is its place in that order. The ranks of a set run its collectives on an engine of their
own (its own thread and communicators); the other ranks hold none. ``global_process_set``
stands for every rank.
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
