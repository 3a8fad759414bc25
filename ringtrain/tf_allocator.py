"""Which CPU allocator TensorFlow uses in ringtrain's processes; imports no TensorFlow.

A gradient that comes back from the engine lives in memory that TensorFlow did not allocate,
so TensorFlow cannot reuse its buffer in the optimizer's update and allocates a new one of
the same size every step. TensorFlow's default CPU allocator hands such large blocks back to
the system and takes fresh ones; its pooling (BFC) allocator keeps them. In one process,
passing the MLP benchmark's gradients through a ``tf.numpy_function`` that returns them
unchanged cost 1.5 ms a step with the default allocator and 0.9 ms with the pooling one
(docs/benchmarks.md).
"""

VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def prefer_pooling(environ) -> None:
    """Ask for TensorFlow's pooling CPU allocator in ``environ`` unless it already says.

    TensorFlow reads the variable when it first allocates, so setting it in ``os.environ``
    after ``import tensorflow`` still counts, as long as no tensor exists yet.
    """
    environ.setdefault(VARIABLE, "true")
