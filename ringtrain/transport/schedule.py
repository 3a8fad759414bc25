"""The ring schedule as pure functions of (rank, size, length): which segment moves when.

A ring allreduce over ``p`` ranks cuts the data into ``p`` segments and runs ``2(p-1)`` steps.
In each step every rank sends one segment to its right neighbour and receives one from its
left neighbour, so each rank moves ``2(p-1)/p`` of the data in all, whatever ``p`` is.

Reduce-scatter, steps ``s = 0 .. p-2``: rank ``r`` sends segment ``(r-s-1) % p`` and receives
segment ``(r-s-2) % p``, which it combines with its own contribution. The segment received at
step ``s`` is the one sent at step ``s+1``, so partial sums travel round the ring and, after
the last step, rank ``r`` holds segment ``r`` reduced over every rank.

Allgather, steps ``s = 0 .. p-2``: rank ``r`` sends segment ``(r-s) % p`` (at ``s = 0`` its own
finished segment) and receives segment ``(r-s-1) % p``, which it stores and forwards at the
next step. After it every rank holds every finished segment, copied bit for bit from the rank
that finished it.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the ring for one rank: the segment it sends and the one it receives."""

    reduce: bool
    send: int
    recv: int


def segment_bounds(length: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """Split ``length`` elements into ``parts`` (start, stop) ranges, whole ``unit``s each.

    When the units do not divide evenly, the first segments get one unit more.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if unit < 1 or length % unit:
        raise ValueError(f"length {length} is not a whole number of units of {unit}")
    units = length // unit
    base, extra = divmod(units, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + (base + (1 if i < extra else 0)) * unit
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_steps(rank: int, size: int, allgather: bool = True) -> list[Step]:
    """Return rank ``rank``'s steps: reduce-scatter, then (optionally) allgather."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a world of size {size}")
    steps = [Step(True, (rank - s - 1) % size, (rank - s - 2) % size) for s in range(size - 1)]
    if allgather:
        steps += [Step(False, (rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]
    return steps


def chunks(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """Cut the range [start, stop) into consecutive pieces of at most ``chunk`` elements."""
    return [(lo, min(lo + chunk, stop)) for lo in range(start, stop, chunk)]


def ring_pieces(steps: list[Step], bounds, chunk: int):
    """Return the chunks a ring sends first, and the (step, lo, hi) it receives, in order.

    ``bounds`` are the segments' (start, stop); ``chunk`` is in elements.
    """
    first = chunks(*bounds[steps[0].send], chunk)
    recvs = [
        (t, lo, hi) for t, step in enumerate(steps) for lo, hi in chunks(*bounds[step.recv], chunk)
    ]
    return first, recvs


def input_reads(rank: int, size: int, bounds, chunk: int) -> list[tuple[int, int]]:
    """Return the pieces of its input that ``rank``'s ring (with allgather) reads, in order.

    Each piece is read once: sent at the first step, or combined with a received one.
    """
    steps = ring_steps(rank, size)
    first, recvs = ring_pieces(steps, bounds, chunk)
    return first + [(lo, hi) for t, lo, hi in recvs if steps[t].reduce]


def output_order(rank: int, size: int, bounds, chunk: int) -> list[tuple[int, int]]:
    """Return the pieces of ``rank``'s output in the order its ring (with allgather) ends them.

    Its own segment ends as each piece is reduced at the last reduce step; every other
    segment as each piece of it arrives in the allgather.
    """
    _, recvs = ring_pieces(ring_steps(rank, size), bounds, chunk)
    return [(lo, hi) for t, lo, hi in recvs if t >= size - 2]


def outputs(size: int) -> list[list[int]]:
    """Return, per rank, the segments it produces in order when it reads its left neighbour.

    The first is its own input's share of one segment; it reduces each later one from the
    left neighbour's output before it and its own input. The last is its own segment,
    finished.
    """
    return [[(q - j - 1) % size for j in range(size)] for q in range(size)]
