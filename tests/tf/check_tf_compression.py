"""Compression.fp16 and .bf16 in the TF binding: 16-bit values on the wire, within the bound.

Run as ``check_tf_compression.py`` under mpirun. Each rank's gradients come from its own
rows; the float64 average of every rank's local gradients (gathered over plain MPI) is the
reference, and ``wire_ring.error_bound`` the allowed error.
"""

import numpy as np
from common import main, rank_data, same_bits_everywhere
from mpi4py import MPI
from tfsetup import configure, dataset, mlp
from wire_ring import WIRES, error_bound, simulate

configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain.tensorflow as hvd  # noqa: E402
import ringtrain.tensorflow.keras as hk  # noqa: E402

ROWS = 16


class UsersOwnFP16:
    """A Horovod-style strategy of a user's own: it casts, and the engine sees float16."""

    @staticmethod
    def compress(tensor):
        """Return ``tensor`` as float16 and its dtype."""
        return tf.cast(tensor, tf.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Return ``tensor`` cast back."""
        return tf.cast(tensor, ctx)


def local_gradients(model, seed):
    """Return this rank's loss tape inputs: (x, y) of its own rows, and its local gradients."""
    r = hvd.rank()
    x, y = dataset(ROWS * hvd.size(), seed)
    x, y = x[r * ROWS : (r + 1) * ROWS], y[r * ROWS : (r + 1) * ROWS]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    return (x, y), [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def check_within_bound(got, per_rank, name, what):
    """Fail unless each of ``got`` is within the bound of the average of ``per_rank``'s."""
    n = hvd.size()
    for i, g in enumerate(got):
        ranks = [grads[i].reshape(-1) for grads in per_rank]
        exact = np.sum([a.astype(np.float64) for a in ranks], axis=0) / n
        error = np.abs(np.asarray(g, np.float64).reshape(-1) - exact)
        bound = error_bound(ranks, name, 1.0 / n)
        assert np.all(error <= bound), f"{what} {i}: error {error.max():.3g} > bound"
        same_bits_everywhere(np.asarray(g), f"{what} {i}")


def check_allreduce_is_the_simulated_ring():
    r, n = hvd.rank(), hvd.size()
    data = [np.random.default_rng([i, 5]).uniform(-2, 2, 1001).astype(np.float32) for i in range(n)]
    for name, wire in WIRES.items():
        strategy = getattr(hvd.Compression, name)
        got = hvd.allreduce(tf.constant(data[r]), op=hvd.Sum, compression=strategy).numpy()
        want = simulate(data, hvd.Sum, 1.0, wire)[r]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{name} allreduce"


def check_tape():
    model = mlp(3)
    (x, y), mine = local_gradients(model, 7)
    per_rank = MPI.COMM_WORLD.allgather(mine)
    plain = None
    for name in ("none", "fp16", "bf16"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        tape = hvd.DistributedGradientTape(tape, compression=getattr(hvd.Compression, name))
        got = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
        if name == "none":
            plain = got
            continue
        check_within_bound(got, per_rank, name, f"tape {name}")
        assert any(not np.array_equal(a, b) for a, b in zip(got, plain, strict=True)), (
            f"tape {name}: the gradients are the float32 ones; nothing was rounded"
        )
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    tape = hvd.DistributedGradientTape(tape, compression=UsersOwnFP16)
    got = tape.gradient(loss, model.trainable_variables)
    assert all(g.dtype == tf.float32 for g in got)
    check_within_bound([g.numpy() for g in got], per_rank, "fp16", "a user's own strategy")


def check_optimizer():
    model = mlp(4)
    _, mine = local_gradients(model, 8)
    per_rank = MPI.COMM_WORLD.allgather(mine)
    for name in ("fp16", "bf16"):
        optimizer = hk.DistributedOptimizer(
            keras.optimizers.SGD(1.0), compression=getattr(hk.Compression, name)
        )
        again = type(optimizer).from_config(optimizer.get_config())
        assert again._rt_reduction.compression is getattr(hk.Compression, name), "from_config"
        # From zero, one SGD step of rate 1 leaves minus the reduced gradient, exactly.
        variables = [tf.Variable(tf.zeros_like(g)) for g in mine]
        optimizer.apply_gradients(zip([tf.constant(g) for g in mine], variables, strict=True))
        check_within_bound([-v.numpy() for v in variables], per_rank, name, f"optimizer {name}")


def check_compressors_cast_as_horovod():
    """Check that fp16 and bf16, called directly, cast floats to 16 bits and back as Horovod."""
    r = hvd.rank()
    for name, wire in (("fp16", tf.float16), ("bf16", tf.bfloat16)):
        strategy = getattr(hvd.Compression, name)
        for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.uint8, tf.bool):
            tensor = tf.cast(tf.constant(rank_data(r, (3, 5), np.int32, salt=40)), dtype)
            compressed, ctx = strategy.compress(tensor)
            assert compressed.dtype == (wire if dtype.is_floating else dtype), (name, dtype)
            back = strategy.decompress(compressed, ctx)
            assert back.dtype == dtype, (name, dtype, back.dtype)
            # Small integers survive 16 bits exactly.
            assert np.array_equal(back.numpy(), tensor.numpy()), (name, dtype)


def body():
    hvd.init()
    check_compressors_cast_as_horovod()
    check_allreduce_is_the_simulated_ring()
    check_tape()
    check_optimizer()
    hvd.shutdown()


main(body)
