"""The kernel seam: picks the CPU or CUDA backend that packs, unpacks and reduces fusion buffers.

Both backends, ``cpu`` (numba, without the GIL) and ``cuda`` (numba-cuda), are modules with
the same functions, so the executor and the transports never ask which one they hold:

- ``pack(sources, buffer, offsets, scale=1.0)``: copy each tensor, times ``scale``, into the 1-D
  ``buffer`` from its element offset on, widening float16 and bfloat16 to a float32 buffer.
- ``unpack(buffer, offsets, destinations, scale=1.0)``: the reverse, narrowing float32 to float16
  or bfloat16 with round-to-nearest-even.
- ``reduce(dst, a, b, op, scale=1.0)``: ``dst[:] = op(a, b) * scale`` element-wise.
- ``reduce_to_wire(wire, a, b, op, scale=1.0)``: ``wire[:] = op(a, b) * scale`` rounded to
  16 bits, where ``a`` is float32 and ``wire`` and ``b`` are float16 or bfloat16 (``b``
  widened exactly): one hop of a ring that sends 16-bit partial sums.
- ``empty(shape, dtype)``, ``pinned_empty(nbytes)``, ``to_host(device_array, host_array)``,
  ``to_device(host_array, device_array)``: allocate a buffer, and host bytes (page-locked
  on a GPU) to stage it through for MPI.

Integer data accepts only ``scale == 1.0``; so do 16-bit floats copied into a 16-bit buffer,
which is moved bit for bit (scale them through a float32 buffer instead).
"""

import functools
import importlib

import numpy as np

from ringtrain import dtypes
from ringtrain.ops import ReduceOp, as_reduce_op

_FLOAT32 = np.dtype(np.float32)
_HALF = frozenset({np.dtype(np.float16), dtypes.bfloat16})
_REDUCIBLE = tuple(d for d in dtypes.SUPPORTED if d not in _HALF)
_KERNEL_OPS = frozenset({ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product})

# How tensor elements map onto buffer elements; each backend keeps one pack and one unpack
# kernel per kind.
_COPY = "copy"  # same dtype (16-bit floats move as raw uint16 bits)
_F16 = "f16"  # float16 tensor, float32 buffer
_BF16 = "bf16"  # bfloat16 tensor, float32 buffer


def is_device_array(array) -> bool:
    """Return True for an array in GPU memory (``__cuda_array_interface__`` or numba's own)."""
    # numba's own device arrays, the simulator's fakes included, are marked __cuda_ndarray__.
    return hasattr(array, "__cuda_array_interface__") or getattr(array, "__cuda_ndarray__", False)


def is_c_contiguous(array) -> bool:
    """Return True for a C-contiguous array: NumPy's, or a CUDA array by its interface."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:  # NumPy arrays, and the CUDA simulator's, which wrap them
        return bool(array.flags.c_contiguous)
    strides = interface.get("strides")
    if strides is None or 0 in interface["shape"]:  # an empty array has no layout to break
        return True
    step = np.dtype(interface["typestr"]).itemsize
    for extent, stride in zip(reversed(interface["shape"]), reversed(strides), strict=True):
        if extent > 1 and stride != step:
            return False
        step *= extent
    return True


def backend_for(array):
    """Return the CUDA backend for an array with ``__cuda_array_interface__``, else the CPU one."""
    return _backend("cuda" if is_device_array(array) else "cpu")


@functools.cache
def _backend(name):
    """Import the backend module ``name`` on first use."""
    return importlib.import_module(f"{__name__}.{name}")


def _is_half(dtype):
    """Return True for float16 and bfloat16, which kernels see as uint16 bit patterns."""
    return dtype in _HALF


def _kernel_scale(dtype, scale):
    """Return ``scale`` typed as ``dtype``, or None for 1: unscaled data is copied, not multiplied.

    Raise ValueError for a scale other than 1.0 on integers or on 16-bit floats moved raw.
    """
    if scale == 1:
        return None
    if dtypes.is_integer(dtype) or _is_half(dtype):
        raise ValueError(f"scale must be 1.0 for {dtype} data, got {scale!r}")
    return dtype.type(scale)


def _conversion(tensor_dtype, buffer, scale):
    """Return ``(kind, scale)`` for moving ``tensor_dtype`` elements through ``buffer``."""
    if buffer.ndim != 1:
        raise ValueError(f"the fusion buffer must be 1-D, got {buffer.ndim}-D")
    tensor_dtype = dtypes.check_supported(tensor_dtype)
    buffer_dtype = dtypes.check_supported(buffer.dtype)
    if tensor_dtype == buffer_dtype:
        return _COPY, _kernel_scale(buffer_dtype, scale)
    if _is_half(tensor_dtype) and buffer_dtype == _FLOAT32:
        kind = _BF16 if tensor_dtype == dtypes.bfloat16 else _F16
        return kind, _kernel_scale(buffer_dtype, scale)
    raise TypeError(
        f"cannot move {tensor_dtype} tensors through a {buffer_dtype} buffer; the buffer must "
        "have the tensors' dtype, or be float32 for float16 and bfloat16 tensors"
    )


def reduction_args(dst, a, b, op, scale):
    """Check the operands of ``reduce`` and return ``(op, scale)`` as the kernels take them."""
    if not dst.ndim == a.ndim == b.ndim == 1:
        raise ValueError(f"reduce takes 1-D arrays, got {dst.ndim}-D, {a.ndim}-D and {b.ndim}-D")
    if not dst.shape == a.shape == b.shape:
        raise ValueError(f"reduce lengths differ: dst {dst.size}, a {a.size}, b {b.size}")
    if not dst.dtype == a.dtype == b.dtype:
        raise TypeError(f"reduce dtypes differ: dst {dst.dtype}, a {a.dtype}, b {b.dtype}")
    dtype = np.dtype(dst.dtype)
    if dtype not in _REDUCIBLE:
        names = ", ".join(str(d) for d in _REDUCIBLE)
        raise TypeError(f"reduce runs on {names}, not {dtype}; widen 16-bit floats first")
    op = as_reduce_op(op)
    if op not in _KERNEL_OPS:
        raise ValueError(
            f"reduce takes Sum, Min, Max or Product, not {op.name}; "
            "Average is Sum with scale 1/size"
        )
    return int(op), _kernel_scale(dtype, scale)


def wire_reduction_args(wire, a, b, op, scale):
    """Check the operands of ``reduce_to_wire``; return ``(kind, op, scale)`` for the kernels.

    ``kind`` is ``_F16`` or ``_BF16``, the 16-bit type of ``wire`` and ``b``.
    """
    if not wire.ndim == a.ndim == b.ndim == 1:
        raise ValueError(
            f"reduce_to_wire takes 1-D arrays, got {wire.ndim}-D, {a.ndim}-D and {b.ndim}-D"
        )
    if not wire.shape == a.shape == b.shape:
        raise ValueError(f"reduce_to_wire lengths differ: wire {wire.size}, a {a.size}, b {b.size}")
    wire_dtype, a_dtype, b_dtype = np.dtype(wire.dtype), np.dtype(a.dtype), np.dtype(b.dtype)
    if a_dtype != _FLOAT32 or wire_dtype != b_dtype or not _is_half(wire_dtype):
        raise TypeError(
            f"reduce_to_wire takes float32 a with float16 or bfloat16 wire and b of one dtype, "
            f"got a {a_dtype}, wire {wire_dtype}, b {b_dtype}"
        )
    op, scale = reduction_args(a, a, a, op, scale)
    return (_BF16 if wire_dtype == dtypes.bfloat16 else _F16), op, scale
