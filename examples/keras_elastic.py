r"""Elastic Keras training: relaunched from its last commit when a rank fails or hosts change.

Run (offline; nothing is downloaded), with a script that lists the hosts to use now:
    python3 -m ringtrain.runner -np 2 --min-np 1 --max-np 4 \
        --host-discovery-script hostfiles/discover-hosts.sh python3 examples/keras_elastic.py

Kill a rank while it trains (``pkill -f -n keras_elastic``), or change the hosts that the
script lists (``echo localhost:3 > hostfiles/elastic-hosts``): the job goes on from the
last epoch it committed. The data and model are those of keras_mnist.py; the lines
ringtrain adds end in ``# ringtrain:``.
"""

import time

import keras
import tensorflow as tf
from keras_mnist import build_model, load, training_arguments

import ringtrain.tensorflow.keras as hvd  # ringtrain:


def main():
    """Train for ``--epochs`` epochs over every launch, then report test accuracy on rank 0."""
    args = training_arguments(__doc__.splitlines()[0]).parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    hvd.init()  # ringtrain:
    started = time.perf_counter()
    x_train, y_train, x_test, y_test = load(args.mnist)
    model = build_model(x_train.shape[1:])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr))  # ringtrain:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)  # ringtrain: what a commit keeps

    def scale_learning_rate():  # ringtrain: the global batch grows with the ranks
        model.optimizer.learning_rate.assign(args.lr * hvd.size())

    scale_learning_rate()
    state.register_reset_callbacks([scale_learning_rate])  # ringtrain: after a relaunch
    callbacks = [
        hvd.elastic.CommitStateCallback(state, batches_per_commit=0),  # ringtrain: per epoch
        hvd.elastic.UpdateBatchStateCallback(state),  # ringtrain:
        hvd.elastic.UpdateEpochStateCallback(state),  # ringtrain:
        hvd.callbacks.MetricAverageCallback(),  # ringtrain: epoch logs averaged over ranks
    ]

    @hvd.elastic.run  # ringtrain: resumes the newest commit, same weights on every rank
    def train(state):
        per_rank = len(x_train) // hvd.size()  # ringtrain: this launch's shard
        mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)  # ringtrain:
        state.model.fit(
            x_train[mine],
            y_train[mine],
            batch_size=args.batch_size,
            epochs=args.epochs - state.epoch,  # ringtrain: the epochs left
            validation_data=(x_test, y_test),
            callbacks=callbacks,
            verbose=2 if hvd.rank() == 0 else 0,  # ringtrain: one progress report
        )

    train(state)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:  # ringtrain:
        print(
            f"test accuracy {accuracy:.4f} after {state.epoch} epochs, the last ones on "
            f"{hvd.size()} rank(s), {time.perf_counter() - started:.1f} s in this launch"
        )
    hvd.shutdown()  # ringtrain:


if __name__ == "__main__":
    main()
