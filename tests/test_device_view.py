"""``DeviceView``: a light view of GPU memory, known by its CUDA Array Interface alone."""

import ml_dtypes
import numpy as np
import pytest

from ringtrain import kernels
from ringtrain.kernels.device_view import DeviceView


def test_a_view_describes_its_memory_through_the_cuda_array_interface():
    owner = object()
    view = DeviceView(0x7F00_0000_1000, (3, 4), np.float32, owner)
    assert (view.shape, view.dtype, view.size, view.ndim, view.nbytes) == ((3, 4), "f4", 12, 2, 48)
    assert len(view) == 3 and view.owner is owner
    assert view.__cuda_array_interface__ == {
        "shape": (3, 4),
        "typestr": "<f4",
        "data": (0x7F00_0000_1000, False),
        "strides": None,
        "stream": None,
        "version": 3,
    }
    assert kernels.is_device_array(view) and kernels.is_c_contiguous(view)
    assert "shape=(3, 4)" in repr(view) and "0x7f0000001000" in repr(view)


def test_bfloat16_shows_as_16_bit_integers_and_keeps_its_dtype():
    view = DeviceView(64, (2,), ml_dtypes.bfloat16, None)
    assert view.__cuda_array_interface__["typestr"] == "<u2"
    assert view.dtype == ml_dtypes.bfloat16 and view.nbytes == 4


@pytest.mark.parametrize(
    ("shape", "to", "want"),
    [
        ((3, 4), (-1,), (12,)),
        ((12,), ((2, 6),), (2, 6)),
        ((12,), (4, -1), (4, 3)),
        ((0,), (-1,), (0,)),
        ((0,), (0, 5), (0, 5)),
        ((1,), ((),), ()),
        ((), (1,), (1,)),
    ],
)
def test_reshape_keeps_the_address_dtype_and_owner(shape, to, want):
    owner = object()
    view = DeviceView(128, shape, np.int32, owner).reshape(*to)
    assert view.shape == want and view.address == 128
    assert view.dtype == np.int32 and view.owner is owner


@pytest.mark.parametrize("to", [(5,), (2, -1, -1), (-2,), (0, -1)])
def test_reshape_into_a_shape_of_another_size_is_refused_naming_both(to):
    with pytest.raises(ValueError, match=r"cannot reshape a view of 12 elements into"):
        DeviceView(0, (12,), np.float32, None).reshape(*to)


def test_a_0_d_view_has_no_length():
    with pytest.raises(TypeError, match="0-d view"):
        len(DeviceView(0, (), np.float32, None))
