"""A custom TensorFlow 2 training loop with DistributedGradientTape, on sklearn's digits.

Run (offline):
    python3 -m ringtrain.runner -np 2 python3 examples/tf2_custom_loop.py

The lines ringtrain adds end in ``# ringtrain:``.
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import ringtrain.tensorflow as hvd  # ringtrain:


def main():
    """Train an MLP for a number of steps; rank 0 reports accuracy and time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)

    hvd.init()  # ringtrain:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    per_rank = len(x_train) // hvd.size()  # ringtrain:
    mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)  # ringtrain:
    batches = (
        tf.data.Dataset.from_tensor_slices((x_train[mine], y_train[mine]))  # ringtrain: shard
        .shuffle(per_rank, seed=hvd.rank())  # ringtrain:
        .repeat()
        .batch(args.batch_size)
    )

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9)  # ringtrain: scaled lr
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)  # ringtrain:

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)  # ringtrain: gradients averaged over ranks
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    started = time.perf_counter()
    for step, (images, labels) in enumerate(batches.take(args.steps)):
        loss = train_step(images, labels)
        if step % 100 == 0 and hvd.rank() == 0:  # ringtrain: log on rank 0 only
            print(f"step {step}: loss {float(loss):.4f}")
    predictions = np.argmax(model(x_test), axis=1)
    accuracy = hvd.allreduce(np.mean(predictions == y_test), name="accuracy")  # ringtrain:
    if hvd.rank() == 0:  # ringtrain:
        print(
            f"test accuracy {float(accuracy):.4f} after {args.steps} steps on {hvd.size()} "
            f"rank(s), {time.perf_counter() - started:.1f} s"  # ringtrain:
        )
    hvd.shutdown()  # ringtrain:


if __name__ == "__main__":
    main()
