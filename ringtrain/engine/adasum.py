"""Adasum, Horovod's adaptive sum of gradients (Maleki et al.), one tensor at a time.

Two gradients a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their mean
where they point the same way, their sum where they are orthogonal (a zero vector counts
as orthogonal to everything). Over 2^k ranks the combinations form a binary tree: at
level l, ranks r and r ^ 2^l swap their vectors and both combine them, the lower rank's
first, so after k levels every rank holds the same result. Vectors travel and combine in
float32 (float64 for float64 tensors), as Horovod's do; dot products and coefficients are
float64 sums in a fixed order (compiled, never reassociated), so partners compute the
same bits wherever their buffers lie.
"""

import numpy as np

from ringtrain.kernels.cpu import njit

_TAG = 8  # on the executor's communicator; the message ring uses 7


@njit
def _combine(a, b, out):
    """Write the Adasum of vectors ``a`` and ``b`` to ``out`` (which may be either).

    The dot products run in four interleaved partial sums, added up in a fixed order: four
    times as fast as one chain of additions, and the same bits on every rank.
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
    ab = (ab0 + ab1) + (ab2 + ab3)
    aa = (aa0 + aa1) + (aa2 + aa3)
    bb = (bb0 + bb1) + (bb2 + bb3)
    ca = 1.0 - ab / (2.0 * aa) if aa > 0.0 else 1.0
    cb = 1.0 - ab / (2.0 * bb) if bb > 0.0 else 1.0
    for i in range(n):
        out[i] = ca * np.float64(a[i]) + cb * np.float64(b[i])


def adasum(comm, vector: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Replace ``vector`` by the Adasum over ``comm``'s ranks (a power of two) of each one's.

    ``vector`` and ``theirs`` (scratch of the same size) are 1-D, float32 or float64;
    collective over ``comm``. Returns ``vector``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    distance = 1
    while distance < size:
        partner = rank ^ distance
        comm.Sendrecv(vector, partner, _TAG, theirs, partner, _TAG)
        lower, upper = (vector, theirs) if rank < partner else (theirs, vector)
        _combine(lower, upper, vector)
        distance <<= 1
    return vector
