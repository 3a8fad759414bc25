"""Local sources and local layers at any world size, against NumPy.

Each rank has its own rows (4, 1, 0 and 6 on ranks 0-3 for the tape; 4, 1, 3 and 6 for
Keras's mean losses). The reference gradients are TensorFlow's own on each rank's rows,
all computed on every rank from the same weights. A registered local variable must get
its rank's own gradient (divided by the number of ranks unless scale_local_gradients is
False), every other variable the mean over ranks, computed in NumPy.
"""

import numpy as np
from common import main
from tfsetup import FEATURES, OUTPUTS, configure, mlp, own_gradients, sum_loss

configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain  # noqa: E402
import ringtrain.tensorflow as hvd  # noqa: E402
import ringtrain.tensorflow.keras as hk  # noqa: E402

VOCAB = 7


def batch(r, salt, rows=(4, 1, 0, 6)):
    rng = np.random.default_rng([salt, r])
    n = rows[r % 4]
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, rng.normal(size=(n, OUTPUTS)).astype(np.float32)


def expected(per_rank, local, scale):
    """Return per variable the mean over ranks, or this rank's own gradient where local."""
    n, r = hvd.size(), hvd.rank()
    out = []
    for i, is_local in enumerate(local):
        if is_local:
            out.append(per_rank[r][i] / (n if scale else 1))
        else:
            out.append(np.mean([g[i] for g in per_rank], axis=0))
    return out


def assert_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g = np.asarray(tf.convert_to_tensor(g), np.float64)
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-5, atol=1e-5):
            worst = np.max(np.abs(g - w)) if g.shape == w.shape else f"shape {g.shape}"
            raise AssertionError(f"{what}: variable {i} differs by {worst} (want {w.shape})")


def check_tape():
    model = mlp(3)
    hidden = model.layers[1]
    local = [any(v is w for w in hidden.trainable_weights) for v in model.trainable_variables]
    assert sum(local) == 2, local
    per_rank = [own_gradients(model, *batch(r, 1)) for r in range(hvd.size())]
    x, y = batch(hvd.rank(), 1)
    for compiled in (False, True):
        for scale in (True, False):
            for how in ("local_layers", "register_local_source"):

                def step(x, y, scale=scale, how=how):
                    with tf.GradientTape() as tape:
                        loss = sum_loss(model, x, y)
                    if how == "local_layers":
                        tape = hvd.PartialDistributedGradientTape(
                            tape, local_layers=[hidden], scale_local_gradients=scale
                        )
                    else:
                        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
                        for variable in hidden.trainable_weights:
                            tape.register_local_source(variable)
                    return tape.gradient(loss, model.trainable_variables)

                run = tf.function(step) if compiled else step
                what = f"tape, {how}, scale {scale}, tf.function {compiled}"
                assert_close(run(x, y), expected(per_rank, local, scale), what)


def check_local_embedding():
    """Check that a local embedding's gradient stays tf.IndexedSlices, its values scaled."""
    keras.utils.set_random_seed(5)
    embed = keras.layers.Embedding(VOCAB, 3)
    head = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), embed, head])

    def ids_and_y(r):
        rng = np.random.default_rng([2, r])
        n = (3, 1, 0, 5)[r % 4]
        return rng.integers(0, VOCAB, (n, 4)).astype(np.int32), rng.normal(size=(n, 4, 2))

    per_rank = [own_gradients(model, *ids_and_y(r)) for r in range(hvd.size())]
    x, y = ids_and_y(hvd.rank())
    with tf.GradientTape() as tape:
        loss = sum_loss(model, x, y.astype(np.float32))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=embed)
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices), type(grads[0])
    assert_close(grads, expected(per_rank, [True, False, False], True), "local embedding")


def mse(model, x, y):
    return keras.losses.MeanSquaredError()(y, model(x))


def check_keras_optimizer():
    rows = (4, 1, 3, 6)  # Keras's mean loss needs a row on every rank
    model = mlp(4)
    hidden = model.layers[1]
    start = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    local = [any(v is w for w in hidden.trainable_weights) for v in model.trainable_variables]
    optimizer = hk.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[hidden])
    assert optimizer.get_config()["ringtrain"]["scale_local_gradients"] is True
    model.compile(optimizer=optimizer, loss="mse")
    per_rank = [own_gradients(model, *batch(r, 3, rows), mse) for r in range(hvd.size())]
    model.train_on_batch(*batch(hvd.rank(), 3, rows))
    want = [w - 0.1 * g for w, g in zip(start, expected(per_rank, local, True), strict=True)]
    assert_close(model.trainable_variables, want, "PartialDistributedOptimizer, one step")

    # Two backward passes per step, only the hidden kernel local, unscaled.
    model = mlp(5)
    kernel = model.layers[1].kernel
    start = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    local = [v is kernel for v in model.trainable_variables]
    optimizer = hk.DistributedOptimizer(
        keras.optimizers.SGD(0.1), backward_passes_per_step=2, scale_local_gradients=False
    )
    optimizer.register_local_var(kernel)
    config = optimizer.get_config()
    assert config["ringtrain"]["scale_local_gradients"] is False, config
    assert type(optimizer).from_config(config).get_config() == config
    model.compile(optimizer=optimizer, loss="mse")
    summed = None
    for salt in (6, 7):
        grads = [own_gradients(model, *batch(r, salt, rows), mse) for r in range(hvd.size())]
        if summed is not None:
            pairs = zip(summed, grads, strict=True)
            grads = [[a + b for a, b in zip(s, g, strict=True)] for s, g in pairs]
        summed = grads
        model.train_on_batch(*batch(hvd.rank(), salt, rows))
    want = [w - 0.1 * g for w, g in zip(start, expected(summed, local, False), strict=True)]
    assert_close(model.trainable_variables, want, "register_local_var, two passes")


def check_errors():
    model = mlp(6)
    for bad, kind, needle in (
        (["dense"], TypeError, "local_layers must be Keras layers, got str ('dense')"),
        ([keras.layers.Dense(2, name="unbuilt")], ValueError, "'unbuilt' is not built yet"),
    ):
        try:
            hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=bad)
        except kind as err:
            assert needle in str(err), err
        else:
            raise AssertionError(f"local_layers={bad!r} was accepted")
    try:
        hvd.DistributedGradientTape(tf.GradientTape()).register_local_source(tf.ones(2))
    except TypeError as err:
        assert "must be a keras.Variable or tf.Variable, got EagerTensor" in str(err), err
    else:
        raise AssertionError("a tensor was accepted as a local source")
    try:
        hvd.DistributedGradientTape(tf.GradientTape(), scale_local_gradients="yes")
    except ValueError as err:
        assert "scale_local_gradients must be True or False, got 'yes'" in str(err), err
    else:
        raise AssertionError("scale_local_gradients='yes' was accepted")
    if hvd.size() == 1:
        return
    # Rank 0 alone keeps the hidden layer local: every rank fails, naming it, and no rank
    # waits for a gradient that rank 0 never sends.
    x, y = batch(hvd.rank(), 8)
    with tf.GradientTape() as tape:
        loss = sum_loss(model, x, y)
    tape = hvd.PartialDistributedGradientTape(
        tape, local_layers=[model.layers[1]] if hvd.rank() == 0 else []
    )
    try:
        tape.gradient(loss, model.trainable_variables)
    except (tf.errors.OpError, ringtrain.RingtrainError) as err:
        for needle in ("ranks disagree on its gradient", model.layers[1].kernel.path):
            assert needle in str(err), err
    else:
        raise AssertionError("ranks that disagree on local layers were not reported")


def check_topology_ops():
    for op, value in (
        (hvd.size_op, hvd.size()),
        (hvd.rank_op, hvd.rank()),
        (hvd.local_size_op, hvd.local_size()),
        (hvd.local_rank_op, hvd.local_rank()),
    ):
        for got in (op(), tf.function(op)()):
            assert got.dtype == tf.int32 and int(got) == value, (op.__name__, got, value)


def body():
    hvd.init()
    for check in (
        check_tape,
        check_local_embedding,
        check_keras_optimizer,
        check_errors,
        check_topology_ops,
        check_tape,  # the engine still works after the mismatch
    ):
        check()
        print(f"rank {hvd.rank()}: {check.__name__} OK", flush=True)
    hvd.shutdown()


main(body)
