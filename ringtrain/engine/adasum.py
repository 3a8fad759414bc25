"""Adasum, Horovod's adaptive sum of gradients (Maleki et al.), one tensor at a time.

Two gradients a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their mean
where they point the same way, their sum where they are orthogonal (a zero vector counts
as orthogonal to everything). Over 2^k ranks the combinations form a binary tree: at
level l, ranks r and r ^ 2^l swap their vectors and both combine them, the lower rank's
first, so after k levels every rank holds the same result. Everything runs in float64,
with sums in a fixed order (compiled, never reassociated), so partners compute the same
bits wherever their buffers lie.
"""

import numpy as np

from ringtrain.kernels.cpu import njit

_TAG = 8  # on the executor's communicator; the message ring uses 7


@njit
def _combine(a, b, out):
    """Write the Adasum of float64 vectors ``a`` and ``b`` to ``out``."""
    ab = 0.0
    aa = 0.0
    bb = 0.0
    for i in range(a.size):
        ab += a[i] * b[i]
        aa += a[i] * a[i]
        bb += b[i] * b[i]
    ca = 1.0 - ab / (2.0 * aa) if aa > 0.0 else 1.0
    cb = 1.0 - ab / (2.0 * bb) if bb > 0.0 else 1.0
    for i in range(a.size):
        out[i] = ca * a[i] + cb * b[i]


def adasum(comm, vector: np.ndarray) -> np.ndarray:
    """Return the Adasum over ``comm``'s ranks (a power of two) of each one's 1-D ``vector``.

    ``vector`` is float64; collective over ``comm``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    current, theirs = vector, np.empty_like(vector)
    distance = 1
    while distance < size:
        partner = rank ^ distance
        comm.Sendrecv(current, partner, _TAG, theirs, partner, _TAG)
        lower, upper = (current, theirs) if rank < partner else (theirs, current)
        combined = np.empty_like(vector)
        _combine(lower, upper, combined)
        current = combined
        distance <<= 1
    return current
