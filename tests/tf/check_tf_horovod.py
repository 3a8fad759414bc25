"""Horovod's semantics on tf.Tensors: gradients, alltoall, dtypes, error types, scale factors.

Each check compares against NumPy answers from every rank's data; Horovod's
horovod/tensorflow/mpi_ops.py and __init__.py define what the answers are. Runs at -np 2 and 3.
"""

import numpy as np
from common import assert_equal, expected, main, rank_data
from tfsetup import configure

configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain  # noqa: E402
import ringtrain.tensorflow as hvd  # noqa: E402


def modes(fn):
    """Return ``fn`` eagerly and as a tf.function."""
    return {"eager": fn, "tf.function": tf.function(fn)}


def segments(rows):
    """Return, for the matrix ``rows[k][j]`` (rows rank k sends to rank j), each k's offsets."""
    return [np.concatenate(([0], np.cumsum(r))) for r in rows]


def received(data, rows, j):
    """Return what rank j receives from every rank's ``data`` sent by ``rows``."""
    offsets = segments(rows)
    return np.concatenate([data[k][offsets[k][j] : offsets[k][j + 1]] for k in range(len(data))])


def check_gradients():
    r, n = hvd.rank(), hvd.size()
    c = [rank_data(k, (4,), np.float32, salt=5) for k in range(n)]
    rows = [[(k + j) % 3 + 1 for j in range(n)] for k in range(n)]
    a2a = [rank_data(k, (sum(rows[k]), 2), np.float32, salt=6) for k in range(n)]
    a2a_w = [rank_data(j, (sum(rows[k][j] for k in range(n)), 2), np.float32, 7) for j in range(n)]
    rs = [rank_data(k, (2 * n + 1, 3), np.float32, salt=8) for k in range(n)]
    shares = [np.array_split(np.arange(2 * n + 1), n)[j] for j in range(n)]
    rs_w = [rank_data(j, (len(shares[j]), 3), np.float32, salt=9) for j in range(n)]
    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):

        @wrap
        def grads(x, c_mine, y, splits, y_w, z, z_w):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch([x, y, z])
                weights = tf.tile(c_mine, [n])[: n * (n + 1) // 2]
                out, got_splits = hvd.alltoall(y, splits, name="g.a2a")
                losses = {
                    "bcast": tf.reduce_sum(hvd.broadcast(x, n - 1, name="g.bcast") * c_mine),
                    "gather": tf.reduce_sum(hvd.allgather(x[: r + 1], name="g.gather") * weights),
                    "ggather": sum(
                        tf.reduce_sum(g * weights)
                        for g in hvd.grouped_allgather([x[: r + 1], 2.0 * x[: r + 1]], name="gg")
                    ),
                    "a2a": tf.reduce_sum(out * y_w),
                    "rs_sum": tf.reduce_sum(hvd.reducescatter(z, op=hvd.Sum, name="rs.s") * z_w),
                    "rs_avg": tf.reduce_sum(hvd.reducescatter(z, name="rs.a") * z_w),
                    "grs": sum(
                        tf.reduce_sum(s * z_w)
                        for s in hvd.grouped_reducescatter([z, 3.0 * z], op=hvd.Sum, name="grs")
                    ),
                }
            sources = {"a2a": y, "rs_sum": z, "rs_avg": z, "grs": z}
            return {k: tape.gradient(v, sources.get(k, x)) for k, v in losses.items()}, got_splits

        got, got_splits = grads(
            tf.constant(rank_data(r, (4,), np.float32)),
            tf.constant(c[r]),
            tf.constant(a2a[r]),
            tf.constant(rows[r], tf.int32),
            tf.constant(a2a_w[r]),
            tf.constant(rs[r]),
            tf.constant(rs_w[r]),
        )
        assert got_splits.dtype == tf.int32
        assert_equal(
            got_splits.numpy(), np.array([rows[k][r] for k in range(n)], np.int32), "splits"
        )
        mean = np.mean(c, axis=0)
        want = mean if r == n - 1 else np.zeros(4)
        assert np.allclose(got["bcast"], want), f"broadcast gradient {mode}: Average on the root"
        tiled = [np.tile(ck, n)[: n * (n + 1) // 2] for ck in c]
        first = r * (r + 1) // 2
        want = np.zeros(4, np.float32)
        want[: r + 1] = np.mean(tiled, axis=0)[first : first + r + 1]
        assert np.allclose(got["gather"], want), f"allgather gradient {mode}: {got['gather']}"
        assert np.allclose(got["ggather"], 3 * want), f"grouped_allgather gradient {mode}"
        # The rows rank r sent to rank j come back with rank j's weights for them.
        back = []
        for j in range(n):
            start = sum(rows[k][j] for k in range(r))
            back.append(a2a_w[j][start : start + rows[r][j]])
        assert np.allclose(got["a2a"], np.concatenate(back)), f"alltoall gradient {mode}"
        gathered = np.concatenate(rs_w)
        assert np.allclose(got["rs_sum"], n * gathered), f"reducescatter Sum gradient {mode}"
        assert np.allclose(got["rs_avg"], gathered), f"reducescatter Average gradient {mode}"
        assert np.allclose(got["grs"], 4 * n * gathered), f"grouped_reducescatter gradient {mode}"
    # Without splits, the gradient sends the rows back by the splits the forward pass used.
    x = tf.constant(rank_data(r, (2 * n, 3), np.float32, salt=10))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.alltoall(x, name="g.even")
    assert isinstance(y, tf.Tensor), type(y)
    grad = tape.gradient(y, x, output_gradients=tf.ones_like(y) * (r + 1))
    want = np.repeat(np.arange(1, n + 1, dtype=np.float32), 2)[:, None] * np.ones((1, 3))
    assert np.allclose(grad, want), f"alltoall gradient without splits: {grad}"


def expect_raises(kind, fn, *needles):
    """Run ``fn``; require an error of class ``kind`` whose message holds every needle."""
    try:
        fn()
    except kind as err:
        missing = [needle for needle in needles if needle not in str(err)]
        assert not missing, f"error lacks {missing}: {err}"
        return err
    except Exception as err:
        raise AssertionError(f"expected {kind.__name__}, got {type(err).__name__}: {err}") from err
    raise AssertionError(f"expected {kind.__name__} mentioning {needles}")


def check_alltoall():
    r, n = hvd.rank(), hvd.size()
    rows = [[(k * j + 1) % 3 for j in range(n)] for k in range(n)]
    data = [rank_data(k, (sum(rows[k]), 2), np.int64, salt=20) for k in range(n)]
    for mode, fn in modes(lambda x, s: hvd.alltoall(x, splits=s)).items():
        out, splits = fn(tf.constant(data[r]), tf.constant(rows[r]))
        assert_equal(out.numpy(), received(data, rows, r), f"alltoall {mode}")
        assert_equal(splits.numpy(), np.array([rows[k][r] for k in range(n)], np.int32), mode)
    bad = {
        "splits adding up to too few rows": (np.ones((n + 1, 2), np.float32), [1] * n),
        "too few splits": (np.ones((n, 2), np.float32), [1] * (n - 1)),
        "rows that do not divide": (np.ones((n + 1, 2), np.float32), None),
    }
    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):
        for what, (x, splits) in bad.items():
            args = (x,) if splits is None else (x, splits)
            err = expect_raises(
                tf.errors.InvalidArgumentError,
                lambda args=args, wrap=wrap: wrap(hvd.alltoall)(*args),
            )
            assert "alltoall" in str(err), f"{what}: {err}"
            if mode == "eager":
                assert isinstance(err, ValueError), f"{what}: {type(err)}"
    expect_raises(
        tf.errors.InvalidArgumentError,
        lambda: hvd.alltoall(tf.ones([n, 2]), tf.ones([n], tf.float32)),
        "must be integers",
    )
    # The errors left nothing in flight: the next unnamed alltoall pairs up.
    out = hvd.alltoall(tf.fill([n, 1], r))
    assert_equal(out.numpy().ravel(), np.arange(n, dtype=np.int32), "alltoall after errors")


def check_dtypes():
    r, n = hvd.rank(), hvd.size()
    for dtype in (np.uint16, np.int16, np.bool_):
        everyone = [
            (rank_data(k, (k + 1, 3), np.int32, salt=30) % 7).astype(dtype) for k in range(n)
        ]
        for mode, gather in modes(lambda x: hvd.allgather(x)).items():
            got = gather(tf.constant(everyone[r])).numpy()
            assert got.dtype == np.dtype(dtype), (mode, got.dtype)
            assert_equal(got, np.concatenate(everyone), f"allgather {mode} {dtype}")
        for mode, bcast in modes(lambda x: hvd.broadcast(x, n - 1)).items():
            got = bcast(tf.constant(everyone[r][:1])).numpy()
            assert_equal(got, everyone[n - 1][:1], f"broadcast {mode} {dtype}")
        rows = [[k + 1] * n for k in range(n)]
        sent = [
            (rank_data(k, (n * (k + 1),), np.int32, salt=31) % 5).astype(dtype) for k in range(n)
        ]
        for mode, fn in modes(lambda x, s: hvd.alltoall(x, s)).items():
            out, _ = fn(tf.constant(sent[r]), tf.constant(rows[r]))
            assert out.dtype == tf.as_dtype(dtype)
            assert_equal(out.numpy(), received(sent, rows, r), f"alltoall {mode} {dtype}")
    ints = [rank_data(k, (k + 2,), np.int16, salt=32) for k in range(n)]
    floats = [rank_data(k, (k % 2, 2), np.float32, salt=33) for k in range(n)]
    got = hvd.grouped_allgather([tf.constant(ints[r]), tf.constant(floats[r])])
    assert_equal(got[0].numpy(), np.concatenate(ints), "grouped_allgather int16")
    assert_equal(got[1].numpy(), np.concatenate(floats), "grouped_allgather float32")


def check_error_types():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        return
    cases = {
        "shape": lambda: hvd.allreduce(tf.zeros([2 + r]), name="mm.shape"),
        "dtype": lambda: hvd.broadcast(tf.zeros([3], tf.int32 if r % 2 else tf.float32), 0),
        "root": lambda: hvd.broadcast(tf.ones([3]), r, name="mm.root"),
        "alltoall dtype": lambda: hvd.alltoall(tf.ones([n], tf.int32 if r else tf.float32)),
    }
    for what, call in cases.items():
        err = expect_raises(tf.errors.FailedPreconditionError, call)
        assert isinstance(err, ringtrain.MismatchError), f"{what}: {type(err).__mro__}"
        assert isinstance(err, hvd.MismatchError), what
        # Keras remakes an OpError with TensorFlow's arguments to add to its message.
        again = type(err)(err.node_def, err.op, f"layer: {err.message}", err.error_code)
        assert isinstance(again, ringtrain.MismatchError) and str(again).startswith("layer: ")
    # Inside tf.function TensorFlow raises its own class for the op's failure; the message
    # still names the mismatch.
    err = expect_raises(
        tf.errors.OpError,
        tf.function(lambda: hvd.allreduce(tf.zeros([2 + r]), name="mm.function")),
        "MismatchError",
    )
    same = hvd.allreduce(tf.fill([2], float(r)), op=hvd.Sum, name="mm.after")
    assert_equal(same.numpy(), np.full(2, n * (n - 1) / 2, np.float32), "allreduce after errors")


def truncated(x, factor):
    return np.trunc(np.asarray(x, np.float64) * factor)


def check_scale_factors():
    r, n = hvd.rank(), hvd.size()
    pre, post = 0.37, 1.7
    for dtype in (np.int32, np.int64, np.uint8):
        data = [
            rank_data(k, (5, 3), dtype, salt=40) * (7 if dtype != np.uint8 else 1) for k in range(n)
        ]
        summed = np.sum([truncated(d, pre) for d in data], axis=0)

        def scaled(x, op):
            return hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)

        for mode, fn in modes(scaled).items():
            got = fn(tf.constant(data[r]), hvd.Sum).numpy()
            assert_equal(got, truncated(summed, post).astype(dtype), f"Sum {mode} {dtype}")
            got = fn(tf.constant(data[r]), hvd.Average).numpy()
            want = truncated(summed, post / n).astype(dtype)
            assert_equal(got, want, f"Average {mode} {dtype}")
        got = hvd.allreduce(tf.constant(data[r]), op=hvd.Max, postscale_factor=post).numpy()
        want = truncated(expected(hvd.Max, data, dtype), post).astype(dtype)
        assert_equal(got, want, f"Max postscaled {dtype}")
    data = [rank_data(k, (2 * n + 1, 2), np.int64, salt=41) * 9 for k in range(n)]
    share = np.array_split(np.arange(2 * n + 1), n)[r]
    summed = np.sum([truncated(d, pre) for d in data], axis=0)
    got = hvd.reducescatter(tf.constant(data[r]), op=hvd.Sum, prescale_factor=pre)
    assert_equal(got.numpy(), summed[share].astype(np.int64), "reducescatter prescaled")
    got = hvd.grouped_reducescatter(
        [tf.constant(data[r]), tf.constant(2 * data[r])], op=hvd.Average, postscale_factor=post
    )
    for k, g in enumerate(got):
        want = truncated(np.sum(data, axis=0) * (k + 1), post / n)[share]
        assert_equal(g.numpy(), want.astype(np.int64), f"grouped_reducescatter Average {k}")
    sparse = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 1]), tf.constant([4, 3]))
    expect_raises(NotImplementedError, lambda: hvd.allreduce(sparse, prescale_factor=2.0))
    expect_raises(NotImplementedError, lambda: hvd.allreduce(sparse, postscale_factor=0.5))
    for op in (hvd.Min, hvd.Max, hvd.Adasum):
        expect_raises(NotImplementedError, lambda op=op: hvd.allreduce(sparse, op=op), op.name)
    expect_raises(NotImplementedError, lambda: hvd.grouped_allreduce([sparse], op=hvd.Max))


def check_grouped_allreduce():
    r, n = hvd.rank(), hvd.size()
    dense = [rank_data(k, (3, 4), np.float32, salt=50) for k in range(n)]
    values = [rank_data(k, (2, 4), np.float32, salt=51) for k in range(n)]
    indices = [np.array([k % 3, 2]) for k in range(n)]

    def as_dense(k):
        out = np.zeros((3, 4), np.float32)
        np.add.at(out, indices[k], values[k])
        return out

    sparse_sum = np.sum([as_dense(k) for k in range(n)], axis=0)

    def mixed(d, v, i, average):
        sparse = tf.IndexedSlices(v, i, tf.constant([3, 4]))
        return hvd.grouped_allreduce([d, sparse, 2.0 * d], average=average)

    for mode, fn in modes(mixed).items():
        for average in (True, False):
            got = fn(
                tf.constant(dense[r]), tf.constant(values[r]), tf.constant(indices[r]), average
            )
            scale = 1.0 / n if average else 1.0
            assert isinstance(got[1], tf.IndexedSlices), type(got[1])
            assert np.allclose(got[0], np.sum(dense, axis=0) * scale, atol=1e-5), (mode, average)
            assert np.allclose(tf.convert_to_tensor(got[1]), sparse_sum * scale, atol=1e-5)
            assert np.allclose(got[2], 2 * np.sum(dense, axis=0) * scale, atol=1e-5)
    only = hvd.grouped_allreduce(
        [tf.IndexedSlices(values[r], indices[r], tf.constant([3, 4]))], op=hvd.Sum
    )
    assert np.allclose(tf.convert_to_tensor(only[0]), sparse_sum, atol=1e-5), "sparse alone"


def check_missing_api():
    r, n = hvd.rank(), hvd.size()
    variables = [tf.Variable(rank_data(r, (2, 3), np.float32)), tf.Variable(r, dtype=tf.int64)]
    values = hvd.broadcast_(variables, n - 1)
    assert_equal(variables[0].numpy(), rank_data(n - 1, (2, 3), np.float32), "broadcast_")
    assert int(variables[1].numpy()) == n - 1 and int(values[1]) == n - 1
    assert_equal(values[0].numpy(), variables[0].numpy(), "broadcast_ returns the values")
    expect_raises(RuntimeError, lambda: hvd.broadcast_global_variables(0), "eager")
    import ringtrain.tensorflow.keras as hk

    expect_raises(RuntimeError, lambda: hk.broadcast_global_variables(0), "eager")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    for v in model.variables:
        v.assign(tf.fill(v.shape, float(r + 1)))
    local = model.layers[1].kernel
    callback = hk.callbacks.BroadcastGlobalVariablesCallback(0, device="", local_variables=local)
    callback.set_model(model)
    callback.on_train_begin()
    for v in model.variables:
        want = float(r + 1) if v is local else 1.0
        assert np.all(v.numpy() == want), (v.path, v.numpy(), want)
    # Horovod's keywords are accepted.
    x = tf.constant(rank_data(r, (4, 2), np.float32, salt=60))
    hvd.allreduce(x, device_dense="/cpu:0", device_sparse="", ignore_name_scope=True)
    hvd.grouped_allreduce([x], device_dense="", device_sparse="", ignore_name_scope=True)
    hvd.allgather(x, ignore_name_scope=True)
    hvd.grouped_allgather([x], ignore_name_scope=True)
    hvd.broadcast(x, 0, ignore_name_scope=True)
    hvd.alltoall(tf.ones([n, 2]), ignore_name_scope=True)
    got = hvd.reducescatter(
        x, op=hvd.Sum, device_dense="", compression=hvd.Compression.fp16, ignore_name_scope=True
    )
    assert got.dtype == tf.float32
    hvd.grouped_reducescatter([x], device_dense="", compression=hvd.Compression.none)
    hvd.broadcast_variables(variables, 0, inplace=True)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x[:, :1] * tf.ones([1, 3])))
    tape = hvd.DistributedGradientTape(
        tape, device_dense="", device_sparse="", num_groups=2, groups=None
    )
    assert len(tape.gradient(loss, model.trainable_variables)) == 4
    hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1), device_dense="", device_sparse="", use_locking=False, groups=2
    )
    expect_raises(
        ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=0), "groups"
    )


def check_graph_mode():
    """In a TensorFlow 1 graph run by a Session: broadcast_'s values and the broadcast gradient."""
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        variable = tf.Variable(rank_data(r, (2, 3), np.float32, salt=70))
        session.run(variable.initializer)
        (value,) = session.run(hvd.broadcast_([variable], root, name="graph.broadcast_"))
        assert_equal(value, rank_data(root, (2, 3), np.float32, salt=70), "graph broadcast_")
        assert_equal(session.run(variable), value, "graph broadcast_ assigns the variable")
        # Only the root's gradient uses the Average, but every rank must take part in it.
        x = tf.constant(rank_data(r, (4,), np.float32, salt=71))
        dy = tf.constant(rank_data(r, (4,), np.float32, salt=72))
        (grad,) = tf.gradients(hvd.broadcast(x, root, name="graph.broadcast"), x, dy)
        mean = np.mean([rank_data(k, (4,), np.float32, salt=72) for k in range(n)], axis=0)
        want = mean if r == root else np.zeros(4, np.float32)
        assert_equal(session.run(grad), want, "graph broadcast gradient")


def body():
    hvd.init()
    for check in (
        check_gradients,
        check_alltoall,
        check_dtypes,
        check_error_types,
        check_scale_factors,
        check_grouped_allreduce,
        check_missing_api,
        check_graph_mode,
    ):
        check()
        print(f"rank {hvd.rank()}: {check.__name__} OK", flush=True)
    hvd.shutdown()


main(body)
