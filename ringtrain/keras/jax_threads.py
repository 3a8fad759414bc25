"""Keras's JAX backend: XLA's CPU client needs two threads or more for the exchange's callback.

The exchange leaves the jitted train step through a host callback. With ``io_callback``,
which ringtrain used first, the callback's inputs came through a transfer to the CPU
device that the client runs on its own threads, which it makes as many as the process may
use cores when it is created. A rank that ringtrain has pinned to one core
(``RINGTRAIN_BIND_CORES``) got one thread, busy with the step that waited in the callback
for the transfer: every multi-step fit waited forever. ``buffer_callback``, used now, reads
XLA's buffers in place; until a one-thread client is shown safe with it, ringtrain still
creates the client when ``ringtrain.keras`` is first used on JAX, before ``init()`` pins the
rank, and refuses to exchange on a client made with one thread.
"""

import os

import jax

from ringtrain.errors import RingtrainError


def _cpu_client_exists() -> bool:
    # JAX keeps its clients by platform in a private dict; none found means none made yet.
    from jax._src import xla_bridge

    return "cpu" in getattr(xla_bridge, "_backends", {})


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# Whether the client was made, or is about to be, while this process may use one core (a
# client that JAX made earlier may have had more then: refused all the same, to be safe).
_ONE_THREAD = _usable_cores() < 2
if not _cpu_client_exists():
    jax.devices("cpu")  # made now, with a thread per core the process may use


def check() -> None:
    """Raise RingtrainError where JAX's CPU client has one thread (see the module docstring)."""
    if _ONE_THREAD:
        raise RingtrainError(
            "JAX's CPU client was made while this rank could use one core only, so the "
            "exchange's host callback would wait forever for a transfer that the client "
            "runs on that core's one thread: use ringtrain.keras (hvd.init()) before "
            "ringtrain.init() or any JAX computation, or set RINGTRAIN_BIND_CORES=0"
        )
