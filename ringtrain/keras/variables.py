"""Keras variables and values across ranks, on every backend: broadcasts and reductions.

On TensorFlow ``broadcast_variables`` is ``ringtrain.tensorflow``'s. Elsewhere the values
cross as NumPy arrays through the framework-neutral hand-over (``ringtrain.exchange``), so
ranks that hold different numbers of variables fail at once, naming the counts.
"""

import numpy as np

from ringtrain import api
from ringtrain.dtypes import SUPPORTED
from ringtrain.exchange import DENSE, Handover, Part, broadcaster, set_site
from ringtrain.keras import bridges
from ringtrain.keras.labels import variable_label

_ENGINE_DTYPES = frozenset(np.dtype(d) for d in SUPPORTED)


def broadcast_variables(variables, root_rank=0, process_set=None, inplace=False):
    """Assign ``root_rank``'s value to each of ``variables`` on every rank.

    ``inplace`` is Horovod's and changes nothing: the variables are always assigned to.
    """
    variables = list(variables)
    if bridges.backend() == "tensorflow":
        from ringtrain.tensorflow.collectives import broadcast_variables as in_tensorflow

        in_tensorflow(variables, root_rank, process_set)
        return
    originals = [_array(v) for v in variables]
    arrays = [_on_wire(a) for a in originals]
    site = set_site("broadcast_variables", process_set)
    start = broadcaster(root_rank, process_set)
    parts = [Part(i, "", start, a.nbytes, False) for i, a in enumerate(arrays)]
    labels = [variable_label(v, i) for i, v in enumerate(variables)]
    handover = Handover(site, [DENSE] * len(arrays), labels, parts, 0, process_set)
    results = handover.collect(handover.submit_all(arrays))
    for variable, original, result in zip(variables, originals, results, strict=True):
        variable.assign(result.view(original.dtype).reshape(original.shape))


def _array(value):
    """Return ``value`` (any tensor-like of the backend) as a C-contiguous NumPy array."""
    return np.asarray(bridges.for_backend().to_numpy(value), order="C")


def _on_wire(array):
    """Return ``array`` contiguous, as its bytes where the engine does not carry its dtype."""
    array = np.asarray(array, order="C")
    return array if array.dtype in _ENGINE_DTYPES else array.view(np.uint8)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None):
    """Return ``value`` (any tensor-like) reduced over all ranks (default op Average), as NumPy."""
    return api.allreduce(
        _array(value),
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )


def allgather(value, name=None):
    """Return every rank's ``value`` concatenated along dimension 0, as a NumPy value."""
    return api.allgather(_array(value), name=name)


def broadcast(value, root_rank, name=None):
    """Return ``root_rank``'s ``value`` on every rank, as a NumPy value."""
    return api.broadcast(_array(value), root_rank, name=name)
