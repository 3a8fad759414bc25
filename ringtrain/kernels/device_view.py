"""A light view of GPU memory: a compact array known by its address, shape and dtype alone.

A numba device array costs tens of microseconds of Python to build (25-45 µs a result on
the H200 of docs/benchmarks.md, "On a GPU"), so a fused response's 200 results as numba
arrays cost milliseconds. A ``DeviceView`` is one small object: an address, a shape, a dtype
and the object that owns the memory, offered as ``__cuda_array_interface__`` (which numba
and the CUDA backend's kernels read) and through DLPack (which mpi4py 4 prefers, and CuPy,
PyTorch, JAX and TensorFlow take). Results of device allreduces are views; a caller that
handed in numba arrays gets numba arrays back when it takes them (``kernels.cuda.as_numba``).
"""

import math

import ml_dtypes
import numpy as np

from ringtrain import kernels


class DeviceView:
    """``shape`` elements of ``dtype``, compact and row-major, at device ``address``.

    ``owner`` holds the memory: the view keeps it alive.
    """

    __slots__ = ("address", "shape", "dtype", "size", "owner")

    def __init__(self, address: int, shape, dtype, owner):
        self.address = int(address)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.size = math.prod(self.shape)
        self.owner = owner

    def __len__(self) -> int:
        """Return the length of the first dimension, as an array's ``len`` does."""
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    @property
    def ndim(self) -> int:
        """Return the number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Return the bytes the view spans."""
        return self.size * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        """Return the view as version 3 of the CUDA Array Interface describes it.

        bfloat16, which the interface has no type string for, shows as 16-bit unsigned
        integers, as numba reads it; the view's own ``dtype`` says what they hold.
        """
        bits = "<u2" if self.dtype == ml_dtypes.bfloat16 else self.dtype.str
        return {
            "shape": self.shape,
            "typestr": bits,
            "data": (self.address, False),
            "strides": None,
            "stream": None,
            "version": 3,
        }

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Return a DLPack capsule over the view's memory, which holds the view.

        DLPack 1.0's where the taker asks for ``max_version`` 1.0 or later (as mpi4py 4
        does, and then refuses the older capsule), else the one before. The taker may read
        on any ``stream``: the engine hands out a result only once the kernels that write
        it have finished (``Executor``). ``copy=True`` and another ``dl_device`` are
        refused, as the protocol allows.
        """
        from ringtrain import dlpack  # here: dlpack imports this module

        device = self.__dlpack_device__()
        if copy or (dl_device is not None and tuple(dl_device) != device):
            raise BufferError(f"a DeviceView exports its own memory on {device} only, uncopied")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return dlpack.capsule(self.address, self.shape, self.dtype, device, self, versioned)

    def __dlpack_device__(self) -> tuple[int, int]:
        """Return (DLPack's CUDA device type, the current GPU's id): where the memory is."""
        from ringtrain import dlpack
        from ringtrain.kernels import cuda as backend

        return dlpack.CUDA, backend.device_id()

    def reshape(self, *shape) -> "DeviceView":
        """Return a view of the same elements in ``shape``, which may hold one -1."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(n) for n in shape)
        known = math.prod(n for n in shape if n != -1)
        if shape.count(-1) == 1 and known:
            shape = tuple(self.size // known if n == -1 else n for n in shape)
        if math.prod(shape) != self.size or any(n < 0 for n in shape):
            raise ValueError(f"cannot reshape a view of {self.size} elements into {shape}")
        return DeviceView(self.address, shape, self.dtype, self.owner)

    def __repr__(self) -> str:
        return f"DeviceView(shape={self.shape}, dtype={self.dtype}, address={self.address:#x})"


def of(array):
    """Return a view of CUDA ``array`` (CuPy's, PyTorch's...) read from its interface.

    The view carries NumPy's dtype, whatever ``array``'s framework calls it. An array that
    is not C-contiguous is returned as it is, for the caller to refuse naming its layout.
    """
    if not kernels.is_c_contiguous(array):
        return array
    interface = array.__cuda_array_interface__
    return DeviceView(interface["data"][0], interface["shape"], interface["typestr"], array)
