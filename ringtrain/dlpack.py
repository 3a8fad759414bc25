"""DLPack capsules read and made by hand, for frameworks whose tensors numba cannot exchange.

numba-cuda reads DLPack only in kernel arguments, and its device arrays offer none, while
TensorFlow offers and takes nothing else (``tf.experimental.dlpack``). So this module reads
a capsule's ``DLManagedTensor`` through ``ctypes`` (``view``: a NumPy array over host
memory, a light view over GPU memory, either way without a copy) and makes one over any
array's memory (``capsule``). A view holds the capsule it read, and a capsule made here
holds the array it shows: each memory stays alive while the other side uses it, and is
given back through the protocol's deleter (or the capsule's destructor, if no one took it).
"""

import ctypes

import ml_dtypes
import numpy as np

from ringtrain import kernels
from ringtrain.kernels.device_view import DeviceView

CPU, CUDA = 1, 2  # DLPack's kDLCPU and kDLCUDA
_NAME = b"dltensor"
_VERSIONED_NAME = b"dltensor_versioned"  # DLPack 1.0's capsule (mpi4py 4 asks for it)
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6  # DLPack's type codes


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    """DLPack 1.0's ``DLManagedTensorVersioned``, which consumers that ask for 1.0 want."""


_VersionedDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedVersioned))
_ManagedVersioned._fields_ = [
    ("version", _Version),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _VersionedDeleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", _Tensor),
]

# Prototypes of their own, not ``ctypes.pythonapi``'s shared ones, which other code may set.
_api = ctypes.pythonapi
_P = ctypes.c_void_p
_get_pointer = ctypes.PYFUNCTYPE(_P, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, _P, ctypes.c_char_p, _P)(("PyCapsule_New", _api))
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", _api))
_decref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_DecRef", _api))
# The destructor's own calls get the dying capsule's address, never a reference to it.
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, _P, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_address_pointer = ctypes.PYFUNCTYPE(_P, _P, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))


def _dtype(code: int, bits: int, lanes: int) -> np.dtype:
    """Return the NumPy dtype of a DLPack type, or raise a TypeError that names it."""
    kinds = {_INT: "i", _UINT: "u", _FLOAT: "f"}
    if lanes == 1 and code in kinds and bits in (8, 16, 32, 64):
        return np.dtype(f"{kinds[code]}{bits // 8}")
    if lanes == 1 and (code, bits) == (_BFLOAT, 16):
        return np.dtype(ml_dtypes.bfloat16)
    if lanes == 1 and (code, bits) == (_BOOL, 8):
        return np.dtype(np.bool_)
    raise TypeError(f"DLPack type (code {code}, {bits} bits, {lanes} lanes) has no NumPy dtype")


def _code(dtype: np.dtype) -> tuple[int, int]:
    """Return the DLPack type code and bits of NumPy ``dtype``."""
    if dtype == ml_dtypes.bfloat16:
        return _BFLOAT, 16
    codes = {"i": _INT, "u": _UINT, "f": _FLOAT, "b": _BOOL}
    if dtype.kind not in codes:
        raise TypeError(f"dtype {dtype} has no DLPack type")
    return codes[dtype.kind], dtype.itemsize * 8


def view(capsule):
    """Return the array DLPack ``capsule`` shows, over its memory: NumPy's, or a GPU view.

    On a GPU, a ``kernels.device_view.DeviceView`` where the tensor is compact, else a numba
    array (which the engine refuses, naming its layout).

    The capsule is left untaken: the view holds it, and once the view is gone the capsule's
    own destructor hands the memory back to its framework.
    """
    managed = _Managed.from_address(_get_pointer(capsule, _NAME))
    tensor = managed.dl_tensor
    dtype = _dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = None
    if tensor.strides:  # in elements; None: compact, row-major
        strides = tuple(tensor.strides[i] * dtype.itemsize for i in range(tensor.ndim))
    described = _Described(capsule, shape, dtype, (tensor.data or 0) + tensor.byte_offset, strides)
    kind = tensor.device.device_type
    if kind == CPU:
        return np.asarray(described).view(dtype)
    if kind == CUDA:
        if kernels.is_c_contiguous(described):  # TensorFlow's tensors always are
            return DeviceView(described.address, shape, dtype, described)
        from numba import cuda

        return cuda.as_cuda_array(described).view(dtype)
    raise ValueError(f"DLPack device type {kind} is neither the host (1) nor a CUDA GPU (2)")


class _Described:
    """One capsule's memory, as NumPy's and numba's array interfaces describe it."""

    def __init__(self, capsule, shape, dtype, address, strides):
        self._capsule = capsule  # held: the memory is the capsule's framework's
        self.address = address
        bits = f"<u{dtype.itemsize}" if dtype == ml_dtypes.bfloat16 else dtype.str
        interface = {"shape": shape, "typestr": bits, "data": (address, False), "version": 3}
        interface["strides"] = strides
        self.__array_interface__ = interface
        self.__cuda_array_interface__ = {**interface, "stream": None}


def capsule(address: int, shape, dtype, device: tuple[int, int], owner, versioned=False):
    """Return a DLPack capsule over the compact row-major array at ``address``.

    ``device``: (DLPack device type, device id). ``owner`` holds the memory, and is held
    until whoever takes the capsule calls its deleter, or until the capsule is dropped
    untaken. ``versioned``: DLPack 1.0's capsule (writable, not a copy), for a taker that
    asks for ``max_version`` 1.0 or later; else the one before, which TensorFlow takes.
    """
    dtype = np.dtype(dtype)
    code, bits = _code(dtype)
    shape = tuple(int(n) for n in shape)
    managed = _ManagedVersioned(version=_Version(1, 0)) if versioned else _Managed()
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    tensor = managed.dl_tensor
    tensor.data = address
    tensor.device = _Device(*device)
    tensor.ndim = len(shape)
    tensor.dtype = _DataType(code, bits, 1)
    tensor.shape = dims
    held = (managed, dims, owner)
    _incref(held)  # let go by _delete, called once: by the taker, or by the destructor
    managed.manager_ctx = id(held)
    if versioned:
        managed.deleter = _DELETE_VERSIONED
        return _new_capsule(ctypes.addressof(managed), _VERSIONED_NAME, _VERSIONED_DESTRUCTOR)
    managed.deleter = _DELETE
    return _new_capsule(ctypes.addressof(managed), _NAME, _DESTRUCTOR)


def _delete(managed, cast=ctypes.cast, as_object=ctypes.py_object, decref=_decref):
    """Let go of what a capsule made here held: its deleter.

    Its names are bound here: a framework may free a tensor while the interpreter exits,
    after this module's globals are gone.
    """
    decref(cast(managed.contents.manager_ctx, as_object).value)


def _destructor(name, managed_type):
    """Return the destructor of capsules named ``name``, over a ``managed_type``, as C calls it.

    It deletes a capsule made here unless a framework took it (see ``_delete``). The
    C function is kept in the returned pair: C holds only its address.
    """

    def destroy(address, is_valid=_is_valid, pointer=_address_pointer, cast=ctypes.cast):
        if is_valid(address, name):  # a taker renames it to "used_" + name
            managed = cast(pointer(address, name), ctypes.POINTER(managed_type))
            managed.contents.deleter(managed)

    function = ctypes.CFUNCTYPE(None, _P)(destroy)
    return function, ctypes.cast(function, _P).value


_DELETE = _Deleter(_delete)
_DELETE_VERSIONED = _VersionedDeleter(_delete)
_DESTROY, _DESTRUCTOR = _destructor(_NAME, _Managed)
_DESTROY_VERSIONED, _VERSIONED_DESTRUCTOR = _destructor(_VERSIONED_NAME, _ManagedVersioned)
