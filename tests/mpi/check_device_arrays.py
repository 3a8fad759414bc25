"""Device arrays (numba's CUDA simulator, or a GPU) go through the engine and come back so.

With ``RINGTRAIN_CUDA_AWARE_MPI=1`` the uncompressed allreduces go to MPI on the device
arrays themselves, and only the compressed ones are staged through the host. In the
simulator a device array's memory is host memory, so any MPI takes it: that checks the
route, not MPI's CUDA support.
"""

import collections

import ml_dtypes
import numpy as np
from common import assert_equal, expected, main, rank_data
from numba import cuda
from wire_ring import WIRES, simulate

import ringtrain
from ringtrain import api, dlpack, settings
from ringtrain.kernels.cuda import address, as_numba, device_id
from ringtrain.kernels.device_view import DeviceView
from ringtrain.transport.choice import Route
from ringtrain.transport.device_mpi import takes_device_memory


def body():
    ringtrain.init()
    r, n = ringtrain.rank(), ringtrain.size()
    transport = api._engine_for(None).transport
    direct = n > 1 and takes_device_memory(settings.read().cuda_aware_mpi)
    assert transport.capabilities.device_mpi == direct, transport.capabilities
    carried = _count_routes(transport)
    every_op = (ringtrain.Sum, ringtrain.Max, ringtrain.Min, ringtrain.Product)
    for dtype in (np.float32, np.float64, np.int32, np.float16, ml_dtypes.bfloat16):
        some = dtype in (np.float32, np.int32)  # the ops MPI maps one by one, on two dtypes
        for op in every_op if some else every_op[:2]:
            for shape in ((0,), (1,), (37, 3)):
                host = rank_data(r, shape, dtype)
                got = ringtrain.allreduce(
                    _device(host), op=op, name=f"{np.dtype(dtype)}.{op.name}.{shape}"
                )
                assert hasattr(got, "copy_to_host"), f"expected a device array, got {type(got)}"
                want = expected(op, [rank_data(i, shape, dtype) for i in range(n)], dtype)
                assert_equal(_host(got, dtype), want, f"device {np.dtype(dtype)} {op.name}")
    # A group of device arrays comes back as a list of device arrays.
    shapes = [(0,), (1,), (5, 2)]
    mine = [_device(rank_data(r, s, np.float16, k)) for k, s in enumerate(shapes)]
    got = ringtrain.grouped_allreduce(mine, op=ringtrain.Sum, name="device group")
    for k, (g, s) in enumerate(zip(got, shapes, strict=True)):
        want = expected(
            ringtrain.Sum, [rank_data(i, s, np.float16, k) for i in range(n)], np.float16
        )
        assert_equal(_host(g, np.float16), want, f"device group member {k}")
    # Into a device out=, averaged and prescaled: the result is written where the caller said.
    for shape in ((0,), (1,), (37, 3)):
        out = _device(np.zeros(shape, np.float32))
        mine = _device(rank_data(r, shape, np.float32))
        got = ringtrain.allreduce(
            mine, op=ringtrain.Average, prescale_factor=2.0, out=out, name=f"out.{shape}"
        )
        assert got is out, f"out= {shape}: got a new array"
        total = sum(rank_data(i, shape, np.float32).astype(np.float64) for i in range(n))
        np.testing.assert_allclose(_host(out, np.float32), 2.0 * total / n, rtol=1e-5, atol=1e-6)
    # Submitted together, they fuse into one device buffer; each result is its own slice,
    # and one of them goes into an out=. float16 is widened and narrowed again.
    for dtype in (np.float32, np.float16):
        shapes = [(3,), (0,), (4, 5), (1,), (7,)]
        mine = [_device(rank_data(r, s, dtype, k)) for k, s in enumerate(shapes)]
        outs = [None, None, _device(np.zeros((4, 5), dtype)), None, None]
        handles = [
            ringtrain.allreduce_async(
                x, op=ringtrain.Sum, out=o, name=f"fused.{np.dtype(dtype)}.{k}"
            )
            for k, (x, o) in enumerate(zip(mine, outs, strict=True))
        ]
        got = [ringtrain.synchronize(h) for h in handles]
        assert got[2] is outs[2], "a fused member's out= was not used"
        for k, (g, s) in enumerate(zip(got, shapes, strict=True)):
            assert tuple(g.shape) == s, f"fused member {k}: shape {g.shape}, expected {s}"
            want = expected(ringtrain.Sum, [rank_data(i, s, dtype, k) for i in range(n)], dtype)
            assert_equal(_host(g, dtype), want, f"fused device {np.dtype(dtype)} member {k}")
    # Views known by their CUDA interface alone, as the TensorFlow binding hands GPU tensors
    # over through DLPack: their results are views too, with no numba array built for
    # them, whether fused, lone, widened or not.
    for dtype in (np.float32, ml_dtypes.bfloat16):
        shapes = [(3,), (0,), (4, 5), (1,)]
        held = [_device(rank_data(r, s, dtype, k)) for k, s in enumerate(shapes)]
        views = [_viewed(a) for a in held]
        assert all(type(v) is DeviceView for v in views), [type(v) for v in views]
        handles = [
            ringtrain.allreduce_async(v, op=ringtrain.Sum, name=f"view.{np.dtype(dtype)}.{k}")
            for k, v in enumerate(views)
        ]
        got = [(ringtrain.synchronize(h), k, ringtrain.Sum) for k, h in enumerate(handles)]
        lone = ringtrain.allreduce(views[2], op=ringtrain.Max, name=f"lone.{np.dtype(dtype)}")
        for g, k, op in [*got, (lone, 2, ringtrain.Max)]:
            what = f"view {np.dtype(dtype)} {op.name} member {k}"
            assert type(g) is DeviceView and g.shape == shapes[k], f"{what}: got {g!r}"
            want = expected(op, [rank_data(i, shapes[k], dtype, k) for i in range(n)], dtype)
            assert_equal(_host(as_numba(g), dtype), want, what)
    # A GPU array of another framework (as CuPy's or PyTorch's, whose dtypes NumPy cannot
    # read) goes in as a view, fused, lone and into an out= of its kind, and its results
    # come back as its kind.
    shapes = [(0,), (1,), (37, 3)]
    mine = [
        _Framework.asarray(_device(rank_data(r, s, np.float32, k))) for k, s in enumerate(shapes)
    ]
    wants = [
        expected(ringtrain.Sum, [rank_data(i, s, np.float32, k) for i in range(n)], np.float32)
        for k, s in enumerate(shapes)
    ]
    grouped = ringtrain.grouped_allreduce(mine, op=ringtrain.Sum, name="framework group")
    lone = ringtrain.allreduce(mine[2], op=ringtrain.Sum, name="framework lone")
    out = _Framework.asarray(_device(np.zeros((37, 3), np.float32)))
    into = ringtrain.allreduce(mine[2], op=ringtrain.Sum, out=out, name="framework out")
    assert into is out, f"out= gave back a {type(into).__name__}"
    for k, got in [*enumerate(grouped), (2, lone), (2, into)]:
        assert type(got) is _FrameworkArray, f"framework member {k}: got {type(got).__name__}"
        assert_equal(_host(got.base, np.float32), wants[k], f"framework member {k}")
    # A CUDA array that is not C-contiguous, numba's or another framework's, is refused
    # before any rank sends a byte.
    column = _device(rank_data(r, (4, 3), np.float32))[:, 1]
    for k, strided in enumerate((column, _Framework.asarray(column))):
        try:
            ringtrain.allreduce(strided, name=f"column.{k}")
        except ValueError as err:
            assert "a CUDA array of shape (4,) must be C-contiguous" in str(err), err
        else:
            raise AssertionError(f"a strided {type(strided).__name__} was accepted")
    # 16 bits on the wire: staged through host memory, rounded as the simulated ring rounds.
    for name, wire in WIRES.items():
        data = [rank_data(i, (1001,), np.float32, 5) for i in range(n)]
        strategy = getattr(ringtrain.Compression, name)
        got = ringtrain.allreduce(_device(data[r]), op=ringtrain.Sum, compression=strategy)
        want = simulate(data, ringtrain.Sum, 1.0, wire)[r]
        assert np.array_equal(_host(got, np.float32).view(np.uint32), want.view(np.uint32)), name
    if direct:  # the compressed calls alone went through the host
        assert carried[Route.DEVICE] > 0 and carried[Route.STAGED] == len(WIRES), carried
    elif n > 1:
        assert Route.DEVICE not in carried and carried[Route.STAGED] > 0, carried
    ringtrain.shutdown()


def _count_routes(transport):
    """Count the calls that each of ``transport``'s routes carries, from now on."""
    counts = collections.Counter()
    for route, carrier in transport._routes.items():

        def counted(call, run=carrier.run, route=route):
            counts[route] += 1
            return run(call)

        carrier.run = counted
    return counts


def _device(host):
    """Return a device copy of ``host``, moved as unsigned integers: numba cannot copy bfloat16."""
    return cuda.to_device(_as_unsigned(host)).view(host.dtype)


class _FrameworkArray:
    """A GPU array of a framework of its own, as CuPy's or PyTorch's: its CUDA interface only.

    Its dtype is the framework's name for it, which NumPy cannot read (as ``torch.float32``).
    """

    def __init__(self, base):
        self.base = base  # a numba array: its memory
        self.dtype = f"framework.{np.dtype(base.dtype)}"
        self.shape = tuple(base.shape)
        itemsize = np.dtype(base.dtype).itemsize
        strides = tuple(base.strides)
        compact = tuple(
            itemsize * int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape))
        )
        self.__cuda_array_interface__ = {
            "shape": self.shape,
            "typestr": np.dtype(base.dtype).str,
            "data": (address_of(base), False),
            "strides": None if strides == compact else strides,
            "version": 3,
        }

    def __array_namespace__(self):
        return _Framework


class _Framework:
    """The namespace of ``_FrameworkArray``: ``asarray`` and ``from_dlpack``, without a copy."""

    @staticmethod
    def asarray(array):
        return _FrameworkArray(as_numba(array))

    @staticmethod
    def from_dlpack(array):
        assert array.__dlpack_device__() == (dlpack.CUDA, device_id()), array.__dlpack_device__()
        return _FrameworkArray(as_numba(dlpack.view(array.__dlpack__(stream=1))))


def address_of(array):
    """Return the address of numba ``array``'s first element, whatever its layout."""
    interface = getattr(array, "__cuda_array_interface__", None)
    return array.__array_interface__["data"][0] if interface is None else interface["data"][0]


def _viewed(array):
    """Return a view of device ``array`` through a DLPack capsule, as TensorFlow's is read."""
    device = (dlpack.CUDA, device_id())
    made = dlpack.capsule(address(array), array.shape, array.dtype, device, array)
    return dlpack.view(made)


def _host(array, dtype):
    return np.asarray(_as_unsigned(array).copy_to_host()).view(dtype)


def _as_unsigned(array):
    return array.view(f"u{np.dtype(array.dtype).itemsize}")


main(body)
