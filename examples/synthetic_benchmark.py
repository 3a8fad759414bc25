"""Synthetic training throughput (Horovod's benchmark shape): img/sec per rank and in total.

Run (offline; models from keras.applications are built with random weights):
    python3 -m ringtrain.runner -np 2 python3 examples/synthetic_benchmark.py
    python3 -m ringtrain.runner -np 2 python3 examples/synthetic_benchmark.py --model MobileNetV2
        --image-size 96 --batch-size 16      (one command line)

The lines ringtrain adds end in ``# ringtrain:``.
"""

import argparse
import timeit

import keras
import numpy as np
import tensorflow as tf

import ringtrain.tensorflow as hvd  # ringtrain:


def build(args):
    """Return (model, one fixed random batch, number of classes)."""
    if args.model == "mlp":
        model = keras.Sequential(
            [keras.Input((784,))]
            + [keras.layers.Dense(1024, activation="relu") for _ in range(3)]
            + [keras.layers.Dense(10)]
        )
        shape, classes = (784,), 10
    else:
        shape, classes = (args.image_size, args.image_size, 3), 1000
        model = getattr(keras.applications, args.model)(weights=None, input_shape=shape)
    rng = np.random.default_rng(0)
    data = tf.constant(rng.random((args.batch_size, *shape), dtype=np.float32))
    target = tf.constant(rng.integers(0, classes, args.batch_size), tf.int64)
    return model, data, target


def main():
    """Time batches of training steps and print img/sec with a 95% confidence interval."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="'mlp' or a keras.applications name")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    hvd.init()  # ringtrain:
    compression = hvd.Compression.none  # ringtrain:
    if args.fp16_allreduce:
        compression = hvd.Compression.fp16  # ringtrain:
    model, data, target = build(args)
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=args.model == "mlp")
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)  # ringtrain:

    @tf.function
    def benchmark_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)  # ringtrain:
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    def log(text):
        if hvd.rank() == 0:  # ringtrain:
            print(text, flush=True)

    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} rank(s)")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{i}: {rates[-1]:.1f} img/sec per rank")
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()  # ringtrain:


if __name__ == "__main__":
    main()
