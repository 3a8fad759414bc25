"""The two ops between TensorFlow and the engine: one enqueues and returns, one waits.

Both are ``tf.numpy_function`` ops, or, where tensors go through DLPack
(``RINGTRAIN_TF_DLPACK``, by default where TensorFlow sees a GPU), ``tf.py_function`` ops
that hand the engine views of the tensors' memory (``ringtrain.dlpack``): light views on a
GPU, so that nothing is copied to the host first, and no numba array is built. Either way
they work eagerly and inside ``tf.function``. An enqueue op submits to the engine and
returns a token at once; a synchronize op turns the token back into the result. A
synchronize op blocks a TensorFlow thread, so it must only run once every enqueue of its
step has run: it takes all of their tokens as inputs, and then even a single inter-op
thread cannot block before the last enqueue.
"""

import functools
import itertools

import numpy as np
import tensorflow as tf

from ringtrain import api, dlpack, kernels
from ringtrain.errors import RingtrainError
from ringtrain.kernels import device_view
from ringtrain.tensorflow import compat, errors

_TENSOR_ALIGNMENT = 64  # bytes: TensorFlow's CPU kernels check it (Eigen's largest)
_handles: dict[int, object] = {}
_tokens = itertools.count()


def _check_traceable(what):
    if compat.in_xla_context():
        raise RingtrainError(
            f"{what} cannot run inside an XLA-compiled function (jit_compile=True): the "
            "exchange with other ranks happens outside TensorFlow. Compile without XLA "
            "(model.compile(..., jit_compile=False) or tf.function(jit_compile=False)); "
            "ringtrain's Keras callbacks switch a model's jit_compile off by themselves."
        )


@tf.autograph.experimental.do_not_convert
def enqueue(start, inputs, what: str, count=None, ordered=True):
    """Return a scalar int64 token op that calls ``start(*arrays)`` and does not wait.

    ``start`` submits to the engine and returns a handle (or a list of handles, synchronized
    together). With ``count``, it returns ``count`` handles, and this returns a list of
    ``count`` tokens, one per handle, from the one op.

    Inside ``tf.function``, TensorFlow runs stateful ops such as this one in the order the
    program made them. With ``ordered`` False the op runs as soon as its inputs are in
    instead (``_run_independently``): for a step's gradients, whose order in backprop is
    TensorFlow's to choose.
    """
    _check_traceable(what)

    def _enqueue(*arrays):
        handles = start(*arrays)
        if count is None:
            handles = [handles]
        tokens = [next(_tokens) for _ in handles]
        _handles.update(zip(tokens, handles, strict=True))
        return np.int64(tokens[0]) if count is None else np.array(tokens, np.int64)

    out = _op(_enqueue, list(inputs), tf.int64, "rt_enqueue")
    if not ordered:
        _run_independently(out)
    if count is None:
        return out
    out.set_shape([count])
    return tf.unstack(out, num=count)


def _op(func, inputs, dtypes, name):
    """Return the outputs of one stateful op that calls ``func`` on its inputs as arrays.

    A ``tf.numpy_function``, for which TensorFlow copies GPU inputs to the host; or, where
    tensors go through DLPack (``through_dlpack``), a ``tf.py_function`` that hands ``func``
    views of the inputs' memory and takes its results back the same way where it can
    (``_as_tensor``). Eagerly, that one calls ``func`` at once instead: an
    eager ``tf.py_function`` turns a ValueError into TensorFlow's InvalidArgumentError,
    where ``tf.numpy_function`` and Horovod raise it as it is.
    """
    if not through_dlpack():
        return tf.numpy_function(func, inputs, dtypes, stateful=True, name=name)

    def viewed(*tensors):
        arrays = [dlpack.view(tensor.__dlpack__()) for tensor in tensors]
        _finish_gpu_work(arrays)  # TensorFlow's kernels that write them
        out = func(*arrays)
        if isinstance(dtypes, list):
            return [_as_tensor(array, dtype) for array, dtype in zip(out, dtypes, strict=True)]
        return _as_tensor(out, dtypes)

    if tf.executing_eagerly():
        return viewed(*(tf.convert_to_tensor(tensor) for tensor in inputs))
    return tf.py_function(viewed, inputs, dtypes, name=name)


def through_dlpack() -> bool:
    """Return whether ops made now hand tensors over through DLPack (``RINGTRAIN_TF_DLPACK``).

    Unset, where TensorFlow sees a GPU.
    """
    chosen = api.active_settings().tf_dlpack
    return _sees_a_gpu() if chosen is None else chosen


@functools.cache
def _sees_a_gpu() -> bool:
    """Return True if TensorFlow sees a GPU in this process."""
    return bool(tf.config.list_physical_devices("GPU"))


def _finish_gpu_work(arrays) -> None:
    """Wait for every kernel queued on the GPU if any of ``arrays`` lies there.

    TensorFlow queues its kernels on streams of its own, and the engine on numba's default
    stream; both run in the device's primary context, whose synchronization waits for
    every stream. So the engine reads no tensor that TensorFlow's kernels still write (and
    the engine waits the same way before it hands out a result: ``Executor``).
    """
    device = next((a for a in arrays if kernels.is_device_array(a)), None)
    if device is not None:
        kernels.backend_for(device).finish_queued()


def _as_tensor(array, dtype):
    """Return ``array`` as a tensor of ``dtype`` over its memory where it can, else a copy.

    Over it for a GPU array, and for a C-contiguous NumPy array aligned as TensorFlow's
    kernels need (an unaligned one aborts the process), as ``tf.numpy_function`` takes a
    result's memory over (see ``exchange.allreduce_gradients`` on results that TensorFlow
    may write into).
    """
    if kernels.is_device_array(array):  # the engine's results are views (or an out= of one)
        capsule = device_view.of(array).__dlpack__()  # its kernels have finished
    elif _taken_over(array):
        host = (dlpack.CPU, 0)
        capsule = dlpack.capsule(array.ctypes.data, array.shape, array.dtype, host, array)
    else:
        return tf.convert_to_tensor(array, dtype)
    return tf.experimental.dlpack.from_dlpack(capsule)


def _taken_over(array) -> bool:
    """Return True for a host result that a tensor may share: C-contiguous, 64-byte aligned."""
    return (
        isinstance(array, np.ndarray)
        and array.flags.c_contiguous
        and array.size > 0
        and array.ctypes.data % _TENSOR_ALIGNMENT == 0
    )


def _run_independently(output):
    """Exempt the stateful op of ``output`` from ``tf.function``'s program order; it still runs.

    TensorFlow orders a function's stateful ops without resource inputs in program order.
    A step's gradient hand-overs then wait for each other, and at one inter-op thread all of
    them ran after the whole of backprop (docs/benchmarks.md). The graph's automatic control
    dependencies can let an op run as soon as its inputs are in; where there is no such
    manager (eagerly, or in a graph without one), nothing changes. Unlike a stateless op,
    a stateful one is never run by constant folding while the graph is optimized.
    """
    if tf.executing_eagerly():
        return  # the op has run already
    manager = getattr(tf.compat.v1.get_default_graph(), "experimental_acd_manager", None)
    if manager is not None:
        manager.run_independently(output.op)


def _result(handle, describe, finish):
    try:
        if isinstance(handle, list):
            result = [api.synchronize(h) for h in handle]
        else:
            result = api.synchronize(handle)
    except RingtrainError as err:
        raised = errors.in_tensorflow_terms(err, describe)
        if raised is err:
            raise
        raise raised from err
    return result if finish is None else finish(result)


@tf.autograph.experimental.do_not_convert
def synchronize(token, dtypes):
    """Return the result(s) of the enqueue op ``token``, from one op that runs after it.

    ``dtypes`` is one dtype or a list (for a token holding a list of handles).
    """

    def _wait(token_value):
        return _result(_handles.pop(int(token_value)), None, None)

    out = _op(_wait, [token], dtypes, "rt_synchronize")
    # A one-element list of dtypes gives a bare tensor back in some modes.
    if isinstance(dtypes, list) and not isinstance(out, list | tuple):
        return [out]
    return out


@tf.autograph.experimental.do_not_convert
def collect(tokens, dtypes, handover):
    """Return ``handover``'s results (``exchange.Handover.collect``) from one op.

    ``tokens``: its enqueue ops' tokens, the manifest's first. The op checks the manifest
    before it waits for anything else, and withdraws what it did not reach when it fails;
    engine errors come out as the binding's (``errors.in_tensorflow_terms``).
    """

    def _wait(*token_values):
        handles = [_handles.pop(int(t)) for t in token_values]
        return handover.collect(handles, errors.in_tensorflow_terms)

    out = _op(_wait, list(tokens), dtypes, "rt_synchronize")
    return [out] if not isinstance(out, list | tuple) else list(out)


@tf.autograph.experimental.do_not_convert
def run(start, inputs, dtypes, what: str):
    """Enqueue ``start`` on ``inputs`` and wait for it: one blocking collective."""
    return synchronize(enqueue(start, inputs, what), dtypes)
