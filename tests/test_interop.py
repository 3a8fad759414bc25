"""Other frameworks' arrays: read without a copy, results given back as the same framework's."""

import ml_dtypes
import numpy as np
import pytest

from ringtrain import interop
from ringtrain.kernels.device_view import DeviceView

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")


def test_numpy_and_plain_inputs_go_in_as_they_are_with_no_way_back():
    for plain in (np.arange(3), np.float32(2.0), [1, 2], 3.0):
        adopted, give_back = interop.adopt(plain)
        assert adopted is plain and give_back is None


def test_a_torch_tensor_is_read_in_place_and_its_results_come_back_as_tensors():
    tensor = torch.arange(4, dtype=torch.float32, requires_grad=True)
    adopted, give_back = interop.adopt(tensor)
    assert isinstance(adopted, np.ndarray)
    assert adopted.ctypes.data == tensor.data_ptr()  # no copy
    result = np.array([1.0, 2.0], np.float32)
    back = give_back(result)
    assert isinstance(back, torch.Tensor) and back.data_ptr() == result.ctypes.data
    assert back.tolist() == [1.0, 2.0]


def test_a_jax_array_comes_back_as_a_jax_array():
    adopted, give_back = interop.adopt(jnp.arange(3.0))
    np.testing.assert_array_equal(adopted, [0.0, 1.0, 2.0])
    back = give_back(np.array([5.0, 6.0], np.float32))
    assert isinstance(back, type(jnp.zeros(1))) and back.tolist() == [5.0, 6.0]


def test_a_read_only_result_is_copied_before_a_framework_may_write_to_it():
    _, give_back = interop.adopt(torch.zeros(2))
    shared = np.array([1.0, 2.0], np.float32)
    shared.flags.writeable = False
    back = give_back(shared)
    assert back.data_ptr() != shared.ctypes.data
    back += 1  # its own memory
    assert shared.tolist() == [1.0, 2.0] and back.tolist() == [2.0, 3.0]


def test_bfloat16_goes_through_numpy_where_dlpack_cannot_carry_it():
    adopted, give_back = interop.adopt(jnp.ones(3, dtype=jnp.bfloat16))
    assert adopted.dtype == ml_dtypes.bfloat16 and adopted.tolist() == [1.0, 1.0, 1.0]
    back = give_back(np.full(2, 3.0, ml_dtypes.bfloat16))
    assert back.dtype == jnp.bfloat16 and back.tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match="cannot read a Tensor of dtype torch.bfloat16 as a Nu"):
        interop.adopt(torch.ones(2, dtype=torch.bfloat16))


def test_cuda_arrays_of_no_framework_get_numba_results_and_the_bindings_views_stay_views():
    from ringtrain.kernels import cuda as backend

    class CudaArrayLike:
        def __init__(self, strides=None):
            self.__cuda_array_interface__ = {
                "shape": (2, 3), "typestr": "<f4", "data": (4096, False), "strides": strides,
                "version": 3,
            }  # fmt: skip

    foreign = CudaArrayLike()
    adopted, give_back = interop.adopt(foreign)
    assert type(adopted) is DeviceView and adopted.owner is foreign
    assert (adopted.address, adopted.shape, adopted.dtype) == (4096, (2, 3), np.float32)
    assert give_back is backend.as_numba
    strided = CudaArrayLike(strides=(4, 8))  # a transposed layout: the API refuses it
    assert interop.adopt(strided)[0] is strided
    view = DeviceView(0, (2,), np.float32, None)
    assert interop.adopt(view) == (view, None)


def test_a_gpu_array_of_a_framework_goes_in_with_numpys_dtype_and_comes_back_as_its_kind():
    class Namespace:
        @staticmethod
        def from_dlpack(result):
            return ("made by the framework", result)

    class FrameworkGpuArray:  # as a PyTorch CUDA tensor: its dtype is no NumPy dtype
        dtype = "framework.float16"
        __cuda_array_interface__ = {
            "shape": (5,), "typestr": "<f2", "data": (8192, False), "version": 3,
        }  # fmt: skip

        def __array_namespace__(self):
            return Namespace

    tensor = FrameworkGpuArray()
    adopted, give_back = interop.adopt(tensor)
    assert type(adopted) is DeviceView and adopted.dtype == np.float16 and adopted.owner is tensor
    assert give_back(adopted) == ("made by the framework", adopted)
