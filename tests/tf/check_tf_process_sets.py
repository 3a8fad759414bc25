"""The TensorFlow collectives and training over process sets, against NumPy.

Even and odd ranks form two sets. Every collective, its gradient, the tape and the
optimizer run over this rank's set, with rank-distinct data, and are compared with NumPy's
answer over that set's ranks only. Calls over the whole job interleave with them inside
one tf.function, where only the odd ranks reduce over their set first. Over a set of one
rank (or a job of one), the tape and the optimizer hand nothing to the engine, as Horovod's.
"""

import numpy as np
from common import main
from tfsetup import FEATURES, OUTPUTS, configure, hand_over_ops, mlp, own_gradients, sum_loss

configure()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ringtrain.tensorflow as hvd  # noqa: E402
import ringtrain.tensorflow.keras as hk  # noqa: E402


def data(r, shape, salt):
    return np.random.default_rng([salt, r]).normal(size=shape).astype(np.float32)


def batch(r, salt):
    n = (4, 1, 0, 6)[r % 4]
    return data(r, (n, FEATURES), salt), data(r, (n, OUTPUTS), salt + 1)


def close(got, want, what, tol=1e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape}, expected {np.shape(want)}"
    if not np.allclose(got, want, rtol=tol, atol=tol):
        raise AssertionError(f"{what}: differs by up to {np.max(np.abs(got - want))}")


def check_collectives(mine, r):
    members = mine.ranks
    k = members.index(r)
    xs = [data(i, (5, 3), 1) for i in members]
    for compiled in (False, True):

        def reduce_and_grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
                loss = tf.reduce_sum(y * (1.0 + tf.cast(hvd.rank(), tf.float32)))
            return y, tape.gradient(loss, x)

        run = tf.function(reduce_and_grad) if compiled else reduce_and_grad
        y, dx = run(tf.constant(xs[k]))
        close(y, np.sum(xs, axis=0), f"allreduce (tf.function {compiled})")
        # d/dx of the set's summed losses: every member's weight 1 + rank, summed.
        close(dx, np.full((5, 3), sum(1.0 + i for i in members)), "allreduce gradient")

    # Allgather of uneven rows (rank i gives i % 3) and its gradient: this member's rows.
    rows = [data(i, (i % 3, 2), 2) for i in members]
    x = tf.constant(rows[k])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allgather(x, process_set=mine)
        weights = tf.range(tf.shape(y)[0] * 2, dtype=tf.float32)
        loss = tf.reduce_sum(tf.reshape(y, [-1]) * weights)
    close(y, np.concatenate(rows), "allgather")
    first = sum(i % 3 for i in members[:k])
    weight = np.arange(2 * sum(i % 3 for i in members), dtype=np.float64).reshape(-1, 2)
    close(tape.gradient(loss, x), weight[first : first + r % 3], "allgather grad (the Average)")

    for root in members:
        got = hvd.broadcast(tf.constant(data(r, (4,), 3)), root, process_set=mine)
        close(got, data(root, (4,), 3), f"broadcast from {root}")
    variable = tf.Variable(data(r, (3, 2), 4))
    hvd.broadcast_variables([variable], root_rank=members[-1], process_set=mine)
    close(variable.numpy(), data(members[-1], (3, 2), 4), "broadcast_variables")

    got = hvd.grouped_allreduce(
        [tf.constant(xs[k]), tf.constant(2 * xs[k])], op=hvd.Average, process_set=mine
    )
    close(got[1], 2 * np.mean(xs, axis=0), "grouped_allreduce")
    got = hvd.reducescatter(tf.constant(xs[k]), op=hvd.Sum, process_set=mine)
    bounds = np.array_split(np.arange(5), len(members))[k]
    close(got, np.sum(xs, axis=0)[bounds], "reducescatter")
    got = hvd.alltoall(tf.constant(np.full((len(members), 2), r, np.float32)), process_set=mine)
    close(got, np.array(members, np.float64)[:, None] * np.ones((1, 2)), "alltoall")

    # A sparse gradient averaged over the set: values divided by the set's size.
    sparse = tf.IndexedSlices(tf.constant(data(r, (2, 3), 5)), tf.constant([r % 4, 0]), [4, 3])
    got = tf.convert_to_tensor(hvd.allreduce(sparse, op=hvd.Average, process_set=mine))
    want = np.zeros((4, 3))
    for i in members:
        np.add.at(want, [i % 4, 0], data(i, (2, 3), 5) / len(members))
    close(got, want, "sparse allreduce")


def check_tape(mine, r):
    model = mlp(7)
    hidden = model.layers[1]
    local = [any(v is w for w in hidden.trainable_weights) for v in model.trainable_variables]
    per_rank = {i: own_gradients(model, *batch(i, 10)) for i in mine.ranks}
    x, y = batch(r, 10)
    for compiled in (False, True):

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = sum_loss(model, x, y)
            tape = hvd.PartialDistributedGradientTape(tape, local_layers=[hidden], process_set=mine)
            return tape.gradient(loss, model.trainable_variables)

        got = (tf.function(step) if compiled else step)(x, y)
        for i, g in enumerate(got):
            if local[i]:
                want = per_rank[r][i] / len(mine.ranks)
            else:
                want = np.mean([per_rank[j][i] for j in mine.ranks], axis=0)
            close(tf.convert_to_tensor(g), want, f"tape variable {i} (tf.function {compiled})")


def check_interleaved(sets, mine, r, n):
    """Only the odd ranks reduce over their set before a reduction of the whole job."""
    model = mlp(8)
    x, y = batch(r, 20)
    odd = len(sets) > 1 and mine is sets[1]

    @tf.function
    def step(x, y):
        grads = None
        if odd:
            with tf.GradientTape() as tape:
                loss = sum_loss(model, x, y)
            grads = hvd.DistributedGradientTape(tape, process_set=mine).gradient(
                loss, model.trainable_variables
            )
        with tf.GradientTape() as tape:
            loss = sum_loss(model, x, y)
        return grads, hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)

    in_set, everyone = step(x, y)
    per_rank = [own_gradients(model, *batch(i, 20)) for i in range(n)]
    for i, g in enumerate(everyone):
        close(g, np.mean([p[i] for p in per_rank], axis=0), f"whole job variable {i}")
    if odd:
        for i, g in enumerate(in_set):
            close(g, np.mean([per_rank[j][i] for j in mine.ranks], axis=0), f"set variable {i}")


def check_optimizer(sets, mine, r):
    rows = (4, 1, 3, 6)  # Keras's mean loss needs a row on every rank

    def mse(model, x, y):
        return keras.losses.MeanSquaredError()(y, model(x))

    def shard(i):
        return data(i, (rows[i % 4], FEATURES), 30), data(i, (rows[i % 4], OUTPUTS), 31)

    # Only the even ranks train, so every exchange of theirs, the loss scale's agreement on
    # finite gradients too, must stay within their set: else they would wait for the others.
    for wrap_loss_scale in (False, True) if mine is sets[0] else ():
        model = mlp(9)
        start = [v.numpy().astype(np.float64) for v in model.trainable_variables]
        optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=mine)
        config = optimizer.get_config()
        assert config["ringtrain"]["process_set"] == mine.ranks, config
        if len(mine.ranks) < hvd.size():
            rebuilt = type(optimizer).from_config(config)
            assert rebuilt._rt_reduction.process_set is mine
        if wrap_loss_scale:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss="mse")
        per_rank = [own_gradients(model, *shard(i), mse) for i in mine.ranks]
        model.train_on_batch(*shard(r))
        for i, v in enumerate(model.trainable_variables):
            want = start[i] - 0.1 * np.mean([p[i] for p in per_rank], axis=0)
            close(v.numpy(), want, f"optimizer variable {i} (loss scale {wrap_loss_scale})")


def check_alone(mine, n):
    """Check that the tape and the optimizer exchange nothing over one rank, but do over more."""
    model = mlp(11)
    variables = model.trainable_variables
    x, y = batch(hvd.rank(), 40)
    for process_set, ranks in ((None, n), (mine, len(mine.ranks))):
        inner = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=process_set)
        optimizer = keras.optimizers.LossScaleOptimizer(inner)  # its finite check agrees too
        optimizer.build(variables)

        def taped(x, y, process_set=process_set):
            with tf.GradientTape() as tape:
                loss = sum_loss(model, x, y)
            tape = hvd.DistributedGradientTape(tape, process_set=process_set)
            return tape.gradient(loss, variables)

        def applied(x, y, optimizer=optimizer):
            with tf.GradientTape() as tape:
                loss = sum_loss(model, x, y)
            optimizer.apply(tape.gradient(loss, variables), variables)

        for step in (taped, applied):
            found = hand_over_ops(step, x, y)
            assert (found == 0) == (ranks == 1), f"{step.__name__} over {ranks}: {found} ops"


def body():
    from mpi4py import MPI

    n, r = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    groups = [list(range(0, n, 2)), list(range(1, n, 2))] if n > 1 else [[0]]
    sets = [hvd.ProcessSet(g) for g in groups]
    hvd.init(process_sets=sets)
    mine = next(s for s in sets if r in s.ranks)
    for s in sets:
        assert int(hvd.size_op(s.process_set_id)) == len(s.ranks)
        assert int(hvd.process_set_included_op(s.process_set_id)) == int(s is mine)
    assert int(hvd.size_op()) == n and int(hvd.process_set_included_op()) == 1
    for check in (
        lambda: check_collectives(mine, r),
        lambda: check_tape(mine, r),
        lambda: check_interleaved(sets, mine, r, n),
        lambda: check_optimizer(sets, mine, r),
        lambda: check_alone(mine, n),
    ):
        check()
    try:
        hk.DistributedOptimizer(keras.optimizers.SGD(), process_set=[n + 5])
    except ValueError as err:
        assert f"no process set of ranks [{n + 5}] is registered" in str(err), err
    else:
        raise AssertionError("an optimizer over unregistered ranks was built")
    print(f"rank {r}: process sets OK", flush=True)
    hvd.shutdown()


main(body)
