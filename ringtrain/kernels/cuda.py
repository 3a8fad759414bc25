"""The CUDA backend: fusion-buffer kernels compiled by numba-cuda, launched on the default stream.

Launches are asynchronous; ``to_host`` and ``to_device`` copy on the same stream, so a host copy
sees every kernel queued before it. One pack or unpack launch takes up to ``_MAX_TENSORS``
tensors: their addresses, lengths and buffer offsets go to the GPU as one small table, and
``blockIdx.y`` picks a row. Passing addresses, not arrays, keeps the Python cost of a launch
nearly flat in the number of tensors: numba marshals each array argument field by field. The
scalar conversions and ops are the CPU backend's own (its ``py_func``), compiled here as device
functions, so both backends produce the same bits, NaN payloads aside: a GPU's float arithmetic
returns its one canonical NaN (0x7fffffff in float32) where the CPU's keeps an operand's.
"""

import ctypes
import functools
import threading

import numpy as np
from numba import config, cuda
from numba.cuda import types
from numba.cuda.extending import intrinsic

from ringtrain import kernels
from ringtrain.kernels import cpu
from ringtrain.kernels.device_view import DeviceView

_THREADS = 256
_MAX_BLOCKS = 1024  # per tensor and launch; threads stride over longer tensors
_MAX_TENSORS = 65535  # a grid's y dimension: tensors per pack or unpack launch

_device = cuda.jit(device=True)
_scaled = _device(cpu._scaled.py_func)
_combine = _device(cpu._combine.py_func)


@_device
def _same(x):
    """Return ``x``: the element conversion of a same-dtype copy."""
    return x


if config.ENABLE_CUDASIM:

    def _elements(address, size, like):
        """Return the ``size`` elements of ``like``'s dtype at ``address`` (simulated: a view)."""
        block = (ctypes.c_byte * (int(size) * like.dtype.itemsize)).from_address(int(address))
        return np.frombuffer(block, like.dtype)

else:

    @intrinsic
    def _elements(typingctx, address, size, like):
        """Type ``_elements``: ``address`` as a pointer to ``like``'s dtype, indexed as an array."""

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return types.CPointer(like.dtype)(address, size, like), codegen


# Columns of the table that a pack or unpack launch reads, one row per tensor.
_ADDRESS, _SIZE, _OFFSET = range(3)


def _pack_kernel(widen):
    """Return a kernel packing the table's tensors into a buffer as ``widen(element) * scale``."""

    @cuda.jit
    def pack(table, first, like, buffer, scale):
        t = first + cuda.blockIdx.y
        size, offset = table[t, _SIZE], table[t, _OFFSET]
        src = _elements(table[t, _ADDRESS], size, like)
        for j in range(cuda.grid(1), size, cuda.gridsize(1)):
            buffer[offset + j] = _scaled(widen(src[j]), scale)

    return pack


def _unpack_kernel(narrow):
    """Return a kernel unpacking a buffer into the table's tensors as ``narrow(x * scale)``."""

    @cuda.jit
    def unpack(table, first, like, buffer, scale):
        t = first + cuda.blockIdx.y
        size, offset = table[t, _SIZE], table[t, _OFFSET]
        dst = _elements(table[t, _ADDRESS], size, like)
        for j in range(cuda.grid(1), size, cuda.gridsize(1)):
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
    _launch(_PACK[kind], sources, _bits(as_numba(buffer)), offsets, scale)


def unpack(buffer, offsets, destinations, scale=1.0):
    """Copy ``buffer`` from element ``offsets[i]`` on, times ``scale``, into ``destinations[i]``."""
    if not len(destinations):
        return
    kind, scale = kernels._conversion(destinations[0].dtype, buffer, scale)
    _launch(_UNPACK[kind], destinations, _bits(as_numba(buffer)), offsets, scale)


def reduce(dst, a, b, op, scale=1.0):
    """Set ``dst[:] = op(a, b) * scale`` element-wise; ``dst`` may be ``a`` or ``b`` itself."""
    op, scale = kernels.reduction_args(dst, a, b, op, scale)
    if dst.size:
        blocks = min(_MAX_BLOCKS, -(-dst.size // _THREADS))
        arrays = as_numba(dst), as_numba(a), as_numba(b)
        _reduce[blocks, _THREADS](*arrays, op, _kernel_scale(scale, dst.dtype))


def reduce_to_wire(wire, a, b, op, scale=1.0):
    """Set 16-bit ``wire[:]`` to float32 ``op(a, b) * scale`` rounded; ``b`` is 16-bit too."""
    kind, op, scale = kernels.wire_reduction_args(wire, a, b, op, scale)
    if wire.size:
        blocks = min(_MAX_BLOCKS, -(-wire.size // _THREADS))
        halves = _bits(as_numba(wire)), _bits(as_numba(b))
        scale = _kernel_scale(scale, np.dtype(a.dtype))
        _REDUCE_TO_WIRE[kind][blocks, _THREADS](halves[0], as_numba(a), halves[1], op, scale)


def empty(shape, dtype):
    """Return a new uninitialized device array of ``shape`` (an int for 1-D)."""
    return cuda.device_array(shape, dtype=dtype)


def pinned_empty(nbytes):
    """Return ``nbytes`` uninitialized page-locked host bytes, which copy to and from a GPU fast."""
    return cuda.pinned_array(nbytes, dtype=np.uint8)


def to_host(device_array, host_array):
    """Copy ``device_array`` into the NumPy array ``host_array``, waiting for queued kernels."""
    _bits(as_numba(device_array)).copy_to_host(_bits(host_array))


def device_id() -> int:
    """Return the id of this thread's current GPU (0 in the simulator, which has one)."""
    return 0 if config.ENABLE_CUDASIM else cuda.get_current_device().id


def finish_queued():
    """Wait for every kernel queued on the GPU: before a library reads its memory off the stream."""
    cuda.synchronize()


def to_device(host_array, device_array):
    """Copy the NumPy array ``host_array`` into ``device_array``."""
    _bits(as_numba(device_array)).copy_to_device(_bits(host_array))


def _bits(array):
    """Return a 16-bit float ``array`` as uint16, which numba copies (it cannot copy bfloat16)."""
    return array.view(np.uint16) if kernels._is_half(array.dtype) else array


def _kernel_scale(scale, dtype):
    """Return ``scale`` as a kernel argument: numba-cuda cannot pass None, so unscaled is 1."""
    return dtype.type(1) if scale is None else scale  # typed, so that no product widens


def as_numba(array):
    """Return CUDA ``array`` (a ``DeviceView``, CuPy's...) as a numba device array over its memory.

    A numba array is returned as it is.
    """
    if getattr(array, "__cuda_ndarray__", False):
        return array
    if config.ENABLE_CUDASIM:  # the simulator has no ``as_cuda_array``: its memory is the host's
        return _simulated(array)
    wrapped = cuda.as_cuda_array(array)
    if isinstance(array, DeviceView) and wrapped.dtype != array.dtype:
        wrapped = wrapped.view(array.dtype)  # bfloat16, which its interface shows as uint16
    return wrapped


def _simulated(array):
    """Return the simulator's array over the host memory that CUDA ``array`` describes."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    host = np.asarray(_HostMemory(array))  # its base holds ``array``, and so the memory
    dtype = getattr(array, "dtype", host.dtype)
    if isinstance(dtype, np.dtype):
        host = host.view(dtype)
    if not host.size:  # laid out as NumPy lays out an empty array, which the simulator checks
        host = np.empty(host.shape, host.dtype)
    return FakeCUDAArray(host)


class _HostMemory:
    """A simulated CUDA array's memory, which is host memory, as NumPy's interface shows it."""

    def __init__(self, array):
        self._array = array  # held: it owns the memory
        interface = dict(array.__cuda_array_interface__)
        interface.pop("stream", None)
        interface["version"] = 3
        self.__array_interface__ = interface


def views(array, starts, shapes) -> list:
    """Return ``DeviceView``s of 1-D ``array``: ``shapes[i]`` from element ``starts[i]`` on.

    No numba array is built for them (``kernels.device_view``).
    """
    base, step, dtype = address(array), np.dtype(array.dtype).itemsize, array.dtype
    return [
        DeviceView(base + start * step, shape, dtype, array)
        for start, shape in zip(starts, shapes, strict=True)
    ]


def _shared_dtype(arrays):
    """Return the dtype of ``arrays``; raise TypeError unless they share one."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        names = sorted({str(a.dtype) for a in arrays})
        raise TypeError(f"the tensors of one call must share a dtype, got {', '.join(names)}")
    return dtype


def address(array):
    """Return the device address of C-contiguous ``array``; raise ValueError for any other."""
    if not kernels.is_c_contiguous(array):
        raise ValueError(
            f"a tensor of shape {tuple(array.shape)} is not C-contiguous; pass a contiguous copy"
        )
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:  # the simulator's arrays wrap NumPy arrays in host memory
        return array.ctypes.data
    return interface["data"][0]


class _LaunchTable:
    """The table that pack and unpack launches read: pinned host rows and a device copy.

    Both stay from call to call and grow as needed, so a launch costs one short copy from pinned
    memory rather than an allocation and a copy from pageable memory. That copy is synchronous
    on the default stream, so it waits for every kernel queued before it: no launch reads rows
    that a later call overwrites. The lock keeps two threads from filling the rows at once.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self._host = self._device = None

    def rows(self, count):
        """Return the first ``count`` host rows to fill, growing the table if it is smaller."""
        if self._host is None or len(self._host) < count:
            capacity = 1 << max(8, (count - 1).bit_length())
            self._host = cuda.pinned_array((capacity, 3), np.int64)
            self._device = cuda.device_array((capacity, 3), np.int64)
        return self._host[:count]

    def upload(self):
        """Copy the host rows to the device; return the device table."""
        self._device.copy_to_device(self._host)
        return self._device


@functools.cache
def _launch_table():
    """Return the process's one launch table, made on first use."""
    return _LaunchTable()


@functools.cache
def _like(dtype):
    """Return an empty device array of ``dtype``: it tells a kernel what the addresses hold."""
    return cuda.device_array(0, dtype)


def _launch(kernel, arrays, buffer, offsets, scale):
    """Launch ``kernel`` on ``arrays`` through the launch table, after checking every segment."""
    if len(offsets) != len(arrays):
        raise ValueError(f"{len(arrays)} tensors but {len(offsets)} offsets")
    dtype = _shared_dtype(arrays)
    sizes, offsets = [a.size for a in arrays], [int(o) for o in offsets]
    for size, offset in zip(sizes, offsets, strict=True):
        if offset < 0 or offset + size > buffer.size:
            raise ValueError(
                f"a tensor of {size} elements at offset {offset} falls outside the "
                f"fusion buffer of {buffer.size}"
            )
    addresses = [address(a) for a in arrays]
    largest = max(sizes)
    if not largest:
        return
    like = _like(np.dtype(np.uint16) if kernels._is_half(dtype) else np.dtype(dtype))
    scale = _kernel_scale(scale, buffer.dtype)
    blocks = min(_MAX_BLOCKS, -(-largest // _THREADS))
    table = _launch_table()
    with table.lock:
        rows = table.rows(len(arrays))
        rows[:, _ADDRESS], rows[:, _SIZE], rows[:, _OFFSET] = addresses, sizes, offsets
        on_device = table.upload()
        for first in range(0, len(arrays), _MAX_TENSORS):
            count = min(_MAX_TENSORS, len(arrays) - first)
            kernel[(blocks, count), _THREADS](on_device, first, like, buffer, scale)
