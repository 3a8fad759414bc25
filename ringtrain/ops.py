"""Reduction operations, numbered as Horovod numbers them."""

import enum


class ReduceOp(enum.IntEnum):
    """A reduction applied element-wise across ranks."""

    Average = 0
    Sum = 1
    Min = 3
    Max = 4
    Product = 5


Average = ReduceOp.Average
Sum = ReduceOp.Sum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product


def as_reduce_op(op) -> ReduceOp:
    """Return ``op`` as a ReduceOp, or raise ValueError naming the bad value."""
    try:
        return ReduceOp(op)
    except ValueError:
        names = ", ".join(o.name for o in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; expected one of {names}") from None
