"""What ranks tell the coordinator, and what the coordinator tells every rank."""

import dataclasses
import operator
import typing

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
REDUCESCATTER = "reducescatter"
JOIN = "join"

JOIN_NAME = "__ringtrain_join__"

# Unnamed calls are named ``<kind>.noname@<call site>#<count>``: the count is of the calls of
# that kind made from that site (see ``unnamed_name``).
_UNNAMED = ".noname@"


class Meta(typing.NamedTuple):
    """What a rank submitted under one name: everything but the data.

    A named tuple: cheap to build, compare, hash and pickle on the per-tensor path.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple
    op: int = 1
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    splits: tuple | None = None
    group: tuple | None = None  # a grouped allreduce: its members' shapes; shape is (total,)
    compression: str | None = None  # an allreduce's 16-bit wire dtype ("float16", "bfloat16")


def unnamed_name(kind: str, site: str, count: int) -> str:
    """Return the name of the ``count``-th unnamed ``kind`` call made at ``site`` (0: first)."""
    return f"{kind}{_UNNAMED}{site}#{count}"


def unnamed_call(name: str) -> str | None:
    """Return how errors show the unnamed call named ``name``; None for a name a user gave.

    ``allreduce #3 at train.py:42`` for ``unnamed_name("allreduce", "train.py:42", 3)``; a
    part of it (a group's member ``.0``, ``.lengths``, ...) adds ``, part 0``.
    """
    kind, unnamed, rest = name.partition(_UNNAMED)
    if not unnamed:
        return None
    site, _, numbered = rest.rpartition("#")
    count, _, part = numbered.partition(".")
    return f"{kind} #{count} at {site}" + (f", part {part}" if part else "")


class Withdrawal(typing.NamedTuple):
    """A rank takes back its submission of ``name``, which its caller no longer waits for.

    ``counted``: the submission was counted for the agreement rounds (``engine.rounds``),
    not sent whole, and no round has agreed it: rank 0 evicts the name's cache id.
    """

    name: str
    counted: bool = False


class Suspect(typing.NamedTuple):
    """A rank's counted submission of ``name`` has waited long: evict its cache id.

    Rank 0 then takes every rank's submission of ``name`` whole, where the stall check, the
    silence check and the mismatch check see it.
    """

    name: str


# Fields that must agree across ranks, per kind. A field missing here may differ.
AGREED_FIELDS = {
    ALLREDUCE: ("dtype", "group", "shape", "op", "prescale", "postscale", "compression"),
    REDUCESCATTER: ("dtype", "shape", "op", "prescale", "postscale"),
    ALLGATHER: ("dtype", "trailing_shape"),
    BROADCAST: ("dtype", "shape", "root"),
    ALLTOALL: ("dtype", "trailing_shape"),
    JOIN: (),
}


def member_shapes(meta: Meta) -> tuple:
    """Return the shapes of the tensors ``meta`` stands for: a group's members, or its own."""
    return meta.group if meta.group is not None else (meta.shape,)


def field_value(meta: Meta, field: str):
    """Return ``meta``'s value of ``field``; ``trailing_shape`` is the shape past dimension 0."""
    if field == "trailing_shape":
        return meta.shape[1:] if meta.shape else None
    return getattr(meta, field)


@dataclasses.dataclass
class Response:
    """One decision of the coordinator that every rank carries out in the same order.

    ``metas`` holds, per name, the meta of the lowest rank that submitted it (left empty for
    an allreduce that no rank has joined: each rank then has its own); ``per_rank``
    holds, per name, every rank's meta (None for a rank that has joined) where the kind needs
    them; ``error`` fails every handle of ``names``; kind ``stop`` ends every engine; kind
    ``withdrawn`` tells rank ``withdrawn_by`` that its submissions of ``names`` are
    forgotten; ``cache_ids`` gives, per name, the cache id that every rank's submissions of
    it go by from now on (agreed in rounds, ``engine.rounds``), and for kind ``evicted``
    the ids that no longer stand for their names (each rank sends its counted submissions
    of those names whole); kinds ``stalled`` and ``drifted`` fail the handles of ``names`` on the
    ``ranks`` listed only (the stall shutdown, and the drift check of unnamed calls: the
    coordinator has forgotten those submissions); kind ``tuned`` gives the ``settings`` that
    every rank runs the responses after it under (``engine.tuning``).
    """

    kind: str
    names: list
    metas: list = dataclasses.field(default_factory=list)
    per_rank: list | None = None
    joined: tuple = ()
    error: str | None = None
    cache_ids: dict = dataclasses.field(default_factory=dict)
    last_joined: int = -1
    withdrawn_by: int = -1
    ranks: tuple = ()
    settings: dict | None = None


_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(Response)))


def to_wire(responses: list[Response]) -> list[tuple]:
    """Return ``responses`` as tuples of their fields, which pickle in half the time."""
    return [_FIELDS(r) for r in responses]


def from_wire(rows: list[tuple]) -> list[Response]:
    """Return the responses that ``to_wire`` turned into ``rows``."""
    return [Response(*row) for row in rows]


STOP = "stop"
EVICTED = "evicted"
WITHDRAWN = "withdrawn"
STALLED = "stalled"
DRIFTED = "drifted"
TUNED = "tuned"
SHUTDOWN_REQUEST = "shutdown"
FINISHED = "finished"  # a rank's last control message, after it has stopped
