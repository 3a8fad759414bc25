"""Data-parallel Keras training with model.fit: MNIST from a local mnist.npz, else sklearn digits.

Run (offline; nothing is downloaded), on any Keras backend (``KERAS_BACKEND=jax`` or
``torch`` picks another than TensorFlow):
    python3 -m ringtrain.runner -np 2 python3 examples/keras_mnist.py
    KERAS_BACKEND=torch python3 -m ringtrain.runner -np 2 python3 examples/keras_mnist.py
    python3 -m ringtrain.runner -np 2 python3 examples/keras_mnist.py --mnist ~/data/mnist.npz
    python3 examples/keras_mnist.py                      # one process, for comparison

Every rank trains on its own shard; the lines ringtrain adds end in ``# ringtrain:``.
"""

import argparse
import os
import time

import numpy as np

import ringtrain.keras as hvd  # ringtrain:


def load(mnist_path):
    """Return (x_train, y_train, x_test, y_test) as float32 images in [0, 1] and int labels."""
    if mnist_path:
        with np.load(os.path.expanduser(mnist_path)) as data:  # the file keras.datasets uses
            x_train, y_train = data["x_train"], data["y_train"]
            x_test, y_test = data["x_test"], data["y_test"]
        scale = 255.0
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()  # 1797 8x8 images, bundled with scikit-learn
        order = np.random.default_rng(0).permutation(len(digits.images))
        images, labels = digits.images[order], digits.target[order]
        cut = len(images) * 4 // 5
        x_train, y_train, x_test, y_test = images[:cut], labels[:cut], images[cut:], labels[cut:]
        scale = 16.0

    def prepare(images):
        return (images.astype(np.float32) / scale)[..., None]

    return prepare(x_train), y_train.astype(np.int32), prepare(x_test), y_test.astype(np.int32)


def build_model(input_shape):
    """Return a small CNN for 10-class images of ``input_shape``."""
    import keras

    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10),
        ]
    )


def training_arguments(description):
    """Return a parser of the data, epochs, batch, learning-rate and thread options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mnist", help="path to a local mnist.npz (default: sklearn digits)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="for one process")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    return parser


def limit_threads(threads):
    """Give the Keras backend's math ``threads`` threads per rank (ranks share the cores)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "jax":  # read when JAX first computes
        flag = "--xla_cpu_multi_thread_eigen=false" if threads == 1 else ""
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def main():
    """Train, then report test accuracy and wall time on rank 0."""
    parser = training_arguments(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="save the model here each epoch")
    args = parser.parse_args()
    limit_threads(args.threads)
    import keras

    hvd.init()  # ringtrain:
    started = time.perf_counter()
    x_train, y_train, x_test, y_test = load(args.mnist)
    per_rank = len(x_train) // hvd.size()  # ringtrain: equal shards, so equal steps per rank
    mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)  # ringtrain:
    x_train, y_train = x_train[mine], y_train[mine]  # ringtrain:

    keras.utils.set_random_seed(hvd.rank())  # ringtrain: shuffles differ per rank
    model = build_model(x_train.shape[1:])
    lr = args.lr * hvd.size()  # ringtrain: the global batch is size() times larger
    optimizer = keras.optimizers.Adam(lr)
    optimizer = hvd.DistributedOptimizer(optimizer)  # ringtrain:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # ringtrain: same start everywhere
        hvd.callbacks.MetricAverageCallback(),  # ringtrain: epoch logs averaged over ranks
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=3),  # ringtrain:
    ]
    if args.checkpoint:
        callbacks.append(hvd.callbacks.ModelCheckpoint(args.checkpoint))  # ringtrain: rank 0
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,  # ringtrain: one progress report
    )
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:  # ringtrain:
        dataset = "MNIST" if args.mnist else "sklearn digits"
        print(
            f"{dataset}: test accuracy {accuracy:.4f} after {args.epochs} epochs on "
            f"{hvd.size()} rank(s) on {keras.backend.backend()}, "
            f"{time.perf_counter() - started:.1f} s"  # ringtrain:
        )
    hvd.shutdown()  # ringtrain:


if __name__ == "__main__":
    main()
