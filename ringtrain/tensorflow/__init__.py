"""ringtrain for TensorFlow 2 (import it as ``hvd``): collectives on tf.Tensors and training.

Everything works eagerly and inside ``tf.function`` (not under XLA, ``jit_compile=True``).
"""

from ringtrain.api import (
    allgather_object,
    barrier,
    broadcast_object,
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from ringtrain.capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from ringtrain.errors import (
    DuplicateNameError,
    EngineStoppedError,
    MismatchError,
    NotInitializedError,
    RingtrainError,
    StallError,
)
from ringtrain.ops import Average, Max, Min, Product, ReduceOp, Sum
from ringtrain.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_variables,
    grouped_allreduce,
    join,
    reducescatter,
)
from ringtrain.tensorflow.compression import Compression
from ringtrain.tensorflow.gradient_tape import DistributedGradientTape
from ringtrain.tensorflow.keras.optimizer import DistributedOptimizer

__all__ = [
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "DuplicateNameError",
    "EngineStoppedError",
    "Max",
    "Min",
    "MismatchError",
    "NotInitializedError",
    "Product",
    "ReduceOp",
    "RingtrainError",
    "StallError",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "rocm_built",
    "shutdown",
    "size",
]
