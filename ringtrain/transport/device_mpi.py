"""Whether MPI takes GPU memory itself (CUDA-aware MPI): the user's word, or Open MPI's answer.

Open MPI answers at run time through ``MPIX_Query_cuda_support`` (its ``mpi-ext.h``), which
says whether the library it runs was built with CUDA and found it working. mpi4py offers
no call for it, so it is looked up in the MPI library that mpi4py loaded; an MPI without
the function (MPICH, MVAPICH, an Open MPI older than 2.0) counts as not CUDA-aware, and its
users say so themselves with ``RINGTRAIN_CUDA_AWARE_MPI=1``. pip's Open MPI answers no.
"""

import ctypes

from mpi4py import MPI

_QUERY = "MPIX_Query_cuda_support"


def takes_device_memory(setting: bool | None) -> bool:
    """Return whether this rank's MPI reads and writes GPU memory: ``setting``, or the library's.

    ``setting`` is ``cuda_aware_mpi``: True or False as the user gave it, None to ask.
    """
    if setting is not None:
        return setting
    return library_answer()


def library_answer() -> bool:
    """Return what the MPI library says of its CUDA support at run time (False: no such call)."""
    # Looked up through mpi4py's own module, whose library dependencies include MPI's: the
    # symbol is found there however the MPI library was loaded.
    query = getattr(ctypes.CDLL(MPI.__file__), _QUERY, None)
    if query is None:
        return False
    query.restype = ctypes.c_int
    query.argtypes = []
    return bool(query())
