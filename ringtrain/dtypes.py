"""The dtypes ringtrain reduces, and the dtype each one is reduced in."""

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED = tuple(
    np.dtype(d)
    for d in (np.uint8, np.int8, np.int32, np.int64, np.float16, bfloat16, np.float32, np.float64)
)

_BY_NAME = {str(d): d for d in SUPPORTED}
_NAMES = {d: str(d) for d in SUPPORTED}

_WIDENED = {np.dtype(np.float16): np.dtype(np.float32), bfloat16: np.dtype(np.float32)}


def check_supported(dtype) -> np.dtype:
    """Return ``dtype`` as a NumPy dtype, or raise TypeError listing the supported ones."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        names = ", ".join(str(d) for d in SUPPORTED)
        raise TypeError(f"unsupported dtype {dtype}; expected one of {names}")
    return dtype


def name_of(dtype) -> str:
    """Return the name a supported dtype travels under in metas (its ``str()``)."""
    return _NAMES[dtype]


def by_name(name: str) -> np.dtype:
    """Return the supported dtype whose ``str()`` is ``name`` (as carried in metas)."""
    return _BY_NAME[name]


def reduction_dtype(dtype) -> np.dtype:
    """Return the dtype a reduction of ``dtype`` runs in: float32 for 16-bit floats."""
    dtype = np.dtype(dtype)
    return _WIDENED.get(dtype, dtype)


def is_integer(dtype) -> bool:
    """Return True for the integer dtypes, whose Average is a floor division."""
    return np.dtype(dtype).kind in "iu"
