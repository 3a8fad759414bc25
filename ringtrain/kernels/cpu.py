"""The CPU backend: fusion-buffer kernels compiled by numba, which run without the GIL.

Many small tensors go through one kernel call as a tuple of ``_WIDTH`` 1-D arrays (padded with
an empty one) indexed at run time, so each (dtype, width) tuple type compiles once and the
Python cost per tensor stays a few hundred nanoseconds. numba has no 16-bit float type: float16
and bfloat16 arrays enter as uint16 views and the scalar helpers below convert their bits. The
CUDA backend compiles the same scalar helpers (through ``py_func``), so both round alike.

Where the CPU converts float16 in hardware (F16C on x86-64; AArch64), the kernels here use
those instructions instead of the float16 helpers: the same bits for every number, about four
times as fast (``bench kernels``), and NaNs come out quiet (their payloads kept) where the
helpers keep them as they are.
"""

import platform

import llvmlite.binding
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ringtrain import kernels
from ringtrain.buffers import aligned_empty
from ringtrain.ops import ReduceOp

_WIDTH = 16

_SUM = int(ReduceOp.Sum)
_MIN = int(ReduceOp.Min)
_MAX = int(ReduceOp.Max)
_PRODUCT = int(ReduceOp.Product)
_TWO_POW_M24 = np.float32(2.0**-24)  # the least float16 subnormal


def njit(fn):
    """Compile ``fn`` for the CPU without the GIL, cached on disk when a cache dir is writable."""
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # numba found no writable cache location: compile each run instead
        return numba.njit(nogil=True)(fn)


# Scalar helpers, shared with the CUDA backend. They run as plain Python in the CUDA simulator
# too, where the values are NumPy scalars: intermediates stay non-negative and within uint32.


@njit
def _f16_to_f32(h):
    """Return the float32 equal to the float16 with bits ``h`` (NaN payloads kept, as NumPy)."""
    # Every case is computed and one selected, without branches, so that loops vectorize.
    bits = np.uint32(h)
    sign = (bits & 0x8000) << 16
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    normal = ((exponent + 112) << 23) | (mantissa << 13)
    special = 0x7F800000 | (mantissa << 13)  # infinity or NaN
    small = np.float32(np.float32(mantissa) * _TWO_POW_M24).view(np.uint32)  # zero, subnormal
    magnitude = special if exponent == 0x1F else normal
    magnitude = small if exponent == 0 else magnitude
    return np.uint32(sign | magnitude).view(np.float32)


@njit
def _f32_to_f16(x):
    """Return the bits of float32 ``x`` rounded to float16, ties to even, NaN kept as NumPy does."""
    # Every case is computed and one selected, without branches, so that loops vectorize.
    # Rounding drops the low bits after adding just under half of the last kept bit, plus
    # one where that bit is odd: ties go to even, and a carry into the exponent is still
    # the right float16.
    bits = np.float32(x).view(np.uint32)
    sign = (bits >> 16) & 0x8000
    magnitude = bits & 0x7FFFFFFF
    # (Intermediates stay non-negative: the CUDA simulator computes in uint32.)
    rebiased = max(magnitude, 0x38000000) - 0x38000000  # normal float16: drop 13 bits
    normal = (rebiased + 0xFFF + ((rebiased >> 13) & 1)) >> 13
    # A subnormal float16: the mantissa with its hidden bit, in units of 2**-24.
    shift = 126 - min(max(magnitude >> 23, 95), 125)
    hidden = (magnitude & 0x7FFFFF) | 0x800000
    small = (hidden + ((1 << (shift - 1)) - 1) + ((hidden >> shift) & 1)) >> shift
    payload = (magnitude & 0x7FFFFF) >> 13  # a NaN keeps its payload's top bits, never inf
    nan = 0x7C00 | (payload if payload != 0 else 1)
    result = normal if magnitude >= 0x38800000 else small
    result = 0 if magnitude <= 0x33000000 else result  # at most 2**-25: zero
    result = 0x7C00 if magnitude >= 0x477FF000 else result  # halfway past 65504: infinity
    result = nan if magnitude > 0x7F800000 else result
    return np.uint16(sign | result)


@intrinsic
def _f16_to_f32_in_hardware(typingctx, h):
    """Type ``_f16_to_f32_in_hardware(h)``: the float32 of float16 bits ``h``, one instruction."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


@intrinsic
def _f32_to_f16_in_hardware(typingctx, x):
    """Type ``_f32_to_f16_in_hardware(x)``: float32 ``x`` rounded to float16 bits, ties to even."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(x), codegen


def _float16_in_hardware() -> bool:
    """Return True where numba compiles for a CPU that converts float16 in one instruction.

    Elsewhere LLVM would call a runtime function that numba may not link.
    """
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    if numba.config.CPU_FEATURES is not None:  # numba compiles for the features it is given
        return "+f16c" in numba.config.CPU_FEATURES.split(",")
    if numba.config.CPU_NAME is not None:
        return False
    try:
        return bool(llvmlite.binding.get_host_cpu_features().get("f16c"))
    except RuntimeError:  # llvmlite cannot read this host's features
        return False


if _float16_in_hardware():
    _widen_f16, _narrow_f16 = _f16_to_f32_in_hardware, _f32_to_f16_in_hardware
else:
    _widen_f16, _narrow_f16 = _f16_to_f32, _f32_to_f16


@njit
def _bf16_to_f32(h):
    """Return the float32 equal to the bfloat16 with bits ``h``."""
    return np.uint32(np.uint32(h) << 16).view(np.float32)


@njit
def _f32_to_bf16(x):
    """Return the bits of float32 ``x`` rounded to bfloat16, ties to even, NaN as ml_dtypes."""
    bits = np.float32(x).view(np.uint32)
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(((bits >> 16) & 0x8000) | 0x7FC0)
    return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)


@njit
def _combine(op, x, y):
    """Return ``op(x, y)``; Min and Max propagate NaN like ``np.minimum`` and ``np.maximum``."""
    if op == _SUM:
        return x + y
    if op == _MIN:
        return x if x <= y or x != x else y
    if op == _MAX:
        return x if x >= y or x != x else y
    return x * y


@njit
def _scaled(value, scale):
    """Return ``value * scale``, or ``value`` itself when ``scale`` is None or 1 (NaNs kept)."""
    if scale is None:  # pruned at compile time: the CPU kernels' unscaled specialization
        return value
    return value if scale == 1 else value * scale


@njit
def _segment(buffer, offset, size):
    """Return ``buffer[offset:offset + size]``, raising ValueError when it does not fit."""
    if offset < 0 or offset + size > buffer.size:
        raise ValueError("a tensor's segment falls outside the fusion buffer")
    return buffer[offset : offset + size]


@njit
def _pack_copy(sources, count, offsets, start, buffer, scale):
    """Pack ``sources[:count]`` at ``offsets[start:]``, same dtype, times ``scale``."""
    for k in range(count):
        src = sources[k]
        seg = _segment(buffer, offsets[start + k], src.size)
        for j in range(src.size):
            seg[j] = _scaled(src[j], scale)


@njit
def _pack_f16(sources, count, offsets, start, buffer, scale):
    """Pack float16 bits ``sources[:count]`` into a float32 buffer, times ``scale``."""
    for k in range(count):
        src = sources[k]
        seg = _segment(buffer, offsets[start + k], src.size)
        for j in range(src.size):
            seg[j] = _scaled(_widen_f16(src[j]), scale)


@njit
def _pack_bf16(sources, count, offsets, start, buffer, scale):
    """Pack bfloat16 bits ``sources[:count]`` into a float32 buffer, times ``scale``."""
    for k in range(count):
        src = sources[k]
        seg = _segment(buffer, offsets[start + k], src.size)
        for j in range(src.size):
            seg[j] = _scaled(_bf16_to_f32(src[j]), scale)


@njit
def _unpack_copy(destinations, count, offsets, start, buffer, scale):
    """Unpack ``destinations[:count]`` from ``offsets[start:]``, same dtype, times ``scale``."""
    for k in range(count):
        dst = destinations[k]
        seg = _segment(buffer, offsets[start + k], dst.size)
        for j in range(dst.size):
            dst[j] = _scaled(seg[j], scale)


@njit
def _unpack_f16(destinations, count, offsets, start, buffer, scale):
    """Unpack a float32 buffer, times ``scale``, into float16 bits ``destinations[:count]``."""
    for k in range(count):
        dst = destinations[k]
        seg = _segment(buffer, offsets[start + k], dst.size)
        for j in range(dst.size):
            dst[j] = _narrow_f16(_scaled(seg[j], scale))


@njit
def _unpack_bf16(destinations, count, offsets, start, buffer, scale):
    """Unpack a float32 buffer, times ``scale``, into bfloat16 bits ``destinations[:count]``."""
    for k in range(count):
        dst = destinations[k]
        seg = _segment(buffer, offsets[start + k], dst.size)
        for j in range(dst.size):
            dst[j] = _f32_to_bf16(_scaled(seg[j], scale))


@njit
def reduce_elements(dst, a, b, op, scale):
    """Set ``dst[i] = op(a[i], b[i]) * scale``, one loop per op so that each vectorizes.

    Compiled, for compiled callers too: ``op`` and ``scale`` as ``kernels.reduction_args``
    returns them.
    """
    if op == _SUM:
        _reduce_with(dst, a, b, _SUM, scale)
    elif op == _MIN:
        _reduce_with(dst, a, b, _MIN, scale)
    elif op == _MAX:
        _reduce_with(dst, a, b, _MAX, scale)
    else:
        _reduce_with(dst, a, b, _PRODUCT, scale)


@njit
def _reduce_with(dst, a, b, op, scale):
    """Run ``reduce_elements``'s loop for one constant ``op``; read ``dst`` alone if an input."""
    if dst.ctypes.data == a.ctypes.data:  # one array read and written: no overlap check to fail
        for i in range(dst.size):
            dst[i] = _scaled(_combine(op, dst[i], b[i]), scale)
    elif dst.ctypes.data == b.ctypes.data:
        for i in range(dst.size):
            dst[i] = _scaled(_combine(op, a[i], dst[i]), scale)
    else:
        for i in range(dst.size):
            dst[i] = _scaled(_combine(op, a[i], b[i]), scale)


@njit
def _reduce_to_f16(wire, a, b, op, scale):
    """Set float16 bits ``wire[i]`` to ``op(a[i], b[i]) * scale``, ``b`` float16 bits."""
    for i in range(wire.size):
        wire[i] = _narrow_f16(_scaled(_combine(op, a[i], _widen_f16(b[i])), scale))


@njit
def _reduce_to_bf16(wire, a, b, op, scale):
    """Set bfloat16 bits ``wire[i]`` to ``op(a[i], b[i]) * scale``, ``b`` bfloat16 bits."""
    for i in range(wire.size):
        wire[i] = _f32_to_bf16(_scaled(_combine(op, a[i], _bf16_to_f32(b[i])), scale))


# The C library's memcpy, called by name: numba's own slice copy runs at half its speed.
_memcpy = types.ExternalFunction("memcpy", types.uintp(types.uintp, types.uintp, types.uintp))


@njit
def copy_elements(dst, src):
    """Copy 1-D ``src`` into ``dst`` of its length and dtype (compiled; memcpy if contiguous)."""
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        _memcpy(dst.ctypes.data, src.ctypes.data, src.size * src.itemsize)
    else:
        dst[:] = src


_PACK = {kernels._COPY: _pack_copy, kernels._F16: _pack_f16, kernels._BF16: _pack_bf16}
_UNPACK = {kernels._COPY: _unpack_copy, kernels._F16: _unpack_f16, kernels._BF16: _unpack_bf16}
_REDUCE_TO_WIRE = {kernels._F16: _reduce_to_f16, kernels._BF16: _reduce_to_bf16}


def pack(sources, buffer, offsets, scale=1.0):
    """Copy ``sources[i]``, times ``scale``, into ``buffer`` from element ``offsets[i]`` on."""
    if not len(sources):
        return
    kind, scale = kernels._conversion(sources[0].dtype, buffer, scale)
    _run(_PACK[kind], _flat(sources, writing=False), buffer, offsets, scale)


def unpack(buffer, offsets, destinations, scale=1.0):
    """Copy ``buffer`` from element ``offsets[i]`` on, times ``scale``, into ``destinations[i]``."""
    if not len(destinations):
        return
    kind, scale = kernels._conversion(destinations[0].dtype, buffer, scale)
    _run(_UNPACK[kind], _flat(destinations, writing=True), buffer, offsets, scale)


def reduce(dst, a, b, op, scale=1.0):
    """Set ``dst[:] = op(a, b) * scale`` element-wise; ``dst`` may be ``a`` or ``b`` itself."""
    op, scale = kernels.reduction_args(dst, a, b, op, scale)
    reduce_elements(dst, a, b, op, scale)


def reduce_to_wire(wire, a, b, op, scale=1.0):
    """Set 16-bit ``wire[:]`` to float32 ``op(a, b) * scale`` rounded; ``b`` is 16-bit too."""
    kind, op, scale = kernels.wire_reduction_args(wire, a, b, op, scale)
    _REDUCE_TO_WIRE[kind](wire.view(np.uint16), a, b.view(np.uint16), op, scale)


def empty(shape, dtype):
    """Return a new uninitialized NumPy array of ``shape`` (an int for 1-D), 64-byte aligned."""
    return aligned_empty(shape, dtype)


def pinned_empty(nbytes):
    """Return ``nbytes`` uninitialized host bytes to stage device data in (plain ones here)."""
    return aligned_empty(nbytes, np.uint8)


def to_host(device_array, host_array):
    """Copy ``device_array`` into ``host_array``; on the CPU both are NumPy arrays."""
    np.copyto(host_array, device_array)


def to_device(host_array, device_array):
    """Copy ``host_array`` into ``device_array``; on the CPU both are NumPy arrays."""
    np.copyto(device_array, host_array)


def _flat(arrays, writing):
    """Return ``arrays`` as 1-D views of one numba type, 16-bit floats viewed as uint16."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        names = sorted({str(a.dtype) for a in arrays})
        raise TypeError(f"the tensors of one call must share a dtype, got {', '.join(names)}")
    if writing and not all(a.flags.c_contiguous and a.flags.writeable for a in arrays):
        raise ValueError("destinations must be writeable C-contiguous arrays")
    flat = [a.ravel() for a in arrays]  # a view, or a copy of a non-contiguous source
    if not writing and not all(f.flags.writeable for f in flat):
        for f in flat:  # one read-only source makes the tuple's type read-only throughout
            f.flags.writeable = False
    if kernels._is_half(dtype):
        return [f.view(np.uint16) for f in flat]
    return flat


def _run(kernel, arrays, buffer, offsets, scale):
    """Call ``kernel`` on ``arrays`` in tuples of ``_WIDTH``, padded with an empty array."""
    if len(offsets) != len(arrays):
        raise ValueError(f"{len(arrays)} tensors but {len(offsets)} offsets")
    if kernels._is_half(buffer.dtype):
        buffer = buffer.view(np.uint16)
    offsets = np.asarray(offsets, dtype=np.int64)
    pad = arrays[0][:0]
    for start in range(0, len(arrays), _WIDTH):
        chunk = arrays[start : start + _WIDTH]
        count = len(chunk)
        chunk.extend([pad] * (_WIDTH - count))
        kernel(tuple(chunk), count, offsets, start, buffer, scale)
