"""The CPU fusion-buffer kernels, checked element for element (and bit for bit) against NumPy."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from kernel_data import assert_bits, random_array

from ringtrain import dtypes, kernels
from ringtrain.kernels import cpu
from ringtrain.ops import ReduceOp

BF16 = dtypes.bfloat16
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
INTEGERS = [d for d in dtypes.SUPPORTED if dtypes.is_integer(d)]
FLOATS = [F32, np.dtype(np.float64)]
KERNEL_OPS = [ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product]
NUMPY_OPS = {
    ReduceOp.Sum: np.add,
    ReduceOp.Min: np.minimum,
    ReduceOp.Max: np.maximum,
    ReduceOp.Product: np.multiply,
}
SHAPES = [(0,), (1,), (7,), (3, 4, 5), (1000003,)]
SENTINEL = 99
ROOT = Path(__file__).resolve().parents[1]
# The data holds signaling NaNs, on which NumPy's own arithmetic raises the invalid flag.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# float32 bit patterns where rounding to 16 bits can go wrong
ROUNDING_PROBES = {
    "zeros, float32 subnormals": [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000],
    "bfloat16 ties and near-ties": [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000],
    "bfloat16 carries, overflow": [0x3F7FFFFF, 0x3FFFFFFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000],
    "infinities, quiet NaN": [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC00001],
    "signaling NaN payloads": [0x7F800001, 0x7FA00000, 0xFFA00000, 0x7FBFFFFF, 0x7F802000],
    "float16 max 65504 to infinity": [0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000],
    "float16 zero or least subnormal": [0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000],
    "float16 subnormal ties": [0x33C00000, 0x34200000, 0x34600000, 0x34400000, 0x34000000],
    "float16 subnormal to normal carry": [0x387FC000, 0x387FE000, 0x387FFFFF, 0x38800000],
    "float16 normal ties": [0x3F801000, 0x3F803000, 0x3F802000, 0x3F801001, 0xBF803000],
}


def layout(shapes, gap=3):
    """Return element offsets placing tensors of ``shapes`` with gaps, and the buffer length."""
    offsets, end = [], gap
    for shape in shapes:
        offsets.append(end)
        end += int(np.prod(shape)) + gap
    return offsets, end


def sentinel_buffer(dtype, n):
    """Return a buffer filled with a marker, so that writes outside the segments show."""
    return np.full(n, SENTINEL, dtype=dtype)


def expected_pack(sources, buffer_dtype, offsets, n, scale):
    """Return the buffer NumPy computes for ``pack``: widen, then scale in the buffer's dtype."""
    expected = sentinel_buffer(buffer_dtype, n)
    for src, offset in zip(sources, offsets, strict=True):
        values = src.reshape(-1).astype(buffer_dtype)
        if scale != 1:
            values = values * buffer_dtype.type(scale)
        expected[offset : offset + src.size] = values
    return expected


def expected_unpack(buffer, offsets, shapes, dtype, scale):
    """Return the tensors NumPy computes for ``unpack``: scale in the buffer's dtype, narrow."""
    out = []
    for shape, offset in zip(shapes, offsets, strict=True):
        segment = buffer[offset : offset + int(np.prod(shape))]
        if scale != 1:
            segment = segment * buffer.dtype.type(scale)
        out.append(segment.astype(dtype).reshape(shape))
    return out


def pack_and_unpack(dtype, buffer_dtype, shapes, offsets, n, scale, rng):
    """Pack random tensors of ``shapes``, check the buffer, unpack and check the tensors."""
    sources = [random_array(dtype, shape, rng) for shape in shapes]
    nan_bits = dtype != F16 or buffer_dtype == F16
    buffer = sentinel_buffer(buffer_dtype, n)
    cpu.pack(sources, buffer, offsets, scale)
    assert_bits(buffer, expected_pack(sources, buffer_dtype, offsets, n, scale), nan_bits)
    outputs = [np.zeros(shape, dtype) for shape in shapes]
    cpu.unpack(buffer, offsets, outputs, 1 / scale)
    expected = expected_unpack(buffer, offsets, shapes, dtype, 1 / scale)
    for out, want in zip(outputs, expected, strict=True):
        assert_bits(out, want, nan_bits)
    return sources, outputs


@pytest.mark.parametrize("dtype", dtypes.SUPPORTED, ids=str)
def test_pack_then_unpack_in_the_same_dtype_is_an_exact_copy(dtype):
    offsets, n = layout(SHAPES)
    sources, outputs = pack_and_unpack(
        dtype, dtype, SHAPES, offsets, n, 1.0, np.random.default_rng(1)
    )
    for out, src in zip(outputs, sources, strict=True):
        assert_bits(out, src)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_pack_and_unpack_scale_floats_like_numpy(dtype, scale):
    offsets, n = layout(SHAPES)
    pack_and_unpack(dtype, dtype, SHAPES, offsets, n, scale, np.random.default_rng(2))


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_half_floats_widen_into_and_narrow_out_of_float32(dtype, scale):
    offsets, n = layout(SHAPES)
    pack_and_unpack(dtype, F32, SHAPES, offsets, n, scale, np.random.default_rng(3))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_two_hundred_sources_at_shuffled_offsets(dtype):
    rng = np.random.default_rng(4)
    shapes = [(int(k),) if i % 3 else (2, int(k)) for i, k in enumerate(rng.integers(0, 300, 200))]
    offsets, n = layout(shapes, gap=2)
    order = rng.permutation(len(shapes))  # offsets need not grow with the index
    shapes = [shapes[i] for i in order]
    offsets = [offsets[i] for i in order]
    pack_and_unpack(dtype, F32, shapes, offsets, n, 0.25, rng)


def float32_patterns():
    """Return the rounding probes and a sweep over every 4093rd float32 bit pattern."""
    probes = [p for group in ROUNDING_PROBES.values() for p in group]
    sweep = np.arange(0, 2**32, 4093, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(probes, np.uint32), sweep]).view(np.float32)


def test_float32_to_bfloat16_matches_ml_dtypes_bit_for_bit():
    values = float32_patterns()
    out = np.zeros(values.size, BF16)
    cpu.unpack(values, [0], [out], 1.0)
    with np.errstate(invalid="ignore"):
        assert_bits(out, values.astype(BF16))


def test_float32_to_float16_matches_numpy():
    values = float32_patterns()
    out = np.zeros(values.size, F16)
    cpu.unpack(values, [0], [out], 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        assert_bits(out, values.astype(F16), nan_bits=False)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(values))


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_reduce_to_wire_rounds_like_numpy_and_ml_dtypes(dtype):
    # Max with -inf leaves every pattern as it is (no arithmetic: NaNs keep their bits), so
    # the kernel's rounding meets every probe: ties to even, carries, overflow, subnormals.
    values = float32_patterns()
    wire = np.zeros(values.size, dtype)
    cpu.reduce_to_wire(wire, values, np.full(values.size, -np.inf, dtype), ReduceOp.Max)
    with np.errstate(invalid="ignore", over="ignore"):
        assert_bits(wire, values.astype(dtype), nan_bits=dtype == BF16)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("op", KERNEL_OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("n", [0, 1, 7, 100003])
def test_reduce_to_wire_matches_numpy_in_float32_then_rounded(dtype, op, scale, n):
    rng = np.random.default_rng([n, int(op)])
    a = random_array(F32, (n,), rng)
    b = random_array(F32, (n,), rng).astype(dtype)
    wire = np.full(n, 7, dtype)
    cpu.reduce_to_wire(wire, a, b, op, scale)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (NUMPY_OPS[op](a, b.astype(F32)) * np.float32(scale)).astype(dtype)
    assert_bits(wire, want, nan_bits=False)


def test_reduce_to_wire_rejects_bad_operands():
    a, half = np.zeros(4, F32), np.zeros(4, F16)
    with pytest.raises(ValueError, match="lengths differ: wire 3, a 4, b 4"):
        cpu.reduce_to_wire(half[:3], a, half, ReduceOp.Sum)
    with pytest.raises(TypeError, match="got a float64, wire float16, b float16"):
        cpu.reduce_to_wire(half, a.astype(np.float64), half, ReduceOp.Sum)
    with pytest.raises(TypeError, match="wire float16, b bfloat16"):
        cpu.reduce_to_wire(half, a, half.astype(BF16), ReduceOp.Sum)
    with pytest.raises(TypeError, match="wire float32, b float32"):
        cpu.reduce_to_wire(a, a, a, ReduceOp.Sum)
    with pytest.raises(ValueError, match="not Average"):
        cpu.reduce_to_wire(half, a, half, ReduceOp.Average)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_every_16_bit_pattern_widens_exactly(dtype):
    patterns = np.arange(2**16, dtype=np.uint16).view(dtype)
    buffer = np.zeros(patterns.size, F32)
    cpu.pack([patterns], buffer, [0], 1.0)
    assert_bits(buffer, patterns.astype(F32), nan_bits=dtype == BF16)


@numba.njit
def _each(convert, values, out):
    for i in range(values.size):
        out[i] = convert(values[i])
    return out


def test_the_float16_helpers_compiled_for_the_cpu_round_like_numpy_nan_bits_too():
    """The kernels' conversions where the CPU has none in hardware, and the CUDA kernels'."""
    patterns = np.arange(2**16, dtype=np.uint16)
    widened = _each(cpu._f16_to_f32, patterns, np.empty(patterns.size, F32))
    assert_bits(widened, patterns.view(F16).astype(F32))
    values = float32_patterns()
    narrowed = _each(cpu._f32_to_f16, values, np.empty(values.size, np.uint16))
    with np.errstate(invalid="ignore", over="ignore"):
        assert_bits(narrowed.view(F16), values.astype(F16))


@pytest.mark.skipif(
    platform.machine().lower() in ("aarch64", "arm64"), reason="AArch64 always has them"
)
def test_float16_instructions_are_used_only_where_numba_compiles_for_them(monkeypatch):
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx,+f16c")
    assert cpu._float16_in_hardware()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx,-f16c")
    assert not cpu._float16_in_hardware()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)
    monkeypatch.setattr(numba.config, "CPU_NAME", "generic")
    assert not cpu._float16_in_hardware()


def test_read_only_and_strided_sources_pack_and_stay_read_only():
    writable = np.arange(5, dtype=F32)
    read_only = np.arange(10, 16, dtype=F32)
    read_only.flags.writeable = False
    strided = np.arange(20, dtype=F32).reshape(4, 5).T  # not C-contiguous
    sources = [writable, read_only, strided]
    offsets, n = layout([s.shape for s in sources])
    buffer = sentinel_buffer(F32, n)
    cpu.pack(sources, buffer, offsets, 1.0)
    np.testing.assert_array_equal(buffer, expected_pack(sources, F32, offsets, n, 1.0))
    assert writable.flags.writeable and not read_only.flags.writeable


@pytest.mark.parametrize("dtype", INTEGERS + FLOATS, ids=str)
@pytest.mark.parametrize("op", KERNEL_OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("n", [0, 1, 7, 1000003])
def test_reduce_matches_numpy(dtype, op, n):
    rng = np.random.default_rng(n)
    a, b = random_array(dtype, (n,), rng), random_array(dtype, (n,), rng)
    dst = np.full(n, SENTINEL, dtype)
    cpu.reduce(dst, a, b, op, 1.0)
    np.testing.assert_array_equal(dst, NUMPY_OPS[op](a, b))  # integers wrap around
    if not dtypes.is_integer(dtype):
        cpu.reduce(dst, a, b, op, 0.125)
        np.testing.assert_array_equal(dst, NUMPY_OPS[op](a, b) * dtype.type(0.125))


@pytest.mark.parametrize("dtype", [np.dtype(np.int8), F32], ids=str)
@pytest.mark.parametrize("op", KERNEL_OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("into", ["a", "b"])
def test_reduce_into_an_input_itself(dtype, op, into):
    rng = np.random.default_rng(5)
    a, b = random_array(dtype, (1001,), rng), random_array(dtype, (1001,), rng)
    a[:5], b[:5] = 0, -0.0  # the order of the operands decides Min and Max's sign of zero
    expected = NUMPY_OPS[op](a, b)
    apart = np.empty_like(a)
    cpu.reduce(apart, a, b, op, 1.0)
    dst = a if into == "a" else b
    cpu.reduce(dst, a, b, op, 1.0)
    np.testing.assert_array_equal(dst, expected)
    assert_bits(dst, apart)  # the same bits as into an array of its own


def test_unscaled_float_sum_is_bit_exact():
    rng = np.random.default_rng(6)
    a, b = random_array(F32, (4099,), rng), random_array(F32, (4099,), rng)
    dst = np.empty_like(a)
    cpu.reduce(dst, a, b, ReduceOp.Sum)
    assert_bits(dst, a + b)


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_data_rejects_a_scale(dtype):
    data = np.zeros(4, dtype)
    message = rf"{dtype}.*0\.5"
    with pytest.raises(ValueError, match=message):
        cpu.pack([data], np.zeros(4, dtype), [0], 0.5)
    with pytest.raises(ValueError, match=message):
        cpu.unpack(np.zeros(4, dtype), [0], [data], 0.5)
    with pytest.raises(ValueError, match=message):
        cpu.reduce(data, data, data, ReduceOp.Sum, 0.5)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_half_floats_copied_into_their_own_dtype_reject_a_scale(dtype):
    with pytest.raises(ValueError, match=str(dtype)):
        cpu.pack([np.zeros(4, dtype)], np.zeros(4, dtype), [0], 0.5)


def test_reduce_rejects_average_half_floats_and_mismatches():
    f32 = np.zeros(4, F32)
    with pytest.raises(ValueError, match="Average"):
        cpu.reduce(f32, f32, f32, ReduceOp.Average, 0.5)
    half = np.zeros(4, F16)
    with pytest.raises(TypeError, match="float16"):
        cpu.reduce(half, half, half, ReduceOp.Sum)
    with pytest.raises(ValueError, match="lengths"):
        cpu.reduce(f32, f32, np.zeros(5, F32), ReduceOp.Sum)
    with pytest.raises(TypeError, match="dtypes"):
        cpu.reduce(f32, f32, np.zeros(4, np.float64), ReduceOp.Sum)
    square = f32.reshape(2, 2)
    with pytest.raises(ValueError, match="1-D"):
        cpu.reduce(square, square, square, ReduceOp.Sum)


def test_pack_and_unpack_reject_bad_layouts():
    buffer = np.zeros(10, F32)
    with pytest.raises(ValueError, match="offsets"):
        cpu.pack([np.zeros(3, F32)], buffer, [0, 3], 1.0)
    with pytest.raises(ValueError, match="outside"):
        cpu.pack([np.zeros(3, F32)], buffer, [8], 1.0)
    with pytest.raises(ValueError, match="outside"):
        cpu.unpack(buffer, [-1], [np.zeros(3, F32)], 1.0)
    with pytest.raises(TypeError, match="share a dtype"):
        cpu.pack([np.zeros(3, F32), np.zeros(3, np.float64)], buffer, [0, 3], 1.0)
    with pytest.raises(TypeError, match="int32 tensors through a float32 buffer"):
        cpu.pack([np.zeros(3, np.int32)], buffer, [0], 1.0)
    with pytest.raises(ValueError, match="1-D"):
        cpu.pack([np.zeros(3, F32)], buffer.reshape(2, 5), [0], 1.0)
    with pytest.raises(ValueError, match="C-contiguous"):
        cpu.unpack(buffer, [0], [np.zeros((3, 2), F32).T], 1.0)
    read_only = np.zeros(3, F32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        cpu.unpack(buffer, [0], [read_only], 1.0)


def test_empty_and_host_copies():
    buffer = cpu.empty(6, F32)
    assert isinstance(buffer, np.ndarray) and buffer.shape == (6,) and buffer.dtype == F32
    host = np.arange(6, dtype=F32)
    cpu.to_device(host, buffer)
    back = np.zeros(6, F32)
    cpu.to_host(buffer, back)
    np.testing.assert_array_equal(back, host)


def test_backend_for_numpy_is_cpu():
    assert kernels.backend_for(np.zeros(1)) is cpu


def test_cpu_use_does_not_import_numba_cuda():
    code = (
        "import sys, numpy as np\n"
        "from ringtrain import kernels\n"
        "b = kernels.backend_for(np.zeros(4, np.float32))\n"
        "b.pack([np.ones(2, np.float32)], np.zeros(4, np.float32), [1], 1.0)\n"
        "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported'\n"
    )
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p)
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


def test_kernels_release_the_gil():
    dispatchers = [v for v in vars(cpu).values() if hasattr(v, "py_func")]
    assert len(dispatchers) >= 10
    assert all(d.targetoptions.get("nogil") for d in dispatchers)


def test_a_function_numba_cannot_cache_still_compiles():
    namespace = {}
    exec(compile("def plus_one(x):\n    return x + 1\n", "<no file>", "exec"), namespace)
    assert cpu.njit(namespace["plus_one"])(1) == 2


@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (1025, 3), (2, 0)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64])
def test_empty_arrays_start_on_a_64_byte_boundary(shape, dtype):
    array = cpu.empty(shape, dtype)
    assert array.shape == ((shape,) if isinstance(shape, int) else shape)
    assert array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
    if array.size:
        assert array.ctypes.data % 64 == 0


@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("length", [0, 1, 1025])
def test_copy_elements_copies_contiguous_and_strided_arrays(length, step):
    source = np.random.default_rng(length).random(length * step)[::step]
    out = np.zeros(2 * length)[::step] if step > 1 else np.zeros(length)
    cpu.copy_elements(out, source)
    np.testing.assert_array_equal(out, source)
