"""ringtrain for TensorFlow 2 (import it as ``hvd``): collectives on tf.Tensors and training.

Everything works eagerly and inside ``tf.function`` (not under XLA, ``jit_compile=True``).

- ``bridge``: the two ``tf.numpy_function`` ops that hand tensors to the engine and wait.
- ``collectives``: the collectives on tf.Tensors, with gradients; ``exchange``: many at once.
- ``gradient_tape``, ``keras`` (optimizer, callbacks): training; ``local_sources``: variables
  whose gradients stay on their rank; ``compression``: Horovod's compression strategies.
- ``sync_batch_norm``, ``elastic`` (TensorFlow states), ``topology`` (the job's shape as ops).
- ``compat``: everything that depends on the TensorFlow or Keras version.
"""

import os

from ringtrain import capabilities, tf_allocator
from ringtrain.api import (
    add_process_set,
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
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ringtrain.capabilities import *  # noqa: F403 - Horovod's build checks, all of them
from ringtrain.errors import (
    CollectiveTimeoutError,
    DuplicateNameError,
    EngineStoppedError,
    MismatchError,
    NotInitializedError,
    RingtrainError,
    StallError,
)
from ringtrain.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ringtrain.process_sets import ProcessSet, global_process_set
from ringtrain.tensorflow import elastic
from ringtrain.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    broadcast_global_variables,
    broadcast_variables,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from ringtrain.tensorflow.compression import Compression
from ringtrain.tensorflow.gradient_tape import (
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from ringtrain.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from ringtrain.tensorflow.sync_batch_norm import SyncBatchNormalization
from ringtrain.tensorflow.topology import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)

tf_allocator.prefer_pooling(os.environ)  # before the first tensor: see the module

__all__ = [
    "elastic",
    "Adasum",
    "ProcessSet",
    "add_process_set",
    "global_process_set",
    "remove_process_set",
    "Average",
    "CollectiveTimeoutError",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "DuplicateNameError",
    "EngineStoppedError",
    "Max",
    "Min",
    "MismatchError",
    "NotInitializedError",
    "PartialDistributedGradientTape",
    "PartialDistributedOptimizer",
    "Product",
    "ReduceOp",
    "RingtrainError",
    "StallError",
    "Sum",
    "SyncBatchNormalization",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "cross_rank",
    "cross_size",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
__all__ += capabilities.__all__
