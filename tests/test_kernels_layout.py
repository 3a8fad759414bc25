"""``kernels.is_c_contiguous`` reads NumPy flags, and CUDA arrays' strides from their interface."""

import numpy as np
import pytest

from ringtrain.kernels import is_c_contiguous


class CudaArrayLike:
    """An object with only ``__cuda_array_interface__``, as CuPy or PyTorch arrays have."""

    def __init__(self, shape, strides, typestr="<f4"):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": strides,
            "typestr": typestr,
            "data": (0, False),
            "version": 3,
        }


@pytest.mark.parametrize(
    ("shape", "strides", "contiguous"),
    [
        ((3, 2), None, True),  # the interface's way of saying C-contiguous
        ((3, 2), (8, 4), True),
        ((3, 2), (4, 12), False),  # Fortran order
        ((3,), (8,), False),  # every other element
        ((3, 1), (4, 99), True),  # an extent of 1 may have any stride
        ((0,), (4,), True),
        ((2, 0, 3), (0, 0, 4), True),
        ((2, 0), (99, 4), True),  # empty: any strides
    ],
)
def test_cuda_arrays_by_their_interface(shape, strides, contiguous):
    assert is_c_contiguous(CudaArrayLike(shape, strides)) is contiguous


def test_cuda_array_strides_count_bytes_of_the_dtype():
    assert is_c_contiguous(CudaArrayLike((2, 2), (4, 2), "<u2"))
    assert not is_c_contiguous(CudaArrayLike((2, 2), (4, 2), "<f4"))


def test_numpy_arrays_by_their_flags():
    grid = np.zeros((3, 2), np.float32)
    assert is_c_contiguous(grid)
    assert not is_c_contiguous(grid[:, 1])
    assert not is_c_contiguous(grid.T)
