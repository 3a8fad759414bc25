"""Reduction operations, numbered as Horovod numbers them."""

import enum


class ReduceOp(enum.IntEnum):
    """A reduction applied element-wise across ranks."""

    Average = 0
    Sum = 1
    Adasum = 2  # allreduce of floating-point tensors only (ringtrain.transport.adasum)
    Min = 3
    Max = 4
    Product = 5


Average = ReduceOp.Average
Sum = ReduceOp.Sum
Adasum = ReduceOp.Adasum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

_BY_VALUE = {int(o): o for o in ReduceOp}


def as_reduce_op(op) -> ReduceOp:
    """Return ``op`` as a ReduceOp, or raise ValueError naming the bad value."""
    try:
        return _BY_VALUE[op]  # what ReduceOp(op) finds, without its two calls per lookup
    except (KeyError, TypeError):
        names = ", ".join(o.name for o in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; expected one of {names}") from None


def resolve_op(op, average=None) -> ReduceOp:
    """Return the op a call asks for: ``op``, or Horovod's older ``average`` flag (default Average).

    ``average=True`` means Average and ``False`` Sum; giving both ``op`` and ``average`` is an
    error.
    """
    if type(op) is ReduceOp and average is None:
        return op
    if average is not None and op is not None:
        raise ValueError(
            f"give op or the older average flag, not both (got op={op!r}, average={average!r})"
        )
    if average is not None:
        return ReduceOp.Average if average else ReduceOp.Sum
    return ReduceOp.Average if op is None else as_reduce_op(op)
