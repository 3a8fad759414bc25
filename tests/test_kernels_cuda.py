"""The CUDA kernels agree bit for bit with the CPU kernels, in numba's simulator and on a GPU.

The simulator must be switched on before numba is first imported, and the CPU tests import
numba without it. So ``test_simulated_cases_pass`` reruns this file in a fresh interpreter with
``NUMBA_ENABLE_CUDASIM=1``, where the cases run. Where numba finds a GPU, the cases also run
in this interpreter, on it; ``test_full_launches_on_a_gpu`` runs there alone (the simulator
would take minutes over it).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_data import assert_bits, random_array

from ringtrain import capabilities, dtypes, kernels
from ringtrain.kernels.device_view import DeviceView
from ringtrain.ops import ReduceOp

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ON_GPU = not SIMULATED and capabilities.cuda_built()
ROOT = Path(__file__).resolve().parents[1]
device_case = pytest.mark.skipif(
    not (SIMULATED or ON_GPU), reason="no GPU here: runs in the simulator subprocess"
)
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
    monkeypatch.setattr(backend, "_MAX_TENSORS", 4)  # six tensors take two launches
    return backend


def cpu():
    """Return the CPU backend, the reference here."""
    return kernels.backend_for(np.zeros(1))


def on_device(array):
    """Return a device copy of ``array`` (simulated or on the GPU), bfloat16 included."""
    from ringtrain.kernels import cuda as backend

    copy = backend.empty(array.shape, array.dtype)
    backend.to_device(np.ascontiguousarray(array), copy)
    return copy


def assert_same_bits(device_array, want):
    """Assert that ``device_array`` holds ``want``'s bits, NaN payloads aside.

    Where ``want`` has a NaN, any NaN passes: a GPU's float arithmetic returns its canonical NaN
    where the CPU keeps an operand's.
    """
    from ringtrain.kernels import cuda as backend

    got = np.empty(want.shape, want.dtype)
    backend.to_host(device_array, got)
    assert_bits(got, want, nan_bits=False)


def assert_pack_and_unpack_agree(gpu, sources, buffer_dtype, scale):
    """Pack ``sources`` into a buffer, and unpack it again, on both backends; compare each."""
    shapes = [s.shape for s in sources]
    offsets, n = layout(shapes)
    expected = np.full(n, 9, buffer_dtype)
    cpu().pack(sources, expected, offsets, scale)
    buffer = on_device(np.full(n, 9, buffer_dtype))
    gpu.pack([on_device(s) for s in sources], buffer, offsets, scale)
    assert_same_bits(buffer, expected)
    dtype = sources[0].dtype
    wanted = [np.zeros(shape, dtype) for shape in shapes]
    cpu().unpack(expected, offsets, wanted, scale)
    outputs = [on_device(np.zeros(shape, dtype)) for shape in shapes]
    gpu.unpack(buffer, offsets, outputs, scale)
    for out, want in zip(outputs, wanted, strict=True):
        assert_same_bits(out, want)


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


@device_case
@pytest.mark.parametrize(("dtype", "buffer_dtype", "scale"), CONVERSIONS, ids=str)
def test_pack_and_unpack_agree_with_cpu(gpu, dtype, buffer_dtype, scale):
    rng = np.random.default_rng(7)
    sources = [random_array(dtype, shape, rng) for shape in SHAPES]
    assert_pack_and_unpack_agree(gpu, sources, buffer_dtype, scale)


@device_case
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), dtypes.bfloat16], ids=str)
def test_rounding_to_16_bits_agrees_with_cpu(gpu, dtype):
    sweep = np.arange(0, 2**32, 2**32 // 1500, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([np.array(PROBES, np.uint32), sweep]).view(np.float32)
    wanted = np.zeros(values.size, dtype)
    cpu().unpack(values, [0], [wanted], 1.0)
    out = on_device(np.zeros(values.size, dtype))
    gpu.unpack(on_device(values), [0], [out], 1.0)
    assert_same_bits(out, wanted)


@device_case
@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", [ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product])
def test_reduce_agrees_with_cpu(gpu, dtype, op):
    rng = np.random.default_rng(8)
    a, b = random_array(dtype, (300,), rng), random_array(dtype, (300,), rng)
    scale = 1.0 if dtypes.is_integer(dtype) else 0.375
    wanted = np.empty_like(a)
    cpu().reduce(wanted, a, b, op, scale)
    dst, da = on_device(np.zeros_like(a)), on_device(a)
    gpu.reduce(dst, da, on_device(b), op, scale)
    assert_same_bits(dst, wanted)
    gpu.reduce(da, da, on_device(b), op, scale)  # dst is a
    assert_same_bits(da, wanted)


@device_case
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("op", [ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product])
def test_reduce_to_wire_agrees_with_cpu(gpu, dtype, op):
    rng = np.random.default_rng(9)
    a, b = random_array(F32, (300,), rng), random_array(F32, (300,), rng).astype(dtype)
    a[: len(PROBES)] = np.array(PROBES, np.uint32).view(np.float32)
    for scale in (1.0, 0.375):
        wanted = np.zeros(a.size, dtype)
        cpu().reduce_to_wire(wanted, a, b, op, scale)
        wire = on_device(np.zeros(a.size, dtype))
        gpu.reduce_to_wire(wire, on_device(a), on_device(b), op, scale)
        assert_same_bits(wire, wanted)


@device_case
def test_backend_for_gpu_arrays(gpu):
    class CudaArrayLike:
        __cuda_array_interface__ = {}

    assert kernels.backend_for(on_device(np.zeros(2))) is gpu
    assert kernels.backend_for(CudaArrayLike()) is gpu


@device_case
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
    column = on_device(np.zeros((3, 2), F32))[:, 1]
    with pytest.raises(ValueError, match=r"shape \(3,\) is not C-contiguous"):
        gpu.pack([column], buffer, [0], 1.0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        gpu.unpack(buffer, [0], [column], 1.0)


@device_case
def test_staging_through_host(gpu):
    device = gpu.empty(5, F32)
    gpu.to_device(np.arange(5, dtype=F32), device)
    host = np.zeros(5, F32)
    gpu.to_host(device, host)
    np.testing.assert_array_equal(host, np.arange(5, dtype=F32))


@device_case
@pytest.mark.parametrize("dtype", [F32, np.dtype(np.int8), dtypes.bfloat16], ids=str)
def test_views_of_a_device_array_are_its_pieces_and_read_back_through_numba(gpu, dtype):
    data = random_array(dtype, (20,), np.random.default_rng(3))
    base = on_device(data)
    starts, shapes = [0, 3, 7, 20], [(3,), (2, 2), (13,), (0,)]
    views = gpu.views(base, starts, shapes)
    for view, start, shape in zip(views, starts, shapes, strict=True):
        assert type(view) is DeviceView and view.owner is base and view.dtype == dtype
        assert view.address == gpu.address(base) + start * dtype.itemsize
        back = gpu.as_numba(view)
        assert back.dtype == dtype and tuple(back.shape) == shape
        size = int(np.prod(shape))
        assert_same_bits(back, data[start : start + size].reshape(shape))
    assert gpu.as_numba(base) is base  # a numba array is its own


@device_case
def test_a_view_exports_its_memory_through_dlpack_and_refuses_a_copy(gpu):
    from ringtrain import dlpack

    data = np.arange(12, dtype=dtypes.bfloat16)
    view = gpu.views(on_device(data), [4], [(2, 3)])[0]
    assert view.__dlpack_device__() == (dlpack.CUDA, gpu.device_id())
    seen = dlpack.view(view.__dlpack__(stream=1))
    assert type(seen) is DeviceView and seen.owner.address == view.address
    assert (seen.address, seen.shape, seen.dtype) == (view.address, (2, 3), dtypes.bfloat16)
    assert_same_bits(gpu.as_numba(seen), data[4:10].reshape(2, 3))
    assert "dltensor_versioned" in repr(view.__dlpack__(max_version=(1, 0)))  # as mpi4py asks
    assert "dltensor_versioned" not in repr(view.__dlpack__(max_version=(0, 8)))
    with pytest.raises(BufferError, match="uncopied"):
        view.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="uncopied"):
        view.__dlpack__(dl_device=(dlpack.CPU, 0))


@device_case
def test_pack_and_unpack_take_views_as_they_take_numba_arrays(gpu):
    rng = np.random.default_rng(4)
    sources = [random_array(F32, shape, rng) for shape in [(4,), (0,), (2, 3)]]
    held = [on_device(s) for s in sources]
    views = [gpu.views(a.reshape(-1), [0], [a.shape])[0] for a in held]
    offsets, n = layout([s.shape for s in sources])
    buffer = on_device(np.zeros(n, F32))
    gpu.pack(views, buffer, offsets, 2.0)
    expected = np.zeros(n, F32)
    cpu().pack(sources, expected, offsets, 2.0)
    assert_same_bits(buffer, expected)
    outputs = [gpu.views(on_device(np.zeros(s.size, F32)), [0], [s.shape])[0] for s in sources]
    gpu.unpack(buffer, offsets, outputs, 0.5)
    for out, source in zip(outputs, sources, strict=True):
        assert_same_bits(gpu.as_numba(out), source)


@pytest.mark.skipif(not ON_GPU, reason="no GPU here; the simulator would take minutes")
def test_full_launches_on_a_gpu():
    # The backend's own launch sizes: 70 tensors in one launch, the largest of which outruns
    # its 1024 x 256 threads, so the grid-stride loop runs too.
    from ringtrain.kernels import cuda as gpu

    rng = np.random.default_rng(10)
    shapes = [(int(k),) for k in rng.integers(0, 5000, 67)] + [(0,), (1,), (700_001,)]
    for dtype, buffer_dtype, scale in [(F32, F32, 0.5), (np.dtype(np.float16), F32, 1 / 3)]:
        sources = [random_array(dtype, shape, rng) for shape in shapes]
        assert_pack_and_unpack_agree(gpu, sources, buffer_dtype, scale)
    a, b = random_array(F32, (1_000_003,), rng), random_array(F32, (1_000_003,), rng)
    wanted = np.empty_like(a)
    cpu().reduce(wanted, a, b, ReduceOp.Sum, 0.375)
    dst = on_device(np.zeros_like(a))
    gpu.reduce(dst, on_device(a), on_device(b), ReduceOp.Sum, 0.375)
    assert_same_bits(dst, wanted)
    halves = b.astype(np.float16)
    wanted = np.zeros(a.size, np.float16)
    cpu().reduce_to_wire(wanted, a, halves, ReduceOp.Sum, 1.0)
    wire = on_device(np.zeros(a.size, np.float16))
    gpu.reduce_to_wire(wire, on_device(a), on_device(halves), ReduceOp.Sum, 1.0)
    assert_same_bits(wire, wanted)
