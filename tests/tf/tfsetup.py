"""Helpers for the TensorFlow scripts run under mpirun: threads, models, data, comparisons."""

import argparse

import numpy as np
import tensorflow as tf

FEATURES, OUTPUTS = 12, 3


def configure(argv=None):
    """Parse ``--inter-op N`` (0: TensorFlow's default) and set one intra-op thread."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--inter-op", type=int, default=0)
    parser.add_argument("--dir", default=None)
    args, _ = parser.parse_known_args(argv)
    tf.get_logger().setLevel("ERROR")  # retracing notes from the many small tf.functions
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    return args


def hand_over_ops(step, *args):
    """Return how many ops of ``step``'s graph, its branches' included, call into ringtrain."""
    graph = tf.function(step).get_concrete_function(*args).graph.as_graph_def()
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    return sum(node.op in ("PyFunc", "EagerPyFunc") for node in nodes)


def mlp(seed, width=16):
    """Return a small MLP whose initial weights depend only on ``seed``."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(width, activation="tanh"),
            keras.layers.Dense(width, activation="tanh"),
            keras.layers.Dense(OUTPUTS),
        ]
    )


def dataset(rows, seed=0):
    """Return (x, y) float32 regression data, the same on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, OUTPUTS)).astype(np.float32)
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(rows, OUTPUTS)).astype(np.float32)
    return x, y


def shard_rows(steps, per_rank, rank, size, passes=1):
    """Return the rows ``rank`` trains on, in order: its share of each global batch.

    Global step j is rows [j * B, (j + 1) * B) with B = size * per_rank * passes.
    """
    global_batch = size * per_rank * passes
    starts = [
        j * global_batch + (p * size + rank) * per_rank for j in range(steps) for p in range(passes)
    ]
    return np.concatenate([np.arange(s, s + per_rank) for s in starts])


def assert_weights_close(got, want, what, rtol=1e-5, atol=1e-6):
    """Fail unless the weight lists match within float32 tolerance."""
    assert len(got) == len(want), f"{what}: {len(got)} weights, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not np.allclose(g, w, rtol=rtol, atol=atol):
            worst = np.max(np.abs(g - w))
            raise AssertionError(f"{what}: weight {i} differs by up to {worst:.3g}")


def flat(weights):
    """Return the weights as one float64 vector (to compare across ranks)."""
    return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


def sum_loss(model, x, y):
    """Return the summed squared error of ``model`` on (x, y); no rows give zero."""
    return tf.reduce_sum(tf.square(model(x) - y))


def own_gradients(model, x, y, loss=sum_loss):
    """Return TensorFlow's gradients of ``loss`` on these rows alone, as float64 arrays."""
    with tf.GradientTape() as tape:
        value = loss(model, x, y)
    grads = tape.gradient(value, model.trainable_variables)
    return [np.asarray(tf.convert_to_tensor(g), np.float64) for g in grads]
