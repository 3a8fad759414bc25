"""Test data for the kernel tests, and bit-level comparisons of their results."""

import numpy as np

from ringtrain import dtypes


def bits(array):
    """Return the raw bit patterns of ``array``, so that comparisons see -0.0 and NaN payloads."""
    return array.view(f"u{array.dtype.itemsize}")


def assert_bits(actual, expected, nan_bits=True):
    """Assert equal bit patterns; with ``nan_bits=False`` a NaN need only meet a NaN.

    NumPy converts float16 NaNs in software (payload kept) or in hardware (quieted), by build.
    """
    if nan_bits:
        np.testing.assert_array_equal(bits(actual), bits(expected))
    else:
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(actual), nan)
        np.testing.assert_array_equal(bits(actual)[~nan], bits(expected)[~nan])


def random_array(dtype, shape, rng):
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
        bits(flat)[signaling] = bits(flat)[inf] + 1  # only arithmetic may quiet it
    return values
