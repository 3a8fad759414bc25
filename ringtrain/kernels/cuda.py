"""The CUDA backend: fusion-buffer kernels compiled by numba-cuda, launched on the default stream.

Launches are asynchronous; ``to_host`` and ``to_device`` copy on the same stream, so a host copy
sees every kernel queued before it. A pack or unpack launch takes ``_WIDTH`` tensors as a tuple
of 1-D device arrays: ``blockIdx.y`` picks the tensor and the x dimension strides over its
elements. The scalar conversions and ops are the CPU backend's own (its ``py_func``), compiled
here as device functions, so both backends produce the same bits.
"""

import numpy as np
from numba import cuda

from ringtrain import kernels
from ringtrain.kernels import cpu

_WIDTH = 32  # tensors per launch: 32 flattened 1-D arrays stay within 4 KiB of kernel params
_THREADS = 256
_MAX_BLOCKS = 1024  # per tensor and launch; threads stride over longer tensors

_device = cuda.jit(device=True)
_scaled = _device(cpu._scaled.py_func)
_combine = _device(cpu._combine.py_func)


@_device
def _same(x):
    """Return ``x``: the element conversion of a same-dtype copy."""
    return x


def _pack_kernel(widen):
    """Return a kernel packing tensors into a buffer as ``widen(element) * scale``."""

    @cuda.jit
    def pack(sources, offsets, buffer, scale):
        src = sources[cuda.blockIdx.y]
        offset = offsets[cuda.blockIdx.y]
        for j in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            buffer[offset + j] = _scaled(widen(src[j]), scale)

    return pack


def _unpack_kernel(narrow):
    """Return a kernel unpacking a buffer into tensors as ``narrow(element * scale)``."""

    @cuda.jit
    def unpack(destinations, offsets, buffer, scale):
        dst = destinations[cuda.blockIdx.y]
        offset = offsets[cuda.blockIdx.y]
        for j in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
            dst[j] = narrow(_scaled(buffer[offset + j], scale))

    return unpack


@cuda.jit
def _reduce(dst, a, b, op, scale):
    """Set ``dst[i] = op(a[i], b[i]) * scale``; each thread reads its elements before writing."""
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = _scaled(_combine(op, a[i], b[i]), scale)


def _reduce_to_wire_kernel(widen, narrow):
    """Return a kernel setting 16-bit ``wire[i] = narrow(op(a[i], widen(b[i])) * scale)``."""

    @cuda.jit
    def reduce_to_wire(wire, a, b, op, scale):
        for i in range(cuda.grid(1), wire.size, cuda.gridsize(1)):
            wire[i] = narrow(_scaled(_combine(op, a[i], widen(b[i])), scale))

    return reduce_to_wire


_F16_TO_F32 = _device(cpu._f16_to_f32.py_func)
_BF16_TO_F32 = _device(cpu._bf16_to_f32.py_func)
_F32_TO_F16 = _device(cpu._f32_to_f16.py_func)
_F32_TO_BF16 = _device(cpu._f32_to_bf16.py_func)

_PACK = {
    kernels._COPY: _pack_kernel(_same),
    kernels._F16: _pack_kernel(_F16_TO_F32),
    kernels._BF16: _pack_kernel(_BF16_TO_F32),
}
_UNPACK = {
    kernels._COPY: _unpack_kernel(_same),
    kernels._F16: _unpack_kernel(_F32_TO_F16),
    kernels._BF16: _unpack_kernel(_F32_TO_BF16),
}
_REDUCE_TO_WIRE = {
    kernels._F16: _reduce_to_wire_kernel(_F16_TO_F32, _F32_TO_F16),
    kernels._BF16: _reduce_to_wire_kernel(_BF16_TO_F32, _F32_TO_BF16),
}


def pack(sources, buffer, offsets, scale=1.0):
    """Copy ``sources[i]``, times ``scale``, into ``buffer`` from element ``offsets[i]`` on."""
    if not len(sources):
        return
    kind, scale = kernels._conversion(sources[0].dtype, buffer, scale)
    _launch(_PACK[kind], _flat(sources), _flat([buffer])[0], offsets, scale)


def unpack(buffer, offsets, destinations, scale=1.0):
    """Copy ``buffer`` from element ``offsets[i]`` on, times ``scale``, into ``destinations[i]``."""
    if not len(destinations):
        return
    kind, scale = kernels._conversion(destinations[0].dtype, buffer, scale)
    _launch(_UNPACK[kind], _flat(destinations), _flat([buffer])[0], offsets, scale)


def reduce(dst, a, b, op, scale=1.0):
    """Set ``dst[:] = op(a, b) * scale`` element-wise; ``dst`` may be ``a`` itself."""
    op, scale = kernels.reduction_args(dst, a, b, op, scale)
    if dst.size:
        blocks = min(_MAX_BLOCKS, -(-dst.size // _THREADS))
        arrays = _device_array(dst), _device_array(a), _device_array(b)
        _reduce[blocks, _THREADS](*arrays, op, _kernel_scale(scale, dst.dtype))


def reduce_to_wire(wire, a, b, op, scale=1.0):
    """Set 16-bit ``wire[:]`` to float32 ``op(a, b) * scale`` rounded; ``b`` is 16-bit too."""
    kind, op, scale = kernels.wire_reduction_args(wire, a, b, op, scale)
    if wire.size:
        blocks = min(_MAX_BLOCKS, -(-wire.size // _THREADS))
        halves = _flat([wire, b])
        scale = _kernel_scale(scale, np.dtype(a.dtype))
        _REDUCE_TO_WIRE[kind][blocks, _THREADS](halves[0], _device_array(a), halves[1], op, scale)


def empty(shape, dtype):
    """Return a new uninitialized device array of ``shape`` (an int for 1-D)."""
    return cuda.device_array(shape, dtype=dtype)


def to_host(device_array, host_array):
    """Copy ``device_array`` into the NumPy array ``host_array``, waiting for queued kernels."""
    _device_array(device_array).copy_to_host(host_array)


def to_device(host_array, device_array):
    """Copy the NumPy array ``host_array`` into ``device_array``."""
    _device_array(device_array).copy_to_device(host_array)


def _kernel_scale(scale, dtype):
    """Return ``scale`` as a kernel argument: numba-cuda cannot pass None, so unscaled is 1."""
    return dtype.type(1) if scale is None else scale  # typed, so that no product widens


def _device_array(array):
    """Return ``array`` as a numba device array, wrapping other CUDA arrays (CuPy...) in place."""
    return array if getattr(array, "__cuda_ndarray__", False) else cuda.as_cuda_array(array)


def _flat(arrays):
    """Return ``arrays`` as 1-D device views of one dtype, 16-bit floats viewed as uint16."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        names = sorted({str(a.dtype) for a in arrays})
        raise TypeError(f"the tensors of one call must share a dtype, got {', '.join(names)}")
    flat = [_device_array(a).ravel() for a in arrays]  # raises for a non-contiguous array
    if kernels._is_half(dtype):
        return [f.view(np.uint16) for f in flat]
    return flat


def _launch(kernel, arrays, buffer, offsets, scale):
    """Launch ``kernel`` on ``arrays`` in tuples of ``_WIDTH``, after checking every segment."""
    if len(offsets) != len(arrays):
        raise ValueError(f"{len(arrays)} tensors but {len(offsets)} offsets")
    offsets = [int(o) for o in offsets]
    for array, offset in zip(arrays, offsets, strict=True):
        if offset < 0 or offset + array.size > buffer.size:
            raise ValueError(
                f"a tensor of {array.size} elements at offset {offset} falls outside the "
                f"fusion buffer of {buffer.size}"
            )
    scale = _kernel_scale(scale, buffer.dtype)
    pad = arrays[0][:0]
    for start in range(0, len(arrays), _WIDTH):
        chunk = arrays[start : start + _WIDTH]
        count = len(chunk)
        largest = max(a.size for a in chunk)
        if largest:
            blocks = min(_MAX_BLOCKS, -(-largest // _THREADS))
            chunk.extend([pad] * (_WIDTH - count))
            chunk_offsets = tuple(offsets[start : start + _WIDTH]) + (0,) * (_WIDTH - count)
            grid = (blocks, count)
            kernel[grid, _THREADS](tuple(chunk), chunk_offsets, buffer, scale)
