"""ringtrain's errors as TensorFlow's error classes too, as Horovod's TensorFlow ops raise them.

Each class here is both: ``except ringtrain.MismatchError`` and ``except
tf.errors.FailedPreconditionError`` catch the same error. Eagerly, TensorFlow passes an
error raised inside a ``tf.numpy_function`` on as it is; inside ``tf.function`` it makes its
own from the error's class (a ValueError becomes ``tf.errors.InvalidArgumentError``, a
RuntimeError ``tf.errors.UnknownError``), keeping the message.
"""

import tensorflow as tf

from ringtrain import errors
from ringtrain.exchange import described


def _message(args):
    # A message; or TensorFlow's (node_def, op, message, ...), with which Keras remakes an
    # error to add to its message.
    return args[0] if len(args) == 1 else args[2]


class MismatchError(errors.MismatchError, tf.errors.FailedPreconditionError):
    """Ranks submitted one collective with different shapes, dtypes or settings."""

    def __init__(self, *args):
        message = _message(args)
        errors.MismatchError.__init__(self, message)
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class InvalidArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """An argument that no rank could run a collective with, such as bad alltoall splits."""

    def __init__(self, *args):
        message = _message(args)
        ValueError.__init__(self, message)
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def in_tensorflow_terms(err, describe=None):
    """Return ``err`` (a ringtrain error), ``describe`` in front, as the binding raises it."""
    if isinstance(err, errors.MismatchError):
        return MismatchError(str(err) if describe is None else f"{describe}: {err}")
    return described(err, describe)
