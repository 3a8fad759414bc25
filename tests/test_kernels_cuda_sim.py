"""The CUDA kernels, run by numba's CUDA simulator, agree bit for bit with the CPU kernels.

The simulator must be switched on before numba is first imported, and the CPU tests import
numba without it. So in an ordinary run only ``test_simulated_cases_pass`` runs: it reruns this
file in a fresh interpreter with ``NUMBA_ENABLE_CUDASIM=1``, where the cases run instead.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringtrain import dtypes, kernels
from ringtrain.ops import ReduceOp

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ROOT = Path(__file__).resolve().parents[1]
simulated = pytest.mark.skipif(not SIMULATED, reason="runs in the simulator subprocess")
# Simulated kernels compute on NumPy scalars, which warn where GPUs silently wrap integers and
# quiet signaling NaNs.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

F32 = np.dtype(np.float32)
INTEGERS = [d for d in dtypes.SUPPORTED if dtypes.is_integer(d)]
REDUCIBLE = INTEGERS + [F32, np.dtype(np.float64)]
SHAPES = [(0,), (1,), (7,), (3, 5), (2, 3, 4), (70,)]
# float32 values whose rounding to float16 or bfloat16 is a tie, a carry, an overflow or a NaN
PROBES = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7FA00000, 0xFFC00001, 0x477FF000, 0x477FEFFF]
PROBES += [0x33000000, 0x33C00000, 0x34200000, 0x387FC000, 0x3F801000, 0x3F803000, 0x80000000]


@pytest.mark.skipif(SIMULATED, reason="this is the simulated run")
def test_simulated_cases_pass():
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": path}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


@pytest.fixture
def gpu(monkeypatch):
    """Return the CUDA backend with small launches, so every kernel runs its grid-stride loop."""
    from ringtrain.kernels import cuda as backend

    monkeypatch.setattr(backend, "_THREADS", 16)
    monkeypatch.setattr(backend, "_MAX_BLOCKS", 2)
    monkeypatch.setattr(backend, "_WIDTH", 4)  # six tensors take two launches
    return backend


def cpu():
    """Return the CPU backend, the reference here."""
    return kernels.backend_for(np.zeros(1))


def on_device(array):
    """Return a simulated device copy of ``array``."""
    from numba import cuda

    return cuda.to_device(array)


def bits(array):
    """Return the raw bit patterns of ``array``."""
    return array.view(f"u{array.dtype.itemsize}")


def sample(dtype, shape, rng):
    """Return full-range integers, or floats with NaN, a signaling NaN and infinities mixed in."""
    dtype = np.dtype(dtype)
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    values = (rng.standard_normal(shape) * 100).astype(dtype)
    flat = values.reshape(-1)
    if flat.size > 10:  # at places that differ between arrays, so NaN meets numbers
        nan, inf, minus_inf, signaling = rng.choice(flat.size, 4, replace=False)
        flat[nan], flat[inf], flat[minus_inf] = np.nan, np.inf, -np.inf
        bits(flat)[signaling] = bits(flat)[inf] + 1
    return values


def layout(shapes):
    """Return offsets that leave a gap before every tensor, and the buffer length."""
    offsets, end = [], 2
    for shape in shapes:
        offsets.append(end)
        end += int(np.prod(shape)) + 2
    return offsets, end


CONVERSIONS = [(d, d, 1.0) for d in dtypes.SUPPORTED]
CONVERSIONS += [(F32, F32, 0.5), (np.dtype(np.float64), np.dtype(np.float64), 1 / 3)]
CONVERSIONS += [(np.dtype(np.float16), F32, 1 / 3), (dtypes.bfloat16, F32, 1 / 3)]


@simulated
@pytest.mark.parametrize(("dtype", "buffer_dtype", "scale"), CONVERSIONS, ids=str)
def test_pack_and_unpack_agree_with_cpu(gpu, dtype, buffer_dtype, scale):
    rng = np.random.default_rng(7)
    sources = [sample(dtype, shape, rng) for shape in SHAPES]
    offsets, n = layout(SHAPES)
    expected = np.full(n, 9, buffer_dtype)
    cpu().pack(sources, expected, offsets, scale)
    buffer = on_device(np.full(n, 9, buffer_dtype))
    gpu.pack([on_device(s) for s in sources], buffer, offsets, scale)
    np.testing.assert_array_equal(bits(buffer.copy_to_host()), bits(expected))

    wanted = [np.zeros(shape, dtype) for shape in SHAPES]
    cpu().unpack(expected, offsets, wanted, scale)
    outputs = [on_device(np.zeros(shape, dtype)) for shape in SHAPES]
    gpu.unpack(buffer, offsets, outputs, scale)
    for out, want in zip(outputs, wanted, strict=True):
        np.testing.assert_array_equal(bits(out.copy_to_host()), bits(want))


@simulated
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), dtypes.bfloat16], ids=str)
def test_rounding_to_16_bits_agrees_with_cpu(gpu, dtype):
    sweep = np.arange(0, 2**32, 2**32 // 1500, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([np.array(PROBES, np.uint32), sweep]).view(np.float32)
    wanted = np.zeros(values.size, dtype)
    cpu().unpack(values, [0], [wanted], 1.0)
    out = on_device(np.zeros(values.size, dtype))
    gpu.unpack(on_device(values), [0], [out], 1.0)
    np.testing.assert_array_equal(bits(out.copy_to_host()), bits(wanted))


@simulated
@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", [ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product])
def test_reduce_agrees_with_cpu(gpu, dtype, op):
    rng = np.random.default_rng(8)
    a, b = sample(dtype, (300,), rng), sample(dtype, (300,), rng)
    scale = 1.0 if dtypes.is_integer(dtype) else 0.375
    wanted = np.empty_like(a)
    cpu().reduce(wanted, a, b, op, scale)
    dst, da = on_device(np.zeros_like(a)), on_device(a)
    gpu.reduce(dst, da, on_device(b), op, scale)
    np.testing.assert_array_equal(bits(dst.copy_to_host()), bits(wanted))
    gpu.reduce(da, da, on_device(b), op, scale)  # dst is a
    np.testing.assert_array_equal(bits(da.copy_to_host()), bits(wanted))


@simulated
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("op", [ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product])
def test_reduce_to_wire_agrees_with_cpu(gpu, dtype, op):
    rng = np.random.default_rng(9)
    a, b = sample(F32, (300,), rng), sample(F32, (300,), rng).astype(dtype)
    a[: len(PROBES)] = np.array(PROBES, np.uint32).view(np.float32)
    for scale in (1.0, 0.375):
        wanted = np.zeros(a.size, dtype)
        cpu().reduce_to_wire(wanted, a, b, op, scale)
        wire = on_device(np.zeros(a.size, dtype))
        gpu.reduce_to_wire(wire, on_device(a), on_device(b), op, scale)
        np.testing.assert_array_equal(bits(wire.copy_to_host()), bits(wanted))


@simulated
def test_backend_for_gpu_arrays(gpu):
    class CudaArrayLike:
        __cuda_array_interface__ = {}

    assert kernels.backend_for(on_device(np.zeros(2))) is gpu
    assert kernels.backend_for(CudaArrayLike()) is gpu


@simulated
def test_gpu_errors(gpu):
    buffer = on_device(np.zeros(10, F32))
    with pytest.raises(ValueError, match="outside"):
        gpu.pack([on_device(np.zeros(3, F32))], buffer, [8], 1.0)
    with pytest.raises(ValueError, match="offsets"):
        gpu.unpack(buffer, [0, 1], [on_device(np.zeros(3, F32))], 1.0)
    ints = on_device(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"int32.*0\.5"):
        gpu.reduce(ints, ints, ints, ReduceOp.Sum, 0.5)
    with pytest.raises(TypeError, match="share a dtype"):
        gpu.pack([on_device(np.zeros(1, F32)), ints], buffer, [0, 1], 1.0)


@simulated
def test_staging_through_host(gpu):
    device = gpu.empty(5, F32)
    gpu.to_device(np.arange(5, dtype=F32), device)
    host = np.zeros(5, F32)
    gpu.to_host(device, host)
    np.testing.assert_array_equal(host, np.arange(5, dtype=F32))
