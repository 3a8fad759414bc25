"""The job's shape as TensorFlow tensors (Horovod's ``size_op``, ``rank_op`` and kin)."""

import tensorflow as tf

from ringtrain import api


def size_op(process_set_id=0, name=None):
    """Return the number of ranks (of the process set with that id) as an int32 scalar."""
    return tf.constant(api.process_set_by_id(process_set_id).size(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """Return 1 if this rank is in the process set with that id, else 0 (int32 scalar)."""
    included = api.process_set_by_id(process_set_id).included()
    return tf.constant(int(included), tf.int32, name=name)


def rank_op(name=None):
    """Return this rank as an int32 scalar tensor."""
    return tf.constant(api.rank(), tf.int32, name=name)


def local_size_op(name=None):
    """Return the number of ranks on this host as an int32 scalar tensor."""
    return tf.constant(api.local_size(), tf.int32, name=name)


def local_rank_op(name=None):
    """Return this rank's index among its host's ranks as an int32 scalar tensor."""
    return tf.constant(api.local_rank(), tf.int32, name=name)
