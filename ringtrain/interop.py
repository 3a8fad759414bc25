"""Other frameworks' arrays in the NumPy-level API: taken without a copy, results given back alike.

A PyTorch tensor, a JAX or CuPy array, or any array that offers DLPack or
``__cuda_array_interface__`` (CUDA Array Interface) goes to the engine as a view of its
memory: a host array as NumPy (``np.from_dlpack``), a GPU array as a view read from its
CUDA interface (``kernels.device_view.of``), with NumPy's dtype. Its result comes back as an
array of the same framework, over the result's memory, through ``from_dlpack`` of the
array's namespace (a GPU result is a ``kernels.device_view.DeviceView``). NumPy arrays,
numba device arrays, and inputs of other kinds (lists, scalars, TensorFlow tensors) go in
as they are; results of NumPy arrays stay NumPy arrays, and those of numba arrays and of
CUDA arrays of no framework come back as numba arrays. PyTorch tensors that require
gradients are read detached: the reduction is not recorded by autograd.
"""

import functools
import sys

import numpy as np

from ringtrain import kernels
from ringtrain.kernels import device_view
from ringtrain.kernels.device_view import DeviceView


def adopt(tensor):
    """Return ``(array, give_back)``: ``tensor`` as the engine takes it, and its results' way back.

    ``array`` is a NumPy view of a host array of another framework, a ``DeviceView`` of a
    GPU one (unless it is strided: then the array itself, which the API refuses), or
    ``tensor`` itself;
    ``give_back(result)`` returns a result as ``tensor``'s kind (a numba array for a CUDA
    array of no framework), or is None where results go back as they are.
    """
    # A DeviceView is the TensorFlow binding's: its results stay views.
    if isinstance(tensor, (np.ndarray, np.generic, DeviceView)):
        return tensor, None
    # numba's device arrays (its simulator's too, which pass NumPy's attributes on) go in as
    # they are, CUDA arrays of no framework as views; the results of both, views of device
    # memory, come back as numba arrays.
    if getattr(tensor, "__cuda_ndarray__", False):
        return tensor, kernels.backend_for(tensor).as_numba
    namespace = _namespace(tensor)
    if namespace is None:
        if kernels.is_device_array(tensor):
            return device_view.of(tensor), kernels.backend_for(tensor).as_numba
        return tensor, None
    detach = getattr(tensor, "detach", None)  # PyTorch: a tensor that requires gradients
    if callable(detach):
        tensor = detach()
    if kernels.is_device_array(tensor):
        # Read through its interface: the engine sees NumPy's dtypes, not torch.float32.
        return device_view.of(tensor), functools.partial(_device_result, namespace)
    return _host_view(tensor), functools.partial(_host_result, namespace)


def _host_view(tensor) -> np.ndarray:
    """Return host ``tensor`` as a NumPy array, or raise a TypeError that names its dtype.

    Through DLPack where it can, else through NumPy's own conversion (bfloat16, which
    NumPy's DLPack lacks).
    """
    try:
        return np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):
        pass
    try:
        return np.asarray(tensor)
    except (RuntimeError, TypeError) as err:
        raise TypeError(
            f"cannot read a {type(tensor).__name__} of dtype {tensor.dtype} as a NumPy array "
            f"({err}); pass a NumPy array (for bfloat16: of dtype ml_dtypes.bfloat16)"
        ) from None


def _namespace(tensor):
    """Return the module of ``tensor``'s framework that makes its arrays, or None.

    The array API's ``__array_namespace__`` where the array offers it (JAX, CuPy), else its
    package where that has ``from_dlpack`` (PyTorch).
    """
    offered = getattr(tensor, "__array_namespace__", None)
    if offered is not None:
        return offered()
    package = sys.modules.get(type(tensor).__module__.partition(".")[0])
    return package if hasattr(package, "from_dlpack") else None


def _host_result(namespace, result):
    """Return the NumPy ``result`` as an array of ``namespace`` over the same memory.

    A read-only result (shared by the host's ranks) is copied first: DLPack cannot mark an
    array read-only, and a framework that wrote to it would fault.
    """
    if not result.flags.writeable:
        result = result.copy()
    try:
        return namespace.from_dlpack(result)
    except BufferError:  # bfloat16, which NumPy's DLPack lacks
        return namespace.asarray(result)


def _device_result(namespace, result):
    """Return the GPU ``result`` (a ``DeviceView``) as an array of ``namespace``, without a copy.

    Through DLPack, which JAX takes where it takes no CUDA interface. The kernels that
    wrote it have finished, so the framework may read it on any stream.
    """
    return namespace.from_dlpack(result)
