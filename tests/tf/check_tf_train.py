"""Training under mpirun: data-parallel equivalence, broadcast, optimizers, callbacks, saving.

Run as ``check_tf_train.py --inter-op N --dir SHARED_TMP``.
"""

import os
import time
import warnings

import numpy as np
from common import main, same_bits_everywhere
from tfsetup import assert_weights_close, configure, dataset, flat, mlp, shard_rows

ARGS = configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain.tensorflow.keras as hvd  # noqa: E402
from ringtrain.tensorflow import DistributedGradientTape, RingtrainError  # noqa: E402

STEPS, PER_RANK = 6, 8


def fit_both(make_optimizer, seed=1, passes=1, epochs=1, compile_args=None, **wrap):
    """Train at np=size on shards and alone on whole batches; return both models."""
    r, n = hvd.rank(), hvd.size()
    x, y = dataset(STEPS * n * PER_RANK * passes)
    rows = shard_rows(STEPS, PER_RANK, r, n, passes)
    model = mlp(seed)
    optimizer = hvd.DistributedOptimizer(make_optimizer(), backward_passes_per_step=passes, **wrap)
    model.compile(optimizer=optimizer, loss="mse", **(compile_args or {}))
    model.fit(x[rows], y[rows], batch_size=PER_RANK, epochs=epochs, shuffle=False, verbose=0)
    alone = mlp(seed)
    alone.compile(optimizer=make_optimizer(), loss="mse")
    alone.fit(x, y, batch_size=n * PER_RANK * passes, epochs=epochs, shuffle=False, verbose=0)
    return model, alone


class SlicingSGD(keras.optimizers.SGD):
    """SGD that applies each gradient through 16-element slices (64-byte aligned in float32)."""

    def update_step(self, gradient, variable, learning_rate):
        """Subtract the learning rate times each slice of ``gradient``."""
        rate = tf.cast(learning_rate, gradient.dtype)
        every = tf.reshape(gradient, [-1])
        size = every.shape[0]
        steps = [tf.slice(every, [i], [min(16, size - i)]) * rate for i in range(0, size, 16)]
        variable.assign_sub(tf.reshape(tf.concat(steps, 0), variable.shape))


def check_equivalence():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5)
    cases = {
        "SGD+momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "Adam": lambda: keras.optimizers.Adam(0.01),
        "AdamW": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
        "RMSprop": lambda: keras.optimizers.RMSprop(0.005),
        "SGD+schedule": lambda: keras.optimizers.SGD(schedule, momentum=0.5),
        # An op after an aligned slice may write into its input's memory: an optimizer of
        # the user's own must not get the results that the host's ranks share.
        "an optimizer that slices its gradients": lambda: SlicingSGD(0.1),
    }
    for what, make in cases.items():
        model, alone = fit_both(make, epochs=2 if what == "SGD+schedule" else 1)
        assert_weights_close(model.get_weights(), alone.get_weights(), what)
        same_bits_everywhere(flat(model.get_weights()), what)
        start = mlp(1).get_weights()
        assert not np.allclose(flat(start), flat(alone.get_weights())), f"{what}: did not train"
    # Horovod's local aggregation: the mean of the passes with average_aggregated_gradients,
    # as one pass over all their rows does; by default their sum, which for plain SGD is
    # that one pass at twice the learning rate.
    model, alone = fit_both(
        lambda: keras.optimizers.Adam(0.01), passes=2, average_aggregated_gradients=True
    )
    assert_weights_close(model.get_weights(), alone.get_weights(), "backward_passes_per_step=2")
    assert int(model.optimizer.iterations) == int(alone.optimizer.iterations) == STEPS
    rates = iter([0.05, 0.1])  # fit_both makes the distributed optimizer first
    model, alone = fit_both(lambda: keras.optimizers.SGD(next(rates)), passes=2)
    assert_weights_close(model.get_weights(), alone.get_weights(), "summed passes")
    # Several steps per train function call (the exchange runs in a while loop), and eagerly.
    for compile_args in ({"steps_per_execution": 3}, {"run_eagerly": True}):
        model, alone = fit_both(lambda: keras.optimizers.SGD(0.1), compile_args=compile_args)
        assert_weights_close(model.get_weights(), alone.get_weights(), str(compile_args))
    model, alone = fit_both(
        lambda: keras.optimizers.SGD(0.1),
        gradient_predivide_factor=2.0,
        compression=hvd.Compression.fp16,
    )
    assert_weights_close(model.get_weights(), alone.get_weights(), "fp16+predivide", 2e-3, 2e-3)
    same_bits_everywhere(flat(model.get_weights()), "fp16+predivide")


def check_tape_equivalence():
    r, n = hvd.rank(), hvd.size()
    x, y = dataset(STEPS * n * PER_RANK)
    rows = shard_rows(STEPS, PER_RANK, r, n)
    results = []
    for distributed in (True, False):
        model = mlp(2)
        optimizer = keras.optimizers.Adam(0.01)

        @tf.function
        def step(xb, yb, model=model, optimizer=optimizer, distributed=distributed):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            if distributed:
                tape = DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        batch = PER_RANK if distributed else n * PER_RANK
        xs, ys = (x[rows], y[rows]) if distributed else (x, y)
        for j in range(STEPS):
            step(xs[j * batch : (j + 1) * batch], ys[j * batch : (j + 1) * batch])
        results.append(model.get_weights())
    assert_weights_close(results[0], results[1], "DistributedGradientTape")
    same_bits_everywhere(flat(results[0]), "DistributedGradientTape")


def check_broadcast_from_different_inits():
    r, n = hvd.rank(), hvd.size()
    x, y = dataset(STEPS * n * PER_RANK)
    rows = shard_rows(STEPS, PER_RANK, r, n)
    model = mlp(10 + r)
    starts = hvd.allgather_object(flat(model.get_weights()))
    assert n == 1 or not np.allclose(starts[0], starts[1]), "ranks should start differently"
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(x[rows], y[rows], batch_size=PER_RANK, shuffle=False, verbose=0, callbacks=[callback])
    same_bits_everywhere(flat(model.get_weights()), "after BroadcastGlobalVariablesCallback")
    alone = mlp(10)
    alone.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    alone.fit(x, y, batch_size=n * PER_RANK, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), alone.get_weights(), "broadcast then train")


def check_loss_scaling():
    r, n = hvd.rank(), hvd.size()
    x, y = dataset(STEPS * n * PER_RANK)
    rows = shard_rows(STEPS, PER_RANK, r, n)
    y[(2 * n + n - 1) * PER_RANK] = 1e30  # overflows the last rank's gradients in step 3 only
    alone = mlp(3)
    alone.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05)), loss="mse"
    )
    alone.fit(x, y, batch_size=n * PER_RANK, shuffle=False, verbose=0)
    arrangements = {
        "around": lambda: hvd.DistributedOptimizer(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05))
        ),
        "inside": lambda: keras.optimizers.LossScaleOptimizer(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
        ),
    }
    for what, make in arrangements.items():
        model = mlp(3)
        model.compile(optimizer=make(), loss="mse")
        model.fit(x[rows], y[rows], batch_size=PER_RANK, shuffle=False, verbose=0)
        same_bits_everywhere(flat(model.get_weights()), f"LossScaleOptimizer {what}")
        assert_weights_close(model.get_weights(), alone.get_weights(), f"LossScaleOptimizer {what}")
        scale, want = float(model.optimizer.dynamic_scale), float(alone.optimizer.dynamic_scale)
        assert scale == want < 2.0**15, f"LossScaleOptimizer {what}: scale {scale}, want {want}"
    # Under a mixed_float16 policy compile() wraps the optimizer itself: that is "inside".
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mlp(3)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.fit(x[rows], y[rows], batch_size=PER_RANK, shuffle=False, verbose=0)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    same_bits_everywhere(flat(model.get_weights()), "mixed_float16")


def check_save_and_load():
    r, n = hvd.rank(), hvd.size()
    folder = hvd.broadcast_object(ARGS.dir, 0)
    path = os.path.join(folder, "model.keras")
    x, y = dataset(STEPS * n * PER_RANK)
    rows = shard_rows(STEPS, PER_RANK, r, n)
    model = mlp(4)
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), op=hvd.Sum, backward_passes_per_step=1
    )
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x[rows], y[rows], batch_size=PER_RANK, shuffle=False, verbose=0)
    checkpoint = hvd.callbacks.ModelCheckpoint(os.path.join(folder, "ckpt-{epoch}.keras"))
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {"loss": 1.0})
    if r == 0:
        model.save(path)
    hvd.broadcast_object(None, 0)  # the file exists from here on
    loaded = hvd.load_model(path)
    assert type(loaded.optimizer).__name__ == "DistributedSGD", type(loaded.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    again = type(optimizer).from_config(optimizer.get_config())
    assert again.get_config() == optimizer.get_config()
    assert_weights_close(loaded.get_weights(), model.get_weights(), "loaded weights", 0, 0)
    assert_weights_close(
        [v.numpy() for v in loaded.optimizer.variables],
        [v.numpy() for v in model.optimizer.variables],
        "loaded optimizer state",
        0,
        0,
    )
    for m in (model, loaded):
        m.fit(x[rows], y[rows], batch_size=PER_RANK, shuffle=False, verbose=0)
    assert_weights_close(loaded.get_weights(), model.get_weights(), "training on after load")
    same_bits_everywhere(flat(loaded.get_weights()), "training on after load")
    assert os.path.exists(os.path.join(folder, "ckpt-1.keras"))
    check_atomic_checkpoint(model, folder)


def check_atomic_checkpoint(model, folder):
    if hvd.rank() != 0:
        return
    checkpoint = hvd.callbacks.ModelCheckpoint(os.path.join(folder, "latest.keras"))
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {})
    before = open(os.path.join(folder, "latest.keras"), "rb").read()

    def crash(path, overwrite=True):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise KeyboardInterrupt("killed mid-write")

    model.save, saved = crash, model.save
    try:
        checkpoint.on_epoch_end(1, {})
        raise AssertionError("the crash should have propagated")
    except KeyboardInterrupt:
        pass
    finally:
        model.save = saved
    after = open(os.path.join(folder, "latest.keras"), "rb").read()
    assert after == before, "a crash mid-write changed the latest checkpoint"
    leftovers = [f for f in os.listdir(folder) if f.startswith(".ringtrain-")]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def check_callbacks():
    r, n = hvd.rank(), hvd.size()
    logs = {"loss": float(r + 1), "accuracy": 0.5 * r, "note": "text"}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs["loss"] == (n + 1) / 2 and logs["accuracy"] == 0.25 * (n - 1), logs
    assert logs["note"] == "text"

    x, y = dataset(4 * n * PER_RANK)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: seen.append(float(model.optimizer.learning_rate))
    )
    model = mlp(5)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.4, multiplier=lambda epoch: 0.1**epoch, start_epoch=2
    )
    model.fit(
        x[: 4 * PER_RANK],
        y[: 4 * PER_RANK],
        batch_size=PER_RANK,
        epochs=4,
        verbose=0,
        callbacks=[warmup, schedule, record],
    )
    expected = [0.4 / n * ((e + b / 4) * (n - 1) / 2 + 1) for e in range(2) for b in range(4)]
    expected += [0.4 * 0.1**e for e in (2, 3) for _ in range(4)]
    assert np.allclose(seen, expected, rtol=1e-6), (seen, expected)


def check_jit_compile():
    n = hvd.size()
    x, y = dataset(2 * n * PER_RANK)
    model = mlp(6)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True
    )
    try:
        model.fit(x[: 2 * PER_RANK], y[: 2 * PER_RANK], batch_size=PER_RANK, verbose=0)
        raise AssertionError("jit_compile=True without a ringtrain callback should fail clearly")
    except RingtrainError as err:
        assert "jit_compile" in str(err), err
    model = mlp(6)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            x[: 2 * PER_RANK],
            y[: 2 * PER_RANK],
            batch_size=PER_RANK,
            verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
        )
    assert any("jit_compile=False" in str(w.message) for w in caught), caught
    assert model.jit_compile is False
    same_bits_everywhere(flat(model.get_weights()), "after jit fallback")


def body():
    hvd.init()
    for check in (
        check_equivalence,
        check_tape_equivalence,
        check_broadcast_from_different_inits,
        check_loss_scaling,
        check_save_and_load,
        check_callbacks,
        check_jit_compile,
    ):
        started = time.perf_counter()
        check()
        print(f"rank {hvd.rank()}: {check.__name__} OK ({time.perf_counter() - started:.1f} s)")
    hvd.shutdown()


main(body)
