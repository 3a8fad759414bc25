"""SyncBatchNormalization at any world size, against NumPy and against one process.

Each rank normalizes its own batch (4, 1, 0 and 6 rows on ranks 0-3), so the checks cover
batches of 0, 1 and uneven sizes. Outputs, moving statistics and gradients are compared
with NumPy's batch normalization over every rank's rows together; model.fit with
DistributedOptimizer is compared with one process training Keras's BatchNormalization on
the ranks' batches joined. A job of one rank exchanges nothing: the layer is Keras's there.
"""

import os
import tempfile

import numpy as np
from common import main, same_bits_everywhere
from tfsetup import (
    FEATURES,
    OUTPUTS,
    assert_weights_close,
    configure,
    dataset,
    hand_over_ops,
    shard_rows,
)

configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain  # noqa: E402
import ringtrain.tensorflow as hvd  # noqa: E402
import ringtrain.tensorflow.keras as hk  # noqa: E402

EPSILON, MOMENTUM = 1e-3, 0.99  # Keras's defaults


def rows(r):
    return (4, 1, 0, 6)[r % 4]


def batches(shape, salt, mean=1.5):
    """Return every rank's batch of inputs of ``shape`` (rows first), around ``mean``."""
    return [
        np.random.default_rng([salt, r]).normal(mean, 2.0, (rows(r), *shape)).astype(np.float32)
        for r in range(hvd.size())
    ]


def masks(shape, salt):
    """Return every rank's boolean mask for inputs of ``shape`` (rows first, no channel axis)."""
    return [
        np.random.default_rng([salt, r, 1]).random((rows(r), *shape)) < 0.6
        for r in range(hvd.size())
    ]


class Reference:
    """NumPy's training-mode batch normalization of all ranks' batches together (float64)."""

    def __init__(self, xs, axis, gamma, beta, ms=None):
        x = np.concatenate(xs).astype(np.float64)
        self.x, self.gamma, self.beta = x, gamma, beta
        self.axis = axis % x.ndim
        self.m = np.ones_like(x)
        if ms is not None:
            self.m = np.broadcast_to(np.concatenate(ms)[..., None], x.shape).astype(np.float64)
        self.axes = tuple(a for a in range(x.ndim) if a != self.axis)
        self.count = self.m.sum(self.axes)
        self.mean = (self.m * x).sum(self.axes) / self.count
        self.variance = (self.m * (x - self.line(self.mean)) ** 2).sum(self.axes) / self.count
        self.scale = np.sqrt(self.line(self.variance) + EPSILON)
        self.normalized = (x - self.line(self.mean)) / self.scale
        self.bounds = np.cumsum([0] + [len(b) for b in xs])

    def line(self, per_channel):
        """Return per-channel values shaped to broadcast along the channel axis."""
        shape = [1] * self.x.ndim
        shape[self.axis] = -1
        return np.reshape(per_channel, shape)

    def part(self, full, r):
        """Return rank ``r``'s rows of ``full``."""
        return full[self.bounds[r] : self.bounds[r + 1]]

    def output(self):
        """Return the normalized, scaled and shifted batch."""
        return self.line(self.gamma) * self.normalized + self.line(self.beta)

    def input_gradient(self, ws):
        """Return d/dx of sum(output * w) with every rank's ``ws``."""
        w = np.concatenate(ws).astype(np.float64)
        g = w * self.line(self.gamma)  # d loss / d normalized
        centred = self.x - self.line(self.mean)
        d_mean = -(g / self.scale).sum(self.axes)
        d_var = -0.5 * (g * centred / self.scale**3).sum(self.axes)
        n = self.line(self.count)
        dx = g / self.scale + self.m * (self.line(d_mean) + 2 * self.line(d_var) * centred) / n
        return dx


def close(got, want, what, tol=2e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape}, expected {np.shape(want)}"
    if not np.allclose(got, want, rtol=tol, atol=tol):
        raise AssertionError(
            f"{what}: differs from NumPy by up to {np.max(np.abs(got - want)):.3g}"
        )


def check_outputs_statistics_and_gradients():
    r = hvd.rank()
    cases = [
        ((5,), -1, False, 1.5),
        ((3, 2, 4), -1, False, 1.5),  # images, channels last
        ((4, 3), 1, False, 1.5),  # channels first
        ((3, 4), -1, True, 1.5),  # sequences with a mask over time steps
        # A mean far above the spread: sums of squares in float32 would lose the variance.
        ((5,), -1, False, 1000.0),
    ]
    for salt, (shape, axis, masked, mean) in enumerate(cases):
        tol = 2e-5 * max(1.0, mean / 10)
        for mode in ("eager", "tf.function"):
            what = f"shape {shape} axis {axis} mean {mean}{' masked' if masked else ''} {mode}"
            xs = batches(shape, salt, mean)
            ms = masks(shape[:-1], salt) if masked else None
            ws = [
                np.random.default_rng([salt, q, 2]).normal(size=x.shape) for q, x in enumerate(xs)
            ]
            channels = (None, *shape)[axis]  # shape leaves out the rows
            gamma = np.random.default_rng([salt, 3]).normal(1, 0.5, channels).astype(np.float32)
            beta = np.random.default_rng([salt, 4]).normal(0, 0.5, channels).astype(np.float32)
            layer = hvd.SyncBatchNormalization(
                axis=axis, name=f"sbn_{salt}_{mode.replace('.', '_')}"
            )
            layer.build((None, *shape))
            layer.gamma.assign(gamma)
            layer.beta.assign(beta)
            x, w = tf.constant(xs[r]), tf.constant(ws[r], tf.float32)
            mask = None if ms is None else tf.constant(ms[r])

            def step(x, w, mask, layer=layer):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=True, mask=mask)
                    loss = tf.reduce_sum(y * w)
                return (y, *tape.gradient(loss, [x, layer.gamma, layer.beta]))

            run = step if mode == "eager" else tf.function(step)
            y, dx, dgamma, dbeta = run(x, w, mask)
            want = Reference(xs, axis, gamma, beta, ms)
            close(y, want.part(want.output(), r), f"{what}: outputs", tol)
            close(dx, want.part(want.input_gradient(ws), r), f"{what}: input gradient", tol)
            # gamma and beta get this rank's part of their gradient; the parts sum up to NumPy's.
            dgamma_want = (ws[r] * want.part(want.normalized, r)).sum(want.axes)
            close(dgamma, dgamma_want, f"{what}: gamma gradient", tol)
            close(dbeta, ws[r].sum(want.axes), f"{what}: beta gradient", tol)
            close(layer.moving_mean, (1 - MOMENTUM) * want.mean, f"{what}: moving mean", tol)
            close(
                layer.moving_variance,
                MOMENTUM + (1 - MOMENTUM) * want.variance,
                f"{what}: moving variance",
                tol,
            )
            same_bits_everywhere(layer.moving_mean.numpy(), f"{what}: moving mean")
            same_bits_everywhere(layer.moving_variance.numpy(), f"{what}: moving variance")
            # Outside training: the moving statistics, this rank alone.
            inference = layer(x, training=False).numpy()
            line = want.line
            moving_mean, moving_variance = layer.moving_mean.numpy(), layer.moving_variance.numpy()
            expected = line(gamma) * (want.part(want.x, r) - line(moving_mean))
            expected = expected / np.sqrt(line(moving_variance) + EPSILON) + line(beta)
            close(inference, expected, f"{what}: inference outputs", tol)


def check_mixed_precision():
    r = hvd.rank()
    xs = batches((6,), salt=9)
    layer = hvd.SyncBatchNormalization(dtype="mixed_float16", name="sbn_mixed")
    y = layer(tf.constant(xs[r], tf.float16), training=True)
    assert y.dtype == tf.float16, y.dtype
    assert layer.moving_mean.dtype == "float32", layer.moving_mean.dtype
    half = [x.astype(np.float16) for x in xs]
    want = Reference(half, -1, np.ones(6), np.zeros(6))
    close(y, want.part(want.output(), r), "float16 outputs", tol=5e-3)
    close(layer.moving_mean, (1 - MOMENTUM) * want.mean, "float16 moving mean", tol=1e-5)


def model(batch_norm):
    """Return a model with two branches, each normalized, that TensorFlow may run in parallel."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    left = keras.layers.Activation("tanh")(batch_norm()(keras.layers.Dense(8)(inputs)))
    right = keras.layers.Activation("tanh")(batch_norm()(keras.layers.Dense(8)(inputs)))
    outputs = keras.layers.Dense(OUTPUTS)(keras.layers.Add()([left, right]))
    return keras.Model(inputs, outputs)


def check_fit_matches_one_process():
    r, n = hvd.rank(), hvd.size()
    per_rank, steps = 3, 4
    x, y = dataset(steps * n * per_rank, seed=5)
    distributed = model(hvd.SyncBatchNormalization)
    distributed.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    mine = shard_rows(steps, per_rank, r, n)
    distributed.fit(x[mine], y[mine], batch_size=per_rank, shuffle=False, verbose=0)
    alone = model(keras.layers.BatchNormalization)
    alone.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    alone.fit(x, y, batch_size=n * per_rank, shuffle=False, verbose=0)
    got = [v.numpy() for v in distributed.weights]
    assert_weights_close(got, [v.numpy() for v in alone.weights], "fit", rtol=1e-4, atol=1e-5)
    for i, value in enumerate(got):
        same_bits_everywhere(value, f"weight {i} after fit")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        distributed.save(path)
        loaded = hk.load_model(path)
    kinds = [type(layer) for layer in loaded.layers]
    assert kinds.count(hvd.SyncBatchNormalization) == 2, kinds
    assert_weights_close([v.numpy() for v in loaded.weights], got, "loaded")


def check_one_rank_exchanges_nothing():
    layer = hvd.SyncBatchNormalization(name="counted")
    found = hand_over_ops(lambda x: layer(x, training=True), tf.ones([2, 3]))
    assert (found == 0) == (hvd.size() == 1), f"{found} ops call into ringtrain"


def check_errors():
    try:
        hvd.SyncBatchNormalization(renorm=True)
    except ValueError as err:
        assert "renorm=True" in str(err), err
    else:
        raise AssertionError("renorm=True was accepted")
    assert hk.SyncBatchNormalization is hvd.SyncBatchNormalization
    if hvd.size() == 1:
        return
    r = hvd.rank()
    layer = hvd.SyncBatchNormalization(name="channels_differ")
    try:
        layer(tf.ones([2, 3 + (r == 0)]), training=True)
    except (tf.errors.OpError, ringtrain.RingtrainError) as err:
        for needle in ("SyncBatchNormalization.channels_differ", "shape differs"):
            assert needle in str(err), err
    else:
        raise AssertionError("layers of different widths were not reported")


def body():
    hvd.init()
    for check in (
        check_outputs_statistics_and_gradients,
        check_mixed_precision,
        check_fit_matches_one_process,
        check_one_rank_exchanges_nothing,
        check_errors,
    ):
        check()
        print(f"rank {hvd.rank()}: {check.__name__} OK", flush=True)
    hvd.shutdown()


main(body)
