"""Unnamed TensorFlow collectives that drift apart fail on every rank, naming the call sites.

Eagerly a call site is the file and line; inside ``tf.function`` it is the function.
Run with ``RINGTRAIN_UNNAMED_DRIFT_SECONDS`` low (the pytest wrapper sets 1).
"""

from pathlib import Path

import numpy as np
from common import assert_equal, main
from tfsetup import configure

configure()

import tensorflow as tf  # noqa: E402

import ringtrain  # noqa: E402
import ringtrain.tensorflow as hvd  # noqa: E402

_SOURCE = Path(__file__).read_text().splitlines()
_FILE = Path(__file__).name


def line_of(marker):
    """Return the line number of the one line of this file that ends with ``marker``."""
    (line,) = [i + 1 for i, text in enumerate(_SOURCE) if text.endswith(f"# {marker}")]
    return line


def caught(call):
    """Return the error that ``call()`` raises, or None."""
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the checks below say which it must be
        return err
    return None


def check_eager(r, n):
    """Rank 0 runs 3 steps of an unnamed allreduce, the others 1, then all go on."""
    errors = []
    for step in range(3 if r == 0 else 1):
        err = caught(lambda s=step: hvd.allreduce(tf.fill([2], float(r + s)), op=hvd.Sum))  # loop
        if err is not None:
            errors.append(err)
            break
    err = caught(lambda: hvd.allgather(tf.ones([1 + r, 2])))  # next
    if err is not None:
        errors.append(err)
    assert len(errors) == (2 if r == 0 else 1), f"rank {r}: {errors}"
    drift = errors[0]
    assert isinstance(drift, tf.errors.FailedPreconditionError), type(drift).__mro__
    assert isinstance(drift, ringtrain.MismatchError), type(drift).__mro__
    text = str(drift)
    assert f"rank 0 at allreduce #1 at {_FILE}:{line_of('loop')}" in text, text
    for other in range(1, n):
        assert f"rank {other} at allgather #0 at {_FILE}:{line_of('next')}" in text, text
    # Named calls work after it, and unnamed ones from new lines pair again.
    got = hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, name="eager.after")
    assert_equal(got.numpy(), np.array([n * (n - 1) / 2], np.float32), "named after drift")
    got = hvd.broadcast(tf.fill([3], float(r)), 0)
    assert_equal(got.numpy(), np.zeros(3, np.float32), "unnamed after drift")


@tf.function
def train_step(x):
    return hvd.allreduce(x, op=hvd.Sum)


@tf.function
def evaluate(x):
    return hvd.allreduce(x * 2, op=hvd.Sum)


def check_function(r, n):
    """Rank 0 runs ``train_step`` twice, the others once and then ``evaluate``."""
    x = tf.fill([4], float(r + 1))
    got = train_step(x)
    assert_equal(got.numpy(), np.full(4, n * (n + 1) / 2, np.float32), "train_step")
    second = train_step if r == 0 else evaluate
    err = caught(lambda: second(x))
    # TensorFlow rebuilds an op's error inside tf.function: the message names both sites.
    assert isinstance(err, tf.errors.OpError), f"rank {r}: {err!r}"
    text = str(err)
    assert "rank 0 at allreduce #0 at train_step (tf.function)" in text, text
    for other in range(1, n):
        assert f"rank {other} at allreduce #0 at evaluate (tf.function)" in text, text
    got = tf.function(lambda v: hvd.allreduce(v, op=hvd.Max, name="function.after"))(x)
    assert_equal(got.numpy(), np.full(4, n, np.float32), "named tf.function after drift")


def body():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    check_eager(r, n)
    check_function(r, n)
    hvd.shutdown()


main(body)
