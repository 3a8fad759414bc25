"""Every collective on tf.Tensors, eagerly and in tf.function, with gradients and error paths.

Runs at any world size; compares against NumPy answers computed from every rank's data.
"""

import os
import traceback

import ml_dtypes
import numpy as np
from common import (
    DTYPES,
    OPS,
    adasum_reference,
    assert_equal,
    expected,
    main,
    rank_data,
    same_bits_everywhere,
)
from tfsetup import FEATURES, OUTPUTS, configure, mlp, own_gradients
from wire_ring import error_bound

configure()


import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain  # noqa: E402
import ringtrain.tensorflow as hvd  # noqa: E402
from ringtrain.tensorflow import bridge  # noqa: E402


def modes(fn):
    """Return ``fn`` eagerly and as a tf.function (retraced per call signature)."""
    return {"eager": fn, "tf.function": tf.function(fn)}


def everyone(shape, dtype, salt=0, rows=None):
    """Return every rank's data for (shape, dtype), each rank's own first."""
    n = hvd.size()
    data = []
    for r in range(n):
        s = shape if rows is None else (rows(r), *shape[1:])
        data.append(rank_data(r, s, dtype, salt))
    return data


def check_allreduce():
    r = hvd.rank()
    for mode, fn in modes(lambda x, op: hvd.allreduce(x, op=op)).items():
        for dtype in DTYPES:
            for op in OPS:
                data = everyone((3, 5), dtype, salt=int(op))
                got = fn(tf.constant(data[r]), op).numpy()
                assert_equal(got, expected(op, data, dtype), f"allreduce {mode} {dtype} {op.name}")
        data = everyone((7,), np.float32, salt=9)
        got = hvd.allreduce(data[r], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        assert_equal(got.numpy(), expected(hvd.Sum, data, np.float32) * 1.5, "allreduce scaled")
        got = hvd.allreduce(tf.constant(data[r]), compression=hvd.Compression.fp16)
        assert got.dtype == tf.float32
        want = expected(hvd.Average, data, np.float64)
        bound = error_bound(data, "fp16", 1 / len(data))
        assert np.all(np.abs(got.numpy() - want) <= bound), "fp16 compression"


def check_horovod_keras_values():
    # Horovod's Keras-level collectives take any value and give NumPy values back.
    import ringtrain.tensorflow.keras as hk

    r, n = hvd.rank(), hvd.size()
    data = everyone((2 * n + 1, 3), np.float32, salt=11)
    got = hk.allreduce(data[r], name="k.avg")
    assert isinstance(got, np.ndarray)
    assert_equal(got, expected(hvd.Average, data, np.float32), "keras allreduce")
    got = hk.allreduce(data[r].tolist(), average=False, name="k.sum")
    assert_equal(got, expected(hvd.Sum, data, np.float32), "keras allreduce average=False")
    got = hvd.allreduce(tf.constant(data[r]), average=False, name="t.sum")
    assert_equal(got.numpy(), expected(hvd.Sum, data, np.float32), "allreduce average=False")
    rows = everyone((0, 2), np.int64, salt=12, rows=lambda i: i + 1)
    assert_equal(hk.allgather(rows[r], name="k.ag"), np.concatenate(rows), "keras allgather")
    epoch = hk.broadcast(10 + r, n - 1, name="resume_from_epoch")  # Horovod's resume idiom
    assert int(epoch) == 10 + n - 1, epoch
    full = expected(hvd.Max, data, np.float32)
    base, extra = divmod(2 * n + 1, n)
    start = r * base + min(r, extra)
    got = hk.reducescatter(data[r], name="k.rs", op=hvd.Max)
    assert_equal(got, full[start : start + base + (1 if r < extra else 0)], "keras reducescatter")
    assert (hk.cross_rank(), hk.cross_size()) == (0, 1) and hk.is_homogeneous()
    assert hk.mpi_built() and not hk.nccl_built()


def check_results_survive_ops_on_their_slices():
    # TensorFlow takes over the memory of an aligned slice of an op's result and may write
    # the next op's output into it. A result that the host's ranks shared changed under the
    # other ranks that way (float64: each 8-element slice is 64-byte aligned).
    r = hvd.rank()
    data = everyone((24,), np.float64, salt=21)
    want = expected(hvd.Sum, data, np.float64)

    @tf.function
    def doubled_slices(x):
        y = hvd.allreduce(x, op=hvd.Sum, name="sliced")
        return [tf.slice(y, [8 * k], [8]) * 2.0 for k in range(3)]

    for _ in range(3):
        got = np.concatenate([t.numpy() for t in doubled_slices(tf.constant(data[r]))])
        assert_equal(got, want * 2.0, "doubled slices of an allreduce result")


def check_grouped_allreduce():
    r = hvd.rank()
    for mode, fn in modes(lambda xs: hvd.grouped_allreduce(xs, op=hvd.Sum)).items():
        shapes = [(4,), (2, 3), (5,)]
        data = [everyone(s, np.float32, salt=i) for i, s in enumerate(shapes)]
        got = fn([tf.constant(d[r]) for d in data])
        for i, (g, d) in enumerate(zip(got, data, strict=True)):
            assert_equal(g.numpy(), expected(hvd.Sum, d, np.float32), f"grouped {mode} {i}")


def check_allgather_broadcast_alltoall_reducescatter():
    r, n = hvd.rank(), hvd.size()
    for mode, gather in modes(lambda x: hvd.allgather(x)).items():
        for dtype in (np.float32, np.int64, np.uint8, ml_dtypes.bfloat16):
            data = everyone((0, 3), dtype, rows=lambda k: k + 1)
            got = gather(tf.constant(data[r])).numpy()
            assert_equal(got, np.concatenate(data), f"allgather {mode} {dtype}")
    root = n - 1
    for mode, bcast in modes(lambda x: hvd.broadcast(x, root)).items():
        for dtype in (np.float64, np.int8, np.bool_, np.uint32, np.int16):
            data = [np.asarray(rank_data(k, (2, 3), np.int32) % 2).astype(dtype) for k in range(n)]
            got = bcast(tf.constant(data[r])).numpy()
            assert got.dtype == np.dtype(dtype) and np.array_equal(got, data[root]), (
                f"broadcast {mode} {dtype}"
            )
    for mode, fn in modes(lambda x, s: hvd.alltoall(x, splits=s)).items():
        splits = [(r + j) % 3 for j in range(n)]
        rows = [[(k + j) % 3 for j in range(n)] for k in range(n)]
        data = [rank_data(k, (sum(rows[k]), 2), np.float32) for k in range(n)]
        offsets = [np.concatenate(([0], np.cumsum(rows[k]))) for k in range(n)]
        want = np.concatenate([data[k][offsets[k][r] : offsets[k][r + 1]] for k in range(n)])
        got, _ = fn(tf.constant(data[r]), tf.constant(splits))
        assert_equal(got.numpy(), want, f"alltoall {mode}")
    even = hvd.alltoall(tf.constant(rank_data(r, (2 * n, 3), np.int32)))
    assert even.shape == (2 * n, 3), even.shape
    for mode, fn in modes(lambda x: hvd.reducescatter(x, op=hvd.Sum)).items():
        data = everyone((2 * n + 1, 2), np.float32)
        total = expected(hvd.Sum, data, np.float32)
        first = r * 2 + min(r, 1)
        got = fn(tf.constant(data[r])).numpy()
        assert_equal(got, total[first : first + 2 + (r < 1)], f"reducescatter {mode}")
    assert hvd.broadcast_object({"from": r}, root_rank=root) == {"from": root}
    assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
    last = hvd.join()
    assert last.dtype == tf.int32 and 0 <= int(last) < n
    same_bits_everywhere(np.array([int(last)]), "join")


def check_gradients():
    r, n = hvd.rank(), hvd.size()
    c = [rank_data(k, (4,), np.float32, salt=5) for k in range(n)]
    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):

        @wrap
        def grads(x, c_mine):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                outs = {
                    "sum": hvd.allreduce(x, op=hvd.Sum, name="g.sum"),
                    "avg": hvd.allreduce(x, op=hvd.Average, name="g.avg"),
                    "grouped": hvd.grouped_allreduce([x], op=hvd.Sum, name="g.grouped")[0],
                    "bcast": hvd.broadcast(x, n - 1, name="g.bcast"),
                    "gather": hvd.allgather(x[: r + 1], name="g.gather"),
                    "ggather": hvd.grouped_allgather(
                        [x[: r + 1], 2.0 * x[: r + 1]], name="g.ggather"
                    ),
                }
                losses = {k: tf.reduce_sum(outs[k] * c_mine) for k in ("sum", "avg", "grouped")}
                losses["bcast"] = tf.reduce_sum(outs["bcast"] * c_mine)
                weights = tf.tile(c_mine, [n])[: n * (n + 1) // 2]
                losses["gather"] = tf.reduce_sum(outs["gather"] * weights)
                losses["ggather"] = sum(tf.reduce_sum(y * weights) for y in outs["ggather"])
            return {k: tape.gradient(v, x) for k, v in losses.items()}

        got = grads(tf.constant(rank_data(r, (4,), np.float32)), tf.constant(c[r]))
        total = np.sum(c, axis=0)
        assert np.allclose(got["sum"], total), f"allreduce Sum gradient {mode}"
        assert np.allclose(got["grouped"], total), f"grouped_allreduce gradient {mode}"
        assert np.allclose(got["avg"], total / n), f"allreduce Average gradient {mode}"
        # Horovod's: the Average over ranks, for allgather and broadcast (check_tf_horovod.py).
        want = total / n if r == n - 1 else np.zeros(4)
        assert np.allclose(got["bcast"], want), f"broadcast gradient {mode}"
        tiled = [np.tile(ck, n)[: n * (n + 1) // 2] for ck in c]
        first = r * (r + 1) // 2
        want = np.zeros(4, np.float32)
        want[: r + 1] = np.mean(tiled, axis=0)[first : first + r + 1]
        assert np.allclose(got["gather"], want), f"allgather gradient {mode}: {got['gather']}"
        assert np.allclose(got["ggather"], 3 * want), f"grouped_allgather gradient {mode}"


def check_grouped_allgather_and_reducescatter():
    r, n = hvd.rank(), hvd.size()
    ints = everyone((0, 3), np.int32, salt=14, rows=lambda k: k + 1)
    floats = everyone((0, 2), np.float64, salt=15, rows=lambda k: k % 2)
    scatter = [everyone((2 * n + 1, 2), np.float32, salt=16), everyone((n, 5), np.int64, salt=17)]
    for mode, fn in modes(lambda a, b: hvd.grouped_allgather([a, b])).items():
        got = fn(tf.constant(ints[r]), tf.constant(floats[r]))
        assert_equal(got[0].numpy(), np.concatenate(ints), f"grouped_allgather 0 {mode}")
        assert_equal(got[1].numpy(), np.concatenate(floats), f"grouped_allgather 1 {mode}")
    for mode, fn in modes(lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum)).items():
        got = fn(tf.constant(scatter[0][r]), tf.constant(scatter[1][r]))
        for k, data in enumerate(scatter):
            full = expected(hvd.Sum, data, data[0].dtype)
            share = np.array_split(np.arange(len(full)), n)[r]
            assert_equal(got[k].numpy(), full[share], f"grouped_reducescatter {k} {mode}")
    assert hvd.grouped_allgather([]) == [] and hvd.grouped_reducescatter([]) == []


def embedding_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4), keras.layers.Dense(2)]
    )


def check_sparse_and_tape():
    r, n = hvd.rank(), hvd.size()
    ids = [np.random.default_rng(k).integers(0, 20, size=(6, 3)).astype(np.int32) for k in range(n)]
    model = embedding_model(0)

    def local_grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        return tape, loss

    dense_everywhere = []
    for k in range(n):
        tape, loss = local_grads(ids[k])
        grad = tape.gradient(loss, model.trainable_variables)[0]
        assert isinstance(grad, tf.IndexedSlices), type(grad)
        dense_everywhere.append(tf.convert_to_tensor(grad).numpy())
    want = np.mean(dense_everywhere, axis=0)
    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):
        for sparse_as_dense in (False, True):

            @wrap
            def reduced(x, sparse_as_dense=sparse_as_dense):
                tape, loss = local_grads(x)
                tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
                return tape.gradient(loss, model.trainable_variables)[0]

            got = reduced(tf.constant(ids[r]))
            kind = tf.Tensor if sparse_as_dense else tf.IndexedSlices
            assert isinstance(got, kind), f"{mode} sparse_as_dense={sparse_as_dense}: {type(got)}"
            assert np.allclose(tf.convert_to_tensor(got), want, atol=1e-6), (mode, sparse_as_dense)
    tape, loss = local_grads(ids[r])
    grad = tape.gradient(loss, model.trainable_variables)[0]
    summed = hvd.allreduce(grad, op=hvd.Sum)
    assert isinstance(summed, tf.IndexedSlices)
    assert np.allclose(tf.convert_to_tensor(summed), want * n, atol=1e-6), "allreduce IndexedSlices"


def check_sparse_optimizer():
    r, n = hvd.rank(), hvd.size()
    steps, per_rank = 2, 6
    rng = np.random.default_rng(42)
    ids = rng.integers(0, 20, size=(steps * n * per_rank, 3)).astype(np.int32)
    targets = rng.normal(size=(steps * n * per_rank, 3, 2)).astype(np.float32)
    mine = np.concatenate([np.arange(per_rank) + (j * n + r) * per_rank for j in range(steps)])
    # Keras updates Adam's slots lazily (touched rows only) for tf.IndexedSlices, so dense
    # and sparse gradients differ under Adam; under SGD they agree.
    cases = [("Adam", False), ("SGD", False), ("SGD", True)]
    for name, sparse_as_dense in cases:
        make = getattr(keras.optimizers, name)
        alone = embedding_model(1)
        alone.compile(optimizer=make(0.05), loss="mse")
        alone.fit(ids, targets, batch_size=n * per_rank, shuffle=False, verbose=0)
        model = embedding_model(1)
        optimizer = hvd.DistributedOptimizer(make(0.05), sparse_as_dense=sparse_as_dense)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(ids[mine], targets[mine], batch_size=per_rank, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), alone.get_weights(), strict=True):
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (
                f"embedding, {name}, sparse_as_dense={sparse_as_dense}: {np.abs(got - want).max()}"
            )


def check_broadcast_variables():
    r, n = hvd.rank(), hvd.size()
    variables = [tf.Variable(rank_data(r, (3, 2), np.float32)), tf.Variable(r * 7, dtype=tf.int64)]
    hvd.broadcast_variables(variables, root_rank=n - 1)
    assert_equal(variables[0].numpy(), rank_data(n - 1, (3, 2), np.float32), "eager variables")
    assert int(variables[1].numpy()) == (n - 1) * 7
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.build((None, 3))
    for v in model.variables:
        v.assign(tf.fill(v.shape, float(r + 1)))
    tf.function(lambda: hvd.broadcast_variables(model.variables, 0))()
    for v in model.variables:
        assert np.all(v.numpy() == 1.0), "tf.function broadcast_variables"


def expect_error(fn, *needles):
    """Run ``fn``; require an error whose message holds every needle (never a hang)."""
    try:
        fn()
    except (tf.errors.OpError, ringtrain.RingtrainError) as err:
        text = str(err)
        missing = [needle for needle in needles if needle not in text]
        assert not missing, f"error lacks {missing}: {text}"
        return
    raise AssertionError(f"expected an error mentioning {needles}")


def check_mismatches():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        return
    expect_error(lambda: hvd.allreduce(tf.zeros([2 + r]), name="mismatched"), "mismatched")
    keras.utils.set_random_seed(0)
    wide = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3 + r), keras.layers.Dense(1, name="out")]
    )

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(wide(x))
        tape = hvd.DistributedGradientTape(tape)
        return tape.gradient(loss, wide.trainable_variables)

    expect_error(lambda: step(tf.ones([2, 4])), "MismatchError", "out/kernel", "shape differs")
    # A model with one more layer on one rank: the manifest stops every rank.
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(3) for _ in range(1 + (r == 0))]
    deeper = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(1)])
    deeper.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD()), loss="mse")
    for _ in range(3):  # at once again: the last try's tensors are gone, not colliding
        expect_error(
            lambda: deeper.fit(np.ones((4, 4)), np.ones((4, 1)), batch_size=4, verbose=0),
            "different numbers of tensors",
        )
    # Rank 0's last two gradients found no partner: they were withdrawn, so the next model's
    # step, whose gradients take the same names, trains (a leftover would collide).
    keras.utils.set_random_seed(0)
    same = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    same.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x = np.random.default_rng(r).normal(size=(4, 4))
    same.fit(x, np.ones((4, 1)), batch_size=4, verbose=0)
    same_bits_everywhere(np.concatenate([w.ravel() for w in same.get_weights()]), "after")


def check_adasum():
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        for mode, fn in modes(lambda x: hvd.allreduce(x, op=hvd.Adasum)).items():
            try:
                fn(tf.ones(3))
            except (ValueError, tf.errors.OpError) as err:
                assert f"power-of-two number of ranks; this call has {n}" in str(err), err
            else:
                raise AssertionError(f"Adasum ran at {n} ranks ({mode})")
        return
    for mode, fn in modes(lambda x: hvd.allreduce(x, op=hvd.Adasum)).items():
        data = everyone((4, 6), np.float32, salt=50)
        want = adasum_reference(data).reshape(4, 6).astype(np.float32)
        assert_equal(fn(tf.constant(data[r])).numpy(), want, f"Adasum {mode}")
    x = tf.ones(3)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=hvd.Adasum)
    try:
        tape.gradient(y, x)
    except ValueError as err:
        assert "defined for op Sum and Average, not Adasum" in str(err), err
    else:
        raise AssertionError("an Adasum allreduce was differentiated")

    # DistributedOptimizer(op=Adasum): one SGD step applies the Adasum of the ranks' gradients.
    def mse(model, x, y):
        return keras.losses.MeanSquaredError()(y, model(x))

    def shard(i):
        rng = np.random.default_rng([60, i])
        return rng.normal(size=(3 + i, FEATURES)), rng.normal(size=(3 + i, OUTPUTS))

    model = mlp(11)
    start = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum), loss="mse"
    )
    per_rank = [own_gradients(model, *shard(i), mse) for i in range(n)]
    model.train_on_batch(*shard(r))
    for i, variable in enumerate(model.trainable_variables):
        want = start[i] - 0.1 * adasum_reference([g[i] for g in per_rank]).reshape(start[i].shape)
        got = variable.numpy().astype(np.float64)
        assert np.allclose(got, want, 1e-5, 1e-5), f"Adasum optimizer variable {i}"
        same_bits_everywhere(variable.numpy(), f"Adasum optimizer variable {i}")


def check_step_time_python_is_not_autograph_converted():
    # Autograph converts what a tf.function calls, and a closure defined in converted code
    # stays converted: its every call then goes through autograph's dispatch. The engine
    # calls made while a step runs must come from ringtrain's own code, as written.
    converted = []
    calls = []

    def recording(fn):
        def call(*args, **kwargs):
            calls.append(fn.__name__)
            files = [frame.filename for frame in traceback.extract_stack()]
            converted.extend(f for f in files if "__autograph_generated" in f)
            return fn(*args, **kwargs)

        return call

    originals = {k: getattr(ringtrain.api, k) for k in ("allreduce_async", "synchronize")}
    for name, fn in originals.items():
        setattr(ringtrain.api, name, recording(fn))
    try:
        model = embedding_model(1)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
        x = tf.constant(np.arange(6, dtype=np.int32).reshape(2, 3))

        @tf.function  # autograph on, as in Keras' own train step
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            grads = hvd.DistributedGradientTape(tape, sparse_as_dense=True).gradient(
                loss, model.trainable_variables
            )
            optimizer.apply(grads, model.trainable_variables)
            return hvd.allreduce(loss, name="step.loss")

        for _ in range(2):
            step()
    finally:
        for name, fn in originals.items():
            setattr(ringtrain.api, name, fn)
    assert "allreduce_async" in calls and "synchronize" in calls, calls
    assert not converted, f"autograph-converted code ran in a step: {sorted(set(converted))}"


def check_gradients_go_in_buckets():
    # 1 MiB buckets (as body() sets): the first layer's 512 -> 512 kernel is 1 MiB and goes
    # alone; the seven smaller gradients after it in backprop order (the last layer's
    # first) share one run. Two enqueue ops, not eight; none in a job of one rank, which
    # exchanges nothing (as Horovod's tape).
    assert ringtrain.api.active_settings().bucket_bytes == 1024 * 1024
    keras.utils.set_random_seed(2)
    layers = [keras.layers.Dense(512), *(keras.layers.Dense(64) for _ in range(3))]
    model = keras.Sequential([keras.Input((512,)), *layers])
    r, n = hvd.rank(), hvd.size()
    xs = [np.random.default_rng(k).normal(size=(4, 512)).astype(np.float32) for k in range(n)]

    def local(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x)))
        return tape, loss

    @tf.function
    def reduced(x):
        tape, loss = local(x)
        return hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)

    graph = reduced.get_concrete_function(tf.constant(xs[r])).graph
    enqueues = [op for op in graph.get_operations() if op.name.startswith("rt_enqueue")]
    assert len(enqueues) == (2 if n > 1 else 0), [op.name for op in enqueues]
    everyone_grads = []
    for x in xs:
        tape, loss = local(x)
        everyone_grads.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
    got = reduced(tf.constant(xs[r]))
    for k, g in enumerate(got):
        want = np.mean([grads[k] for grads in everyone_grads], axis=0)
        assert np.allclose(g.numpy(), want, rtol=1e-5, atol=1e-5), k


def check_ops_hand_tensors_over_as_the_setting_says():
    # RINGTRAIN_TF_DLPACK=1 (test_tf.py) runs every check of this script through DLPack;
    # by default, tf.numpy_function carries them where TensorFlow sees no GPU.
    setting = os.environ.get("RINGTRAIN_TF_DLPACK")
    gpu = bool(tf.config.list_physical_devices("GPU"))
    through = gpu if setting is None else setting == "1"
    assert bridge.through_dlpack() is through, bridge.through_dlpack()
    model = mlp(0)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        return hvd.allreduce(x, op=hvd.Sum, name="handed over"), grads

    x = tf.constant(rank_data(hvd.rank(), (2, FEATURES), np.float32))
    graph = step.get_concrete_function(x).graph
    kinds = {op.type for op in graph.get_operations()}
    want, other = ("EagerPyFunc", "PyFunc") if through else ("PyFunc", "EagerPyFunc")
    assert want in kinds and other not in kinds, sorted(kinds)
    got, _ = step(x)
    everyone = [rank_data(i, (2, FEATURES), np.float32) for i in range(hvd.size())]
    assert_equal(got.numpy(), expected(hvd.Sum, everyone, np.float32), "handed over")


def body():
    hvd.init(bucket_bytes=1024 * 1024)  # the other scripts run with the default
    for check in (
        check_allreduce,
        check_results_survive_ops_on_their_slices,
        check_grouped_allreduce,
        check_horovod_keras_values,
        check_allgather_broadcast_alltoall_reducescatter,
        check_gradients,
        check_grouped_allgather_and_reducescatter,
        check_gradients_go_in_buckets,
        check_sparse_and_tape,
        check_sparse_optimizer,
        check_broadcast_variables,
        check_mismatches,
        check_adasum,
        check_step_time_python_is_not_autograph_converted,
        check_ops_hand_tensors_over_as_the_setting_says,
    ):
        check()
        print(f"rank {hvd.rank()}: {check.__name__} OK", flush=True)
    hvd.shutdown()


main(body)
