"""``import ringtrain.keras as hvd`` on Keras's JAX and PyTorch backends: what they offer.

The process-level API is ringtrain's own; ``DistributedOptimizer``, ``broadcast_variables``
and the callbacks are the backend-neutral ones of this package. TensorFlow's extras
(``SyncBatchNormalization``, elastic ``KerasState``, ``PartialDistributedOptimizer``,
``backward_passes_per_step``) are TensorFlow's alone for now.
"""

import keras

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
from ringtrain.compression import Compression
from ringtrain.keras import callbacks
from ringtrain.keras.optimizer import CLASSES, DistributedOptimizer, stock_optimizer_classes
from ringtrain.keras.variables import allgather, allreduce, broadcast, broadcast_variables
from ringtrain.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ringtrain.process_sets import ProcessSet, global_process_set

if keras.backend.backend() == "jax":
    from ringtrain.keras import jax_threads  # noqa: F401 - before init() pins the rank: see there

CLASSES.register(stock_optimizer_classes())
load_model = CLASSES.load_model
register = CLASSES.register


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "Product",
    "ProcessSet",
    "ReduceOp",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "register",
    "local_rank",
    "local_size",
    "rank",
    "remove_process_set",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
__all__ += capabilities.__all__
