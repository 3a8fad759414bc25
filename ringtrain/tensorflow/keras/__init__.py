"""ringtrain for Keras 3 (import it as ``hvd``): the optimizer, callbacks, loading, values."""

from ringtrain import capabilities
from ringtrain.api import (
    add_process_set,
    allgather_object,
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
from ringtrain.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ringtrain.process_sets import ProcessSet, global_process_set
from ringtrain.tensorflow.collectives import broadcast_global_variables, broadcast_variables
from ringtrain.tensorflow.compression import Compression
from ringtrain.tensorflow.keras import callbacks, elastic
from ringtrain.tensorflow.keras.optimizer import (
    DistributedOptimizer,
    PartialDistributedOptimizer,
    load_model,
    register,
)
from ringtrain.tensorflow.keras.values import allgather, allreduce, broadcast, reducescatter
from ringtrain.tensorflow.sync_batch_norm import SyncBatchNormalization

__all__ = [
    "Adasum",
    "ProcessSet",
    "add_process_set",
    "global_process_set",
    "remove_process_set",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "PartialDistributedOptimizer",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNormalization",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "elastic",
    "cross_rank",
    "cross_size",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "rank",
    "reducescatter",
    "register",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
__all__ += capabilities.__all__
