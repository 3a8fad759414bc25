"""DLPack capsules read and made by ``ringtrain.dlpack``, against NumPy's and TensorFlow's own."""

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

from ringtrain import dlpack
from ringtrain.kernels.device_view import DeviceView

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8, np.bool_]


class _Owner:
    """Something a capsule holds, whose release a weak reference shows."""

    def __init__(self, array):
        self.array = array


class _Offered:
    """An object that offers one capsule, as NumPy's ``from_dlpack`` asks."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (dlpack.CPU, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5), ()])
def test_a_view_shows_numpys_capsule_over_the_same_memory(dtype, shape):
    array = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
    seen = dlpack.view(array.__dlpack__())
    assert seen.dtype == array.dtype and seen.shape == shape
    assert np.array_equal(seen, array)
    if array.size:
        assert seen.ctypes.data == array.ctypes.data  # no copy
        seen[...] = 1
        assert np.all(array == 1)


def test_a_view_keeps_the_strides_of_a_capsule_that_has_them():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[1:, ::2]
    seen = dlpack.view(array.__dlpack__())
    assert np.array_equal(seen, array) and seen.strides == array.strides


def test_a_view_of_another_device_is_refused_naming_it():
    array = np.zeros(3, np.float32)
    made = dlpack.capsule(array.ctypes.data, array.shape, array.dtype, (3, 0), array)
    with pytest.raises(ValueError, match="DLPack device type 3 is neither the host"):
        dlpack.view(made)


# versioned: DLPack 1.0's capsule, for takers that ask for it (mpi4py 4 refuses the older).
@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype", [*DTYPES, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(0,), (1,), (2, 3), ()])
def test_numpy_takes_a_capsule_made_here_and_the_owner_lives_while_it_is_used(
    dtype, shape, versioned
):
    bfloat16 = dtype == ml_dtypes.bfloat16
    if bfloat16 and versioned:
        pytest.skip("NumPy's DLPack has no bfloat16, and dlpack.view reads the older capsule")
    array = (np.arange(int(np.prod(shape))) % 5).astype(dtype).reshape(shape)
    owner = _Owner(array)
    alive = weakref.ref(owner)
    made = dlpack.capsule(
        array.ctypes.data, array.shape, array.dtype, (dlpack.CPU, 0), owner, versioned
    )
    del owner
    assert ("dltensor_versioned" in repr(made)) == versioned
    if bfloat16:  # NumPy's DLPack has no bfloat16: read it here instead
        taken = dlpack.view(made)
    else:
        taken = np.from_dlpack(_Offered(made))
    del made
    gc.collect()
    assert alive() is not None
    if versioned:  # its flags say writable; NumPy reads the older capsule as read-only
        assert taken.flags.writeable
    assert taken.dtype == array.dtype and np.array_equal(taken, array)
    if array.size:
        assert taken.ctypes.data == array.ctypes.data  # no copy
    del taken
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("versioned", [False, True])
def test_a_capsule_that_no_one_takes_lets_its_owner_go_when_dropped(versioned):
    array = np.ones(4, np.float32)
    owner = _Owner(array)
    alive = weakref.ref(owner)
    made = dlpack.capsule(
        array.ctypes.data, array.shape, array.dtype, (dlpack.CPU, 0), owner, versioned
    )
    del owner
    gc.collect()
    assert alive() is not None
    del made
    gc.collect()
    assert alive() is None


def test_a_dtype_without_a_dlpack_type_is_refused_naming_it():
    array = np.zeros(2, np.complex64)
    with pytest.raises(TypeError, match="dtype complex64 has no DLPack type"):
        dlpack.capsule(array.ctypes.data, array.shape, array.dtype, (dlpack.CPU, 0), array)


def test_tensorflow_tensors_and_capsules_both_ways():
    tf = pytest.importorskip("tensorflow")
    for dtype in (np.float32, np.int64, ml_dtypes.bfloat16, np.bool_):
        array = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
        tensor = tf.constant(array, dtype=tf.as_dtype(array.dtype))
        seen = dlpack.view(tensor.__dlpack__())
        assert seen.dtype == array.dtype and np.array_equal(seen, array), dtype
        owner = _Owner(array)
        alive = weakref.ref(owner)
        made = dlpack.capsule(array.ctypes.data, array.shape, array.dtype, (dlpack.CPU, 0), owner)
        del owner
        taken = tf.experimental.dlpack.from_dlpack(made)
        del made
        gc.collect()
        assert taken.dtype == tensor.dtype and np.array_equal(taken.numpy(), array), dtype
        assert alive() is not None
        del taken
        gc.collect()
        assert alive() is None, dtype


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int64])
@pytest.mark.parametrize("shape", [(0,), (1,), (2, 3), ()])
def test_a_compact_gpu_capsule_is_viewed_without_a_numba_array_and_holds_its_capsule(dtype, shape):
    owner = _Owner(None)
    alive = weakref.ref(owner)
    made = dlpack.capsule(0x7F00_0000_0040, shape, dtype, (dlpack.CUDA, 0), owner)
    del owner
    seen = dlpack.view(made)
    del made
    gc.collect()
    assert type(seen) is DeviceView and alive() is not None
    assert (seen.address, seen.shape, seen.dtype) == (0x7F00_0000_0040, shape, np.dtype(dtype))
    del seen
    gc.collect()
    assert alive() is None
