"""What this ringtrain can do, under the names of Horovod's build and feature checks.

Horovod scripts branch on these (``if hvd.nccl_built(): ...``), so they answer for ringtrain:
its transport is always MPI, through mpi4py; it has no Gloo, NCCL, DDL, oneCCL or ROCm
path; its CUDA kernels run where numba finds a GPU.
"""

import functools

from ringtrain import api


def mpi_built() -> bool:
    """Return True: ringtrain always runs over MPI."""
    return True


def mpi_enabled() -> bool:
    """Return True: MPI carries every collective."""
    return True


def mpi_threads_supported() -> bool:
    """Return True once ``init()`` has run: it refuses MPI without ``MPI_THREAD_MULTIPLE``."""
    api.size()  # raises NotInitializedError before init(), as Horovod does
    return True


def gloo_built() -> bool:
    """Return False: ringtrain has no Gloo transport."""
    return False


def gloo_enabled() -> bool:
    """Return False: ringtrain has no Gloo transport."""
    return False


def nccl_built() -> bool:
    """Return False: GPU tensors go through host memory or a CUDA-aware MPI, never NCCL."""
    return False


def ddl_built() -> bool:
    """Return False: ringtrain has no IBM DDL path."""
    return False


def ccl_built() -> bool:
    """Return False: ringtrain has no oneCCL path."""
    return False


def rocm_built() -> bool:
    """Return False: ringtrain's GPU kernels are CUDA kernels."""
    return False


@functools.cache
def cuda_built() -> bool:
    """Return True where numba finds a CUDA GPU, so that ringtrain takes CUDA arrays here."""
    try:
        from numba import cuda
    except ImportError:
        return False
    return bool(cuda.is_available())


__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rocm_built",
]
