"""Horovod's Keras-level collectives: any tensor-like value in, its NumPy value out.

They wrap ``ringtrain.tensorflow``'s collectives with the signatures of Horovod's Keras API,
for code outside a training step, such as ``hvd.broadcast(resume_from_epoch, 0)``.
"""

import tensorflow as tf

from ringtrain.ops import Average
from ringtrain.tensorflow import collectives
from ringtrain.tensorflow.compression import Compression


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """Return ``value`` reduced over all ranks (default op Average), as a NumPy value."""
    return collectives.allreduce(
        tf.convert_to_tensor(value),
        op=op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
        average=average,
    ).numpy()


def allgather(value, name=None):
    """Return every rank's ``value`` concatenated along dimension 0, as a NumPy value."""
    return collectives.allgather(tf.convert_to_tensor(value), name=name).numpy()


def broadcast(value, root_rank, name=None):
    """Return ``root_rank``'s ``value`` on every rank, as a NumPy value."""
    return collectives.broadcast(tf.convert_to_tensor(value), root_rank, name=name).numpy()


def reducescatter(value, name=None, op=Average):
    """Return this rank's share (of dimension 0) of ``value`` reduced over all ranks, as NumPy."""
    return collectives.reducescatter(tf.convert_to_tensor(value), op=op, name=name).numpy()
