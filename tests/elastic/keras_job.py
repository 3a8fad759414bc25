"""An elastic Keras job for tests/test_elastic.py, run by ``ringtrain-run --host-discovery-script``.

``fit``: ``model.fit`` with ``DistributedOptimizer``, ``KerasState`` and the three elastic
callbacks, committing between epochs. ``tape``: a custom loop with ``DistributedGradientTape``
and ``TensorFlowKerasState``, committing every 3 batches. Every rank starts from its own
random weights and trains on its own data. Environment: KERAS_MODE (fit or tape), KERAS_OUT
(the .npz that rank 0 writes at the end), KERAS_CRASH (``epoch:batch``: rank 1 dies there in
the first launch).
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
    mode = os.environ["KERAS_MODE"]
    crash = os.environ.get("KERAS_CRASH", "")
    generation = settings.elastic_launch().generation
    hvd.init()
    keras.utils.set_random_seed(100 + hvd.rank())  # different weights on every rank
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((STEPS * BATCH, 5)).astype("float32")
    y = (x @ np.arange(1, 6, dtype="float32") + 0.5)[:, None]
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )

    def crashes_at(epoch, batch):
        target = f"{epoch}:{batch}"
        return generation == 0 and hvd.rank() == 1 and crash == target

    def check_synced():
        total = float(sum(np.sum(w, dtype="float64") for w in model.get_weights()))
        assert len(set(hvd.allgather_object(total))) == 1, "the ranks' weights differ"

    if mode == "fit":
        model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        state = hvd.elastic.KerasState(model, epoch=0, batch=0)

        class Crash(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if crashes_at(state.epoch, batch):
                    os._exit(3)

        callbacks = [
            hvd.elastic.CommitStateCallback(state, batches_per_commit=0),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            Crash(),
        ]

        @hvd.elastic.run
        def train(state):
            check_synced()
            state.model.fit(
                x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0,
                callbacks=callbacks,
            )  # fmt: skip

        optimizer = model.optimizer
    else:
        optimizer = keras.optimizers.Adam(0.01)
        state = hvd_tf.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb) - yb) ** 2)
            grads = hvd_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        @hvd_tf.elastic.run
        def train(state):
            check_synced()
            while state.epoch < EPOCHS:
                while state.batch < STEPS:
                    if crashes_at(state.epoch, state.batch):
                        os._exit(3)
                    b = slice(state.batch * BATCH, (state.batch + 1) * BATCH)
                    step(x[b], y[b])
                    state.batch += 1
                    if state.batch % 3 == 0:
                        state.commit()
                state.batch = 0
                state.epoch += 1
                state.commit()

    train(state)
    check_synced()
    if hvd.rank() == 0:
        np.savez(
            os.environ["KERAS_OUT"],
            *model.get_weights(),
            iterations=int(optimizer.iterations.numpy()),
            epoch=state.epoch,
            generation=generation,
        )


if __name__ == "__main__":
    main()
