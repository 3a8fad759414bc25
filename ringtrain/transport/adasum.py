"""Adasum, Horovod's adaptive sum of gradients (Maleki et al.), one tensor at a time.

Two gradients a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their mean
where they point the same way, their sum where they are orthogonal (a zero vector counts
as orthogonal to everything). Over 2^k ranks the combinations form a binary tree: at
level l, ranks r and r ^ 2^l combine their two vectors, the lower rank's first. Vectors
travel and combine in float32 (float64 for float64 tensors), as Horovod's do; dot
products and coefficients are float64 sums in a fixed order (compiled, never
reassociated, and added across ranks in rank order), and each element of the result is
computed by one rank only, so every rank ends with the same bits.
"""

import numpy as np

from ringtrain.kernels.cpu import njit


@njit
def _dots(a, b):
    """Return a.b, a.a and b.b as float64 sums in a fixed order.

    Four interleaved partial sums, added up in a fixed order: four times as fast as one
    chain of additions, and the same bits on every rank whatever the buffers' alignment.
    """
    n = a.size
    ab0 = ab1 = ab2 = ab3 = 0.0
    aa0 = aa1 = aa2 = aa3 = 0.0
    bb0 = bb1 = bb2 = bb3 = 0.0
    body = n - n % 4
    for i in range(0, body, 4):
        x0, x1, x2, x3 = (
            np.float64(a[i]),
            np.float64(a[i + 1]),
            np.float64(a[i + 2]),
            np.float64(a[i + 3]),
        )
        y0, y1, y2, y3 = (
            np.float64(b[i]),
            np.float64(b[i + 1]),
            np.float64(b[i + 2]),
            np.float64(b[i + 3]),
        )
        ab0 += x0 * y0
        ab1 += x1 * y1
        ab2 += x2 * y2
        ab3 += x3 * y3
        aa0 += x0 * x0
        aa1 += x1 * x1
        aa2 += x2 * x2
        aa3 += x3 * x3
        bb0 += y0 * y0
        bb1 += y1 * y1
        bb2 += y2 * y2
        bb3 += y3 * y3
    for i in range(body, n):
        x, y = np.float64(a[i]), np.float64(b[i])
        ab0 += x * y
        aa0 += x * x
        bb0 += y * y
    return (ab0 + ab1) + (ab2 + ab3), (aa0 + aa1) + (aa2 + aa3), (bb0 + bb1) + (bb2 + bb3)


@njit
def _mix(a, b, out, ca, cb):
    """Write ca * a + cb * b to ``out`` (which may be ``a`` or ``b``)."""
    for i in range(a.size):
        out[i] = ca * np.float64(a[i]) + cb * np.float64(b[i])


def _coefficients(ab, aa, bb):
    """Return Adasum's weights of a and b from their dot products (a zero vector: 1)."""
    return (1.0 - ab / (2.0 * aa) if aa > 0.0 else 1.0), (
        1.0 - ab / (2.0 * bb) if bb > 0.0 else 1.0
    )


def _group_sum(exchange, rank, group, partial):
    """Return the sum, in member order, of ``partial`` over the ``group`` ranks around ``rank``.

    The members are the ranks that agree on every bit above ``group`` (a power of two);
    they gather each other's rows by recursive doubling, then all add them alike.
    """
    rows = np.zeros((group, partial.size))
    me = rank % group
    rows[me] = partial
    distance = 1
    while distance < group:
        mine = me // distance * distance
        theirs = (me ^ distance) // distance * distance
        exchange(rows[mine : mine + distance], rows[theirs : theirs + distance], rank ^ distance)
        distance <<= 1
    total = rows[0].copy()
    for row in rows[1:]:
        total += row
    return total


def adasum(rank, size, vector: np.ndarray, theirs: np.ndarray, exchange) -> np.ndarray:
    """Replace ``vector`` by the Adasum over ``size`` ranks (a power of two) of each one's.

    ``vector`` and ``theirs`` (scratch of the same size) are 1-D, float32 or float64;
    collective over the ranks. ``exchange(send, recv, partner)`` sends the array ``send`` to
    rank ``partner`` and receives ``recv`` from it (the transport's). Returns ``vector``.

    Vector halving, distance doubling, as Horovod's: at each level partners split the piece
    they share, each keeps a half and receives the partner's copy of it, and every rank
    combines only its half. The dot products of the two whole vectors are the sum of the
    halves' (a group sum over the ranks that hold a piece of the same pair). Then the
    pieces travel back, level by level, until every rank holds the whole result.
    """
    lo, hi = 0, vector.size
    splits = []
    distance = 1
    while distance < size:
        partner = rank ^ distance
        lower = rank < partner
        mid = lo + (hi - lo + 1) // 2
        (keep_lo, keep_hi), (give_lo, give_hi) = (
            ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        )
        exchange(vector[give_lo:give_hi], theirs[keep_lo:keep_hi], partner)
        mine, peer = vector[keep_lo:keep_hi], theirs[keep_lo:keep_hi]
        a, b = (mine, peer) if lower else (peer, mine)
        ab, aa, bb = _group_sum(exchange, rank, 2 * distance, np.array(_dots(a, b)))
        ca, cb = _coefficients(ab, aa, bb)
        _mix(a, b, mine, ca, cb)
        splits.append((lo, hi))
        lo, hi = keep_lo, keep_hi
        distance <<= 1
    while splits:
        distance >>= 1
        partner = rank ^ distance
        whole_lo, whole_hi = splits.pop()
        other_lo, other_hi = (hi, whole_hi) if lo == whole_lo else (whole_lo, lo)
        exchange(vector[lo:hi], vector[other_lo:other_hi], partner)
        lo, hi = whole_lo, whole_hi
    return vector
