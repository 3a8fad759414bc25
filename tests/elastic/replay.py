"""Check what tests/elastic/numpy_job.py wrote: every step once, and the weights they give."""

import json

import numpy as np
from numpy_job import LENGTH, gradient


def replayed(history):
    """Return the weights that ``history``'s (step, size, launch) entries give, in NumPy."""
    weights = np.zeros(LENGTH)
    for step, size, _ in history:
        mean = np.mean([gradient(rank, step) for rank in range(size)], axis=0)
        weights = weights - 0.1 * mean
    return weights


def checked_result(path, steps):
    """Return the job's result from ``path`` once its history and weights are checked.

    Steps 0 to ``steps - 1`` must each appear once, in order, and the weights must be what
    they give at the world sizes they ran at.
    """
    with open(path) as file:
        result = json.load(file)
    assert [step for step, _, _ in result["history"]] == list(range(steps))
    np.testing.assert_allclose(result["weights"], replayed(result["history"]), rtol=1e-12)
    return result
