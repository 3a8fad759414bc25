"""The contract every route keeps: the calls it carries, the memory it takes, and what it returns.

A route (``routes``) is an object with ``memory`` (the ``Memory`` its calls' arrays may live
in), ``collectives`` (the ``choice.Collective``s it carries) and one method, ``run(call)``,
which carries one call below and returns ``Carried``. ``router.Transport`` builds each call,
picks its route once by the pure rule ``choice.choose``, and hands the call over.
"""

import dataclasses
import enum
import typing

from ringtrain.transport.choice import Collective


class Memory(enum.Flag):
    """Where a call's arrays live."""

    HOST = enum.auto()
    DEVICE = enum.auto()


# What a route returns: the pair (result, reduced_ns), the call's result array and the
# ``perf_counter_ns`` time its reduce-scatter part ended (for calls that reduce nothing,
# their end). A plain tuple: a lone call pays for no named one.
Carried = tuple[object, int]


@dataclasses.dataclass(slots=True)
class Reduce:
    """Reduce 1-D ``src`` over all ranks into ``dst``, times ``postscale``.

    ``collective``: ALLREDUCE (every rank ends with all of ``dst``, bitwise the same) or
    REDUCE_SCATTER (``dst[bounds[rank]]`` holds this rank's part). ``dst`` may be ``src``,
    or None: the route makes the result, ``new(len(src))``, or a read-only array that the
    host's ranks share where every rank passes ``read_only`` and its ring can. ``codec``: the
    ``codec.WireCodec`` that partial sums cross the link through, or None.
    """

    collective: Collective
    src: object
    dst: object
    op: object
    postscale: float
    bounds: tuple
    codec: object = None
    new: object = None
    read_only: bool = False

    @property
    def nbytes(self) -> int:
        """Return the bytes of the call's input."""
        return self.src.nbytes


@dataclasses.dataclass(slots=True)
class Allgather:
    """Gather every rank's bytes ``send`` into ``recv``: rank r's at ``displacements[r]``."""

    send: object
    recv: object
    counts: object
    displacements: object
    collective: typing.ClassVar = Collective.ALLGATHER

    @property
    def nbytes(self) -> int:
        """Return the bytes gathered."""
        return self.recv.nbytes


@dataclasses.dataclass(slots=True)
class Broadcast:
    """Overwrite the bytes ``buffer`` on every rank with ``root``'s."""

    buffer: object
    root: int
    collective: typing.ClassVar = Collective.BROADCAST

    @property
    def nbytes(self) -> int:
        """Return the bytes broadcast."""
        return self.buffer.nbytes


@dataclasses.dataclass(slots=True)
class Alltoall:
    """Send ``sent[r]`` bytes of ``send`` to rank r, and take ``got[r]`` bytes of ``recv`` from it.

    Each side's pieces lie end to end, in rank order.
    """

    send: object
    sent: object
    recv: object
    got: object
    collective: typing.ClassVar = Collective.ALLTOALL

    @property
    def nbytes(self) -> int:
        """Return the bytes received."""
        return self.recv.nbytes


@dataclasses.dataclass(slots=True)
class Adasum:
    """Combine every rank's ``vector`` by Adasum, in place; ``scratch`` is as large."""

    vector: object
    scratch: object
    collective: typing.ClassVar = Collective.ADASUM

    @property
    def nbytes(self) -> int:
        """Return the bytes of the vector."""
        return self.vector.nbytes


class Route(typing.Protocol):
    """What every route offers (see the module docstring)."""

    memory: Memory
    collectives: frozenset

    def run(self, call) -> Carried:
        """Carry ``call`` (one of this module's calls); return its ``Carried`` pair."""
