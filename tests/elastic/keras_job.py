"""An elastic Keras job for tests/test_elastic.py, run by ``ringtrain-run --host-discovery-script``.

Two trainings, one after the other, each with its own state and its own model:

- ``fit``: ``model.fit`` with ``DistributedOptimizer``, ``KerasState`` and the three elastic
  callbacks, committing between epochs;
- ``tape``: a custom loop with ``DistributedGradientTape`` and ``TensorFlowKerasState``,
  committing every 3 batches and between epochs; a step counter (a ``tf.Variable`` that
  starts at 100 times the rank) is committed with it in a ``TensorFlowState``.

Every rank starts from its own random weights and trains on its own data. Environment:
KERAS_OUT (the .npz that rank 0 writes at the end), KERAS_CRASH (``part:generation:epoch:batch``
entries, comma-separated: rank 1 dies there).
"""

import os

import keras
import numpy as np
import tensorflow as tf

import ringtrain.tensorflow as hvd_tf
import ringtrain.tensorflow.keras as hvd
from ringtrain import settings

EPOCHS, STEPS, BATCH = 4, 6, 8


def main():
    generation = settings.elastic_launch().generation
    crashes = set(filter(None, os.environ.get("KERAS_CRASH", "").split(",")))
    hvd.init()
    keras.utils.set_random_seed(100 + hvd.rank())  # different weights on every rank
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((STEPS * BATCH, 5)).astype("float32")
    y = (x @ np.arange(1, 6, dtype="float32") + 0.5)[:, None]

    def model():
        layers = [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        return keras.Sequential([keras.Input((5,)), *layers])

    def crash_at(part, epoch, batch):
        if hvd.rank() == 1 and f"{part}:{generation}:{epoch}:{batch}" in crashes:
            os._exit(3)

    def check_synced(net):
        total = float(sum(np.sum(w, dtype="float64") for w in net.get_weights()))
        assert len(set(hvd.allgather_object(total))) == 1, "the ranks' weights differ"

    fitted = model()
    fitted.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    fit_state = hvd.elastic.KerasState(fitted, epoch=0, batch=0)
    looped = model()
    optimizer = keras.optimizers.Adam(0.01)
    tape_state = hvd_tf.elastic.TensorFlowKerasState(looped, optimizer, epoch=0, batch=0)
    steps = tf.Variable(100 * hvd.rank(), dtype=tf.int64)
    steps_state = hvd_tf.elastic.TensorFlowState([steps])

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            crash_at("fit", fit_state.epoch, batch)

    callbacks = [
        hvd.elastic.CommitStateCallback(fit_state, batches_per_commit=0),
        hvd.elastic.UpdateBatchStateCallback(fit_state),
        hvd.elastic.UpdateEpochStateCallback(fit_state),
        Crash(),
    ]

    @hvd.elastic.run
    def train_fit(state):
        check_synced(state.model)
        state.model.fit(
            x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0,
            callbacks=callbacks,
        )  # fmt: skip

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((looped(xb) - yb) ** 2)
        grads = hvd_tf.DistributedGradientTape(tape).gradient(loss, looped.trainable_variables)
        optimizer.apply(grads, looped.trainable_variables)
        steps.assign_add(1)

    def commit_tape():
        tape_state.commit()
        steps_state.commit()

    @hvd_tf.elastic.run
    def train_tape(state):
        check_synced(state.model)
        while state.epoch < EPOCHS:
            while state.batch < STEPS:
                crash_at("tape", state.epoch, state.batch)
                b = slice(state.batch * BATCH, (state.batch + 1) * BATCH)
                step(x[b], y[b])
                state.batch += 1
                if state.batch % 3 == 0:
                    commit_tape()
            state.batch = 0
            state.epoch += 1
            commit_tape()

    train_fit(fit_state)
    hvd_tf.elastic.run(lambda state: None)(steps_state)  # resume and sync the counter
    train_tape(tape_state)
    assert len(set(hvd.allgather_object(int(steps.numpy())))) == 1, "the counters differ"
    for net in (fitted, looped):
        check_synced(net)
    if hvd.rank() == 0:
        arrays = {f"fit{i}": w for i, w in enumerate(fitted.get_weights())}
        arrays.update({f"tape{i}": w for i, w in enumerate(looped.get_weights())})
        np.savez(
            os.environ["KERAS_OUT"],
            fit_iterations=int(fitted.optimizer.iterations.numpy()),
            tape_iterations=int(optimizer.iterations.numpy()),
            tape_steps=int(steps.numpy()),
            epochs=[fit_state.epoch, tape_state.epoch],
            generation=generation,
            **arrays,
        )


if __name__ == "__main__":
    main()
