"""Progress flags in shared memory: publish a count after the data it covers, wait for a peer's.

A rank that writes data for its neighbours into shared memory then stores a count of what
is ready; a neighbour that reads that count and sees it cover what it needs may read the
data. The store is a release and the load an acquire, so the data is visible before the
count on any processor (on x86 both are plain moves, which it keeps in order).
Counts are unsigned 64-bit words, one per cache line, so ranks never write the same line.
"""

import os
import platform

import numba
import numpy as np
from numba.extending import intrinsic

from ringtrain.kernels.cpu import njit
from ringtrain.transport.progress import SPINS

STRIDE = 8  # words between two flags: a 64-byte cache line each


@intrinsic
def _fence(typingctx, ordering):
    """Emit a memory fence of ``ordering`` (a literal string: "acquire" or "release")."""
    if not isinstance(ordering, numba.types.StringLiteral):
        return None
    order = ordering.literal_value

    def codegen(context, builder, signature, args):
        builder.fence(order)
        return context.get_dummy_value()

    return numba.types.void(ordering), codegen


@njit
def store(flags, index, value):
    """Compiled ``publish``, for compiled callers: store ``value`` after every earlier store."""
    _fence("release")
    flags[index * STRIDE] = value


@njit
def load(flags, index):
    """Compiled ``observe``, for compiled callers: later loads see what the writer published."""
    value = flags[index * STRIDE]
    _fence("acquire")
    return value


def flag_words(count: int) -> int:
    """Return how many uint64 words ``count`` flags take."""
    return count * STRIDE


# x86 keeps stores in order, and loads in order: there a plain store and load suffice (each a
# call that the compiler cannot move other memory accesses across), at a fraction of the cost
# of a compiled call's dispatch. Other processors get the fences.
_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def publish(flags: np.ndarray, index: int, value: int) -> None:
    """Store ``value`` as flag ``index``, after every store made before this call."""
    if _ORDERED:
        flags[index * STRIDE] = value
    else:
        store(flags, index, np.uint64(value))


def observe(flags: np.ndarray, index: int) -> int:
    """Return flag ``index``; what its writer stored before publishing is visible after."""
    if _ORDERED:
        return int(flags[index * STRIDE])
    return int(load(flags, index))


def wait_until(flags: np.ndarray, index: int, target: int, waiter) -> None:
    """Return once flag ``index`` is at least ``target``, waiting through ``waiter``.

    Flags only grow. Flag ``index`` belongs to rank ``index % waiter.size``; a peer that
    never gets there fails the wait after the waiter's timeout (``progress.Waiter``).
    """
    if observe(flags, index) >= target:
        return  # the commonest case: no wait at all
    for _ in range(SPINS):  # the common short wait, inline: no call of the waiter's per poll
        os.sched_yield()
        if observe(flags, index) >= target:
            return
    peer = [index % waiter.size]
    waiter.until(lambda: observe(flags, index) >= target, peer, "a ring through shared memory")


# What a compiled loop over flags returns first (see ``follow``).
DONE, WAIT = 0, 1


@njit
def reached(flags, index, target):
    """Compiled: return True if flag ``index`` is at least ``target`` (its data visible)."""
    return load(flags, index) >= np.uint64(target)


@njit
def waiting(step, index, target):
    """Compiled: the outcome by which a loop asks ``follow`` to wait, then resume at ``step``."""
    return WAIT, np.int64(step), np.int64(index), np.int64(target), np.int64(0)


@njit
def through(step):
    """Compiled: the outcome of a loop that has run its last step, ``step`` - 1."""
    return DONE, np.int64(step), np.int64(0), np.int64(0), np.int64(0)


def follow(loop, flags, waiter, *args):
    """Run compiled ``loop(flags, *args, start)`` to its end; return its last outcome.

    Such a loop works through its steps from step ``start`` and returns (status, step, a, b,
    c). With status WAIT, flag ``a`` has not reached ``b`` before step ``step``: this waits
    for it here in Python (``wait_until`` through ``waiter``), where Ctrl-C still works, and
    calls the loop again from that step.
    Any other status ends it, and (status, a, b, c) is returned: DONE, or the loop's own.
    """
    start = 0
    while True:
        status, start, a, b, c = loop(flags, *args, start)
        if status != WAIT:
            return status, a, b, c
        wait_until(flags, a, b, waiter)
