"""The fusion planner: which ready allreduces share one fusion buffer (a pure function)."""

import math

from ringtrain.dtypes import SUPPORTED, reduction_dtype

_ITEMSIZE_IN_BUFFER = {str(d): reduction_dtype(d).itemsize for d in SUPPORTED}


def fusion_key(meta) -> tuple:
    """Return what tensors must share to be reduced together: dtype, op, scales, wire dtype."""
    return (meta.dtype, meta.op, meta.prescale, meta.postscale, meta.compression)


def nbytes_in_buffer(meta) -> int:
    """Return the bytes ``meta``'s tensor takes in a fusion buffer (16-bit floats widen)."""
    return math.prod(meta.shape) * _ITEMSIZE_IN_BUFFER[meta.dtype]


def plan(metas, threshold: int) -> list[list]:
    """Group ``metas`` (a grouped allreduce is one meta) into fusions of up to ``threshold`` bytes.

    Metas are taken in order; one joins the open fusion of its key while the total stays
    within ``threshold`` bytes, else it starts a new one. A meta larger than the threshold is
    a fusion of its own. The result lists fusions in the order their first meta came.
    """
    fusions: list[list] = []
    open_by_key: dict[tuple, tuple[list, int]] = {}
    for meta in metas:
        key = fusion_key(meta)
        size = nbytes_in_buffer(meta)
        current = open_by_key.get(key)
        if current is not None and current[1] + size <= threshold:
            current[0].append(meta)
            open_by_key[key] = (current[0], current[1] + size)
            continue
        fusion = [meta]
        fusions.append(fusion)
        open_by_key[key] = (fusion, size)
    return fusions
