"""A step's gradients on Keras's JAX and PyTorch backends, reduced through ``ringtrain.exchange``.

The backend's bridge (``bridges``) turns them into NumPy arrays and runs the hand-over where
the backend can: eagerly on PyTorch, from a host callback inside the jitted step on JAX.
"""

import numpy as np

from ringtrain.exchange import (
    DENSE,
    NO_TENSOR,
    Handover,
    Part,
    alone,
    bucket_bytes,
    predivide_factor,
    reducer,
    set_site,
    withdraw,
)
from ringtrain.keras import bridges
from ringtrain.keras.labels import variable_label
from ringtrain.ops import Average, as_reduce_op


class GradientExchange:
    """How one optimizer's gradients are reduced: the settings, and a hand-over per layout.

    ``gradient_predivide_factor`` f (op Average only) divides by f before the sum and by
    size / f after it, as in Horovod. ``process_set``: the ranks to reduce over (None:
    every rank).
    """

    def __init__(self, op=Average, gradient_predivide_factor=1.0, process_set=None):
        self.op = as_reduce_op(op)
        factor = predivide_factor(gradient_predivide_factor, self.op)
        self.gradient_predivide_factor = factor
        self.process_set = process_set
        self.start = reducer(self.op, 1.0 / factor, factor, False, process_set)  # a Part.start
        self._handovers: dict[tuple, Handover] = {}  # layout -> its hand-over, planned once
        self.bridge = bridges.for_backend()

    def __call__(self, grads, variables, site, submitted=None) -> list:
        """Return ``grads`` (of ``variables``, which name them) reduced; None entries stay None.

        ``submitted``: entry -> the handle of its gradient, where a backprop hook submitted
        it already (``backprop.BackpropSubmissions``).
        """
        if alone(self.process_set):  # nothing to exchange, as in Horovod
            return list(grads)
        labels = [variable_label(v, i) for i, v in enumerate(variables)]
        present = [i for i, g in enumerate(grads) if g is not None]

        def reduce(*arrays):
            full = [None] * len(grads)
            for i, array in zip(present, arrays, strict=True):
                full[i] = array
            reduced = self.reduce_arrays(full, labels, site, submitted)
            return [reduced[i] for i in present]

        results = self.bridge.on_host(reduce, [grads[i] for i in present])
        out = [None] * len(grads)
        for i, result in zip(present, results, strict=True):
            out[i] = result
        return out

    def reduce_arrays(self, arrays, labels, site, submitted=None) -> list:
        """Return NumPy ``arrays`` reduced over the ranks (None entries stay None).

        ``submitted`` as in ``__call__``: those entries are not submitted again.
        """
        layout = tuple(None if a is None else (a.shape, a.dtype.str) for a in arrays)
        handover = self._handovers.get((site, layout))
        if handover is None:
            handover = self._handovers[site, layout] = self._plan(arrays, labels, site)
        present = [np.asarray(arrays[p.entry], order="C") for p in handover.parts]
        if submitted:
            handles = [handover.submit_manifest()]
            for j, part in enumerate(handover.parts):
                handle = submitted.pop(part.entry, None)
                handles.append(
                    handle if handle is not None else handover.submit_part(j, present[j])
                )
            if submitted:  # submitted, yet no gradient now: nobody waits for them
                withdraw(list(submitted.values()), self.process_set)
        else:
            handles = handover.submit_all(present)
        results = handover.collect(handles)
        out = [None] * len(arrays)
        for part, result in zip(handover.parts, results, strict=True):
            out[part.entry] = result
        return out

    def _plan(self, arrays, labels, site):
        parts = [
            Part(i, "", self.start, arrays[i].nbytes, True, arrays[i].dtype)
            for i in reversed(range(len(arrays)))  # the last layers' first, as backprop
            if arrays[i] is not None
        ]
        kinds = [NO_TENSOR if a is None else DENSE for a in arrays]
        return Handover(site, kinds, labels, parts, bucket_bytes(), self.process_set)

    def site(self, base) -> str:
        """Return the names' prefix for ``base`` (``exchange.set_site``)."""
        return set_site(base, self.process_set)

    def get_config(self) -> dict:
        """Return the settings as plain values (for a Keras optimizer's config)."""
        return {
            "op": self.op.name,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "process_set": None if self.process_set is None else list(self.process_set.ranks),
        }
