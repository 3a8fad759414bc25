"""Everything that depends on the TensorFlow or Keras version, kept in this one module.

Tested with TensorFlow 2.21 and Keras 3.15. Each helper names the API it leans on, so a
future version that moves it needs a change here only.
"""

import sys
import weakref

import keras
import tensorflow as tf

_site_counts: "weakref.WeakKeyDictionary[object, dict[str, int]]" = weakref.WeakKeyDictionary()


def in_xla_context() -> bool:
    """Return True while tracing a function that XLA will compile (``jit_compile=True``)."""
    # Exported by TensorFlow as tf.__internal__ (Keras relies on it too).
    return tf.__internal__.get_enclosing_xla_context() is not None


def _outermost_function_graph():
    graph = tf.compat.v1.get_default_graph()
    if not isinstance(graph, tf.__internal__.FuncGraph):
        return None
    # Branches of tf.cond and bodies of tf.while_loop are FuncGraphs nested in the step's.
    while isinstance(getattr(graph, "outer_graph", None), tf.__internal__.FuncGraph):
        graph = graph.outer_graph
    return graph


def traced_site(base: str) -> tuple[str, int] | None:
    """Return (the name of the ``tf.function`` being traced, how many ``base`` sites it had).

    The count is of the earlier calls with ``base`` in the function's graph (its cond and
    loop bodies included); retracing starts from zero again, so ranks that retrace a
    different number of times still agree. None when not tracing a ``tf.function``.
    """
    if tf.executing_eagerly():
        return None
    graph = _outermost_function_graph()
    if graph is None:
        return None
    counts = _site_counts.setdefault(graph, {})
    k = counts.get(base, 0)
    counts[base] = k + 1
    return graph.name, k


def site_name(base: str) -> str:
    """Return a name for one exchange site, identical on every rank and unique per step.

    Eagerly every exchange completes before the next starts, so ``base`` is enough. While
    tracing a ``tf.function``, the k-th site with the same ``base`` in the step's graph gets
    ``base.k`` (``traced_site``).
    """
    traced = traced_site(base)
    return base if traced is None or traced[1] == 0 else f"{base}.{traced[1]}"


def wrapping_loss_scale_optimizer(optimizer):
    """Return the ``LossScaleOptimizer`` whose ``build`` is building ``optimizer``, or None.

    Keras 3's ``LossScaleOptimizer.build`` builds its inner optimizer by calling
    ``inner_optimizer.build``; this looks a few frames up the stack for it.
    """
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if (
            isinstance(owner, keras.optimizers.LossScaleOptimizer)
            and owner.inner_optimizer is optimizer
        ):
            return owner
        frame = frame.f_back
    return None
