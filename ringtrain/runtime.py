"""The runtime: what ``init()`` creates on this rank, in one owner that ``shutdown()`` undoes.

A ``Runtime`` holds a communicator of its own (a duplicate of the user's, made before anything
else runs on it), the topology found on it, this rank's core binding, the whole job's engine,
the registered process sets and the counts of unnamed collectives per call site. Horovod's API is
module functions, so one runtime is current at a time: ``start`` makes it, ``current`` returns
it, ``stop`` shuts it down.
"""

import atexit
import dataclasses
import itertools

from ringtrain import affinity, mpi_tuning
from ringtrain.engine.messages import unnamed_name
from ringtrain.engine.tuning import space as tuning_space
from ringtrain.errors import NotInitializedError, RingtrainError
from ringtrain.process_sets import ProcessSet, ProcessSetRegistry, global_process_set
from ringtrain.settings import Settings
from ringtrain.topology import discover

_current = None  # the Runtime between start() and stop()


class Runtime:
    """Everything ringtrain holds for this rank between ``init()`` and ``shutdown()``."""

    def __init__(self, comm, settings: Settings):
        """Start on ``comm``, which the runtime owns from now on (collective over it)."""
        from ringtrain.engine.core import Engine

        self.comm = comm
        self.settings = settings
        self.topology = discover(comm)
        # Before the engine starts its thread, which then runs where the rank's other threads do.
        self.binding = affinity.bind_ranks(comm, self.topology, settings.bind_cores)
        self.engine = Engine.over(comm, settings, self.topology)
        self.process_sets = ProcessSetRegistry()
        self._counters: dict[tuple[int | None, str, str], itertools.count] = {}
        global_process_set.ranks = list(range(self.topology.size))
        global_process_set.bind(0, self.topology.rank, self.engine)

    def add_process_set(self, process_set: ProcessSet) -> None:
        """Register ``process_set``, which every rank has agreed on (collective over the job).

        Its ranks split a communicator off the runtime's and start an engine on it, which
        records no timeline and is not tuned.
        """
        from mpi4py import MPI

        from ringtrain.engine.core import Engine

        rank = self.topology.rank
        member = rank in process_set.ranks
        comm = self.comm.Split(0 if member else MPI.UNDEFINED, rank)
        engine = None
        if member:
            settings = dataclasses.replace(self.settings, timeline=None, autotune=False)
            engine = Engine.over(comm, settings, discover(comm))
        self.process_sets.add(process_set, rank, comm, engine)

    def unnamed(self, kind: str, process_set: ProcessSet | None, site: str) -> str:
        """Return the name of the next unnamed ``kind`` call from ``site`` over ``process_set``.

        Calls are counted per site, kind and process set (None: every rank); the name holds
        the site and the count (``messages.unnamed_name``).
        """
        process_set_id = 0 if process_set is None else process_set.process_set_id
        count = self._counters.setdefault((process_set_id, kind, site), itertools.count())
        return unnamed_name(kind, site, next(count))

    def shutdown(self) -> None:
        """Stop every engine (pending handles fail), unpin the threads, free the communicator."""
        self.process_sets.clear()
        global_process_set.unbind()
        self.engine.shutdown()
        affinity.unbind(self.binding)
        self.comm.Free()


def start(comm, settings: Settings) -> None:
    """Make a runtime on ``comm`` (a communicator, a list of world ranks, or None) current.

    None means ``MPI.COMM_WORLD``. Collective over ``comm``; call it while none is current.
    """
    global _current
    mpi_tuning.apply(tuning_space.largest_chunk(settings))
    # Imported here, not at the top: importing mpi4py.MPI initialises MPI, which a launcher
    # process or a script that sets mpi4py.rc first must not have done for it.
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RingtrainError(
            f"MPI was initialised with thread level {MPI.Query_thread()}, but ringtrain needs "
            f"MPI_THREAD_MULTIPLE ({MPI.THREAD_MULTIPLE}); leave mpi4py.rc.thread_level at "
            "its default 'multiple'"
        )
    _current = Runtime(_own_communicator(comm, MPI), settings)
    atexit.register(stop)


def _own_communicator(comm, MPI):
    """Return a new communicator over ``comm``'s ranks: its duplicate, or the listed ranks'."""
    world = MPI.COMM_WORLD
    if comm is None:
        return world.Dup()
    if isinstance(comm, MPI.Comm):
        return comm.Dup()
    ranks = [int(r) for r in comm]
    bad = [r for r in ranks if not 0 <= r < world.Get_size()]
    if bad or len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(
            f"init(comm=...) got ranks {ranks}; expected distinct ranks in [0, {world.Get_size()})"
        )
    if world.Get_rank() not in ranks:
        raise ValueError(
            f"this process is world rank {world.Get_rank()}, which is not in the ranks given "
            f"to init(): {ranks}"
        )
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def stop() -> None:
    """Shut the current runtime down and forget it; nothing happens if none is current."""
    global _current
    atexit.unregister(stop)
    if _current is not None:
        runtime, _current = _current, None
        runtime.shutdown()


def current() -> Runtime:
    """Return the current runtime, or raise ``NotInitializedError`` if there is none."""
    if _current is None:
        raise NotInitializedError("ringtrain is not initialised: call ringtrain.init() first")
    return _current


def is_running() -> bool:
    """Return True while a runtime is current: between ``init()`` and ``shutdown()``."""
    return _current is not None
