"""The NumPy-level collectives on tf.Tensors, eagerly and inside ``tf.function``.

Gradients are Horovod's (horovod/tensorflow/mpi_ops.py), so a ported model's gradients keep
their scale. The gradient of an allreduce is the same allreduce (op and scale factors) of the
incoming gradients; that of an allgather is this rank's rows of their Average; that of a
broadcast is their Average on the root and zero elsewhere; that of an alltoall sends the
incoming rows back where they came from; that of a reducescatter is the allgather of the
incoming shares, times the number of ranks for op Sum. Every rank must take the same
gradients, since they are collectives too.

Each collective runs over ``process_set`` (a registered ``ringtrain.ProcessSet``; None: every
rank), and so do its gradients. ``ignore_name_scope``, ``device_dense`` and ``device_sparse``
are Horovod's and have no effect: names here never take TensorFlow's name scopes, and every
exchange runs on the host.
"""

import functools

import numpy as np
import tensorflow as tf

from ringtrain import api
from ringtrain.keras.labels import variable_label
from ringtrain.ops import Average, ReduceOp, Sum, as_reduce_op, resolve_op
from ringtrain.process_sets import resolve
from ringtrain.tensorflow import bridge, errors, exchange
from ringtrain.tensorflow.compression import Compression, around_reduction, for_engine


def _grad_name(name, what="grad"):
    return f"{name}.{what}"


def _rows_unknown(shape):
    return tf.TensorShape([None]).concatenate(shape[1:])


def _at_least_1d(tensor, what):
    if tensor.shape.rank == 0:
        raise ValueError(f"{what} needs a tensor of at least one dimension; got a scalar")


def _check_differentiable(op, what):
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise ValueError(f"the gradient of {what} is defined for op Sum and Average, not {op.name}")


def _differentiable(tensor):
    return tensor.dtype.is_floating or tensor.dtype.is_complex


def _scale_truncating(tensor, factor):
    """Return integer ``tensor`` times ``factor``, in float64 and cut toward zero, as Horovod."""
    if isinstance(factor, int | float) and factor == 1.0:
        return tensor
    return tf.cast(tf.cast(tensor, tf.float64) * tf.cast(factor, tf.float64), tensor.dtype)


def _integer_scaling(tensors, op, prescale, postscale, process_set):
    """Return how a reduction of integer ``tensors`` applies scale factors as Horovod does.

    Horovod scales integers in float64 and truncates toward zero, before and after a Sum (an
    Average is a Sum whose postscale is divided by the number of ranks). The engine takes no
    scale factors for integers, so they are applied here: the result is (tensors prescaled,
    op, 1.0, 1.0, a function that postscales a result). Other tensors pass through.
    """
    plain = isinstance(prescale, int | float) and isinstance(postscale, int | float)
    if not tensors[0].dtype.is_integer or (plain and prescale == postscale == 1.0):
        return tensors, op, prescale, postscale, lambda result: result
    if op == ReduceOp.Average:
        op, postscale = Sum, postscale / resolve(process_set).size()
    tensors = [_scale_truncating(t, prescale) for t in tensors]
    return tensors, op, 1.0, 1.0, lambda result: _scale_truncating(result, postscale)


def _check_sparse(op, prescale, postscale):
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise NotImplementedError(
            f"tf.IndexedSlices are allreduced by allgather, for op Sum and Average only, not "
            f"{op.name}; convert them with tf.convert_to_tensor to reduce them densely"
        )
    if not (prescale == 1.0 and postscale == 1.0):
        raise NotImplementedError(
            "prescale_factor and postscale_factor are not supported with tf.IndexedSlices"
        )


def allreduce(
    tensor,
    op=None,
    compression=Compression.none,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    average=None,
    process_set=None,
    device_dense="",
    device_sparse="",
    ignore_name_scope=False,
):
    """Return ``tensor`` reduced over all ranks (default op Average); same shape and dtype.

    A ``tf.IndexedSlices`` is allgathered (values and indices) instead, for op Sum or
    Average without scale factors (NotImplementedError otherwise, as in Horovod). Integer
    tensors take scale factors as in Horovod (float64, truncated toward zero). Unnamed calls
    are named as ``exchange.call_name`` says. ``average`` is Horovod's older flag for op
    (True: Average, False: Sum).
    """
    op = resolve_op(op, average)
    name = exchange.call_name(name, "allreduce", process_set)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        return exchange.allreduce_gradients(
            [tensor], ["tensor"], name, op=op, compression=compression, process_set=process_set
        )[0]
    outside = around_reduction(compression)
    wire, ctx = outside.compress(tf.convert_to_tensor(tensor))
    (wire,), op, prescale, postscale, finish = _integer_scaling(
        [wire], op, prescale_factor, postscale_factor, process_set
    )
    engine = for_engine(compression)
    reduced = _allreduce(wire, op, prescale, postscale, name, process_set, engine)
    return outside.decompress(finish(reduced), ctx)


def _allreduce(tensor, op, prescale, postscale, name, process_set, compression=None):
    @tf.custom_gradient
    def forward(x):
        start = functools.partial(
            api.allreduce_async,
            name=name,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
            compression=compression,
        )  # never a shared result: see exchange.allreduce_gradients
        y = bridge.run(start, [x], x.dtype, "allreduce")
        y.set_shape(x.shape)

        def grad(dy):
            _check_differentiable(op, "allreduce")
            grad_name = _grad_name(name)
            return _allreduce(dy, op, prescale, postscale, grad_name, process_set, compression)

        return y, grad

    return forward(tensor)


def grouped_allreduce(
    tensors,
    op=None,
    compression=Compression.none,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=None,
    average=None,
    device_dense="",
    device_sparse="",
    ignore_name_scope=False,
):
    """Return ``tensors`` reduced over all ranks as one group (fused together), in order.

    The dense tensors (of one dtype) go as one group; ``tf.IndexedSlices`` among them are
    allgathered together, as ``allreduce`` does with one.
    """
    op = resolve_op(op, average)
    if not tensors:
        return []
    name = exchange.call_name(name, "grouped_allreduce", process_set)
    results = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(op, prescale_factor, postscale_factor)
        reduced = exchange.allreduce_gradients(
            [tensors[i] for i in sparse],
            [f"tensor {i}" for i in sparse],
            _grad_name(name, "sparse"),
            op=op,
            compression=compression,
            process_set=process_set,
        )
        results = _placed(results, sparse, reduced)
    if dense:
        outside = around_reduction(compression)
        compressed = [outside.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        wires, group_op, prescale, postscale, finish = _integer_scaling(
            [wire for wire, _ in compressed], op, prescale_factor, postscale_factor, process_set
        )
        outputs = _grouped_allreduce(
            wires, group_op, prescale, postscale, name, process_set, for_engine(compression)
        )
        reduced = [
            outside.decompress(finish(y), ctx)
            for y, (_, ctx) in zip(outputs, compressed, strict=True)
        ]
        results = _placed(results, dense, reduced)
    return results


def _placed(results, positions, values):
    for position, value in zip(positions, values, strict=True):
        results[position] = value
    return results


def _grouped_allreduce(tensors, op, prescale, postscale, name, process_set, compression=None):
    @tf.custom_gradient
    def forward(*xs):
        def start(*arrays):
            return api.grouped_allreduce_async(
                list(arrays),
                name=name,
                op=op,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
                compression=compression,
            )

        ys = bridge.run(start, xs, [x.dtype for x in xs], "grouped_allreduce")
        for x, y in zip(xs, ys, strict=True):
            y.set_shape(x.shape)

        def grad(*dys):
            _check_differentiable(op, "grouped_allreduce")
            return _grouped_allreduce(
                list(dys), op, prescale, postscale, _grad_name(name), process_set, compression
            )

        return ys, grad

    return forward(*tensors)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Return every rank's ``tensor`` concatenated along dimension 0 (sizes may differ).

    Any fixed-size dtype travels (bool, int16, uint16, ... as their bytes).
    """
    tensor = tf.convert_to_tensor(tensor)
    _at_least_1d(tensor, "allgather")
    name = exchange.call_name(name, "allgather", process_set)
    wire, restore = exchange.engine_wire(tensor)
    if wire is not tensor or not _differentiable(tensor):
        return restore(_allgather_once(wire, name, process_set))

    @tf.custom_gradient
    def forward(x):
        y = _allgather_once(x, name, process_set)
        return y, lambda dy: _allgather_grad(x, dy, name, process_set)

    return forward(tensor)


def _allgather_once(x, name, process_set):
    start = functools.partial(api.allgather_async, name=name, process_set=process_set)
    y = bridge.run(start, [x], x.dtype, "allgather")
    y.set_shape(_rows_unknown(x.shape))
    return y


def _allgather_grad(x, dy, name, process_set):
    """Return the gradient for ``x`` of its allgather: its rows of the Average of every ``dy``."""
    averaged = _allreduce(dy, Average, 1.0, 1.0, _grad_name(name), process_set)
    rows = tf.shape(x, out_type=tf.int64)[:1]
    counts = allgather(rows, name=_grad_name(name, "rows"), process_set=process_set)
    first = tf.reduce_sum(counts[: resolve(process_set).rank()])
    return averaged[first : first + rows[0]]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """Return each of ``tensors`` allgathered (as ``allgather``), from one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for tensor in tensors:
        _at_least_1d(tensor, "grouped_allgather")
    if not tensors:
        return []
    name = exchange.call_name(name, "grouped_allgather", process_set)
    wires, restores = zip(*(exchange.engine_wire(t) for t in tensors), strict=True)

    @tf.custom_gradient
    def forward(*xs):
        def start(*arrays):
            return api.grouped_allgather_async(list(arrays), name=name, process_set=process_set)

        ys = bridge.run(start, xs, [x.dtype for x in xs], "grouped_allgather")
        for x, y in zip(xs, ys, strict=True):
            y.set_shape(_rows_unknown(x.shape))

        def grad(*dys):
            return [
                _allgather_grad(x, dy, _grad_name(name, str(i)), process_set)
                if _differentiable(x)
                else None
                for i, (x, dy) in enumerate(zip(xs, dys, strict=True))
            ]

        return ys, grad

    return [restore(y) for restore, y in zip(restores, forward(*wires), strict=True)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Return ``root_rank``'s ``tensor`` (a rank of the whole job) on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    name = exchange.call_name(name, "broadcast", process_set)
    wire, restore = exchange.engine_wire(tensor)
    if wire is not tensor or not _differentiable(tensor):
        return restore(_broadcast_once(wire, root_rank, name, process_set))

    @tf.custom_gradient
    def forward(x):
        y = _broadcast_once(x, root_rank, name, process_set)

        def grad(dy):
            averaged = _allreduce(dy, Average, 1.0, 1.0, _grad_name(name), process_set)
            if api.rank() == root_rank:
                return averaged
            # A TensorFlow 1 graph runs only what the output depends on, and the root's
            # Average needs every rank: the zeros wait for it.
            with tf.control_dependencies([averaged]):
                return tf.zeros_like(dy)

        return y, grad

    return forward(tensor)


def _broadcast_once(x, root_rank, name, process_set):
    start = functools.partial(
        api.broadcast_async, root_rank=root_rank, name=name, process_set=process_set
    )
    y = bridge.run(start, [x], x.dtype, "broadcast")
    y.set_shape(x.shape)
    return y


def broadcast_(variables, root_rank, name=None, process_set=None):
    """Assign ``root_rank``'s value to each of ``variables`` in place; return their new values."""
    variables = list(variables)
    # In a TensorFlow 1 graph nothing orders the reads after the assignments but this.
    with tf.control_dependencies(_assign_broadcast(variables, root_rank, process_set)):
        return [variable.read_value() for variable in variables]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Send ``splits[j]`` rows of ``tensor`` to rank j; return the rows received, by rank.

    With ``splits`` (integers, one per rank, adding up to the rows) it returns
    ``(received, received_splits)``, the latter an int32 tensor of the rows that came from
    each rank; without, the rows are split evenly (their number must divide by the number
    of ranks) and it returns ``received`` only, as Horovod does. Bad splits raise an
    error that is both a ValueError and a ``tf.errors.InvalidArgumentError``.
    """
    tensor = tf.convert_to_tensor(tensor)
    _at_least_1d(tensor, "alltoall")
    if splits is not None:
        splits = tf.convert_to_tensor(splits)
        if not splits.dtype.is_integer:
            raise errors.InvalidArgumentError(
                f"alltoall splits must be integers, got a {splits.dtype.name} tensor"
            )
        splits = tf.cast(tf.reshape(splits, [-1]), tf.int32)
    name = exchange.call_name(name, "alltoall", process_set)
    wire, restore = exchange.engine_wire(tensor)
    if wire is not tensor or not _differentiable(tensor):
        y, received = _alltoall_once(wire, splits, name, process_set)
        y = restore(y)
    else:

        @tf.custom_gradient
        def forward(x):
            y, received = _alltoall_once(x, splits, name, process_set)

            def grad(dy, _):
                back, _ = _alltoall_once(dy, received, _grad_name(name), process_set)
                return back

            return (y, received), grad

        y, received = forward(tensor)
    return y if splits is None else (y, received)


def _alltoall_once(x, splits, name, process_set):
    """Return the alltoall of ``x`` by ``splits`` (None: even), and the rows from each rank.

    The rows from each rank come from a second alltoall, of each rank's splits, in the
    same op.
    """
    size = resolve(process_set).size()
    inputs = [x] if splits is None else [x, splits]

    def start(array, split_array=None):
        rows = array.shape[0]
        if split_array is None:
            if rows % size:
                raise errors.InvalidArgumentError(
                    f"alltoall without splits needs rows that divide by the {size} ranks; "
                    f"this rank has {rows}"
                )
            split_array = np.full(size, rows // size, np.int32)
        if len(split_array) != size or split_array.min() < 0 or split_array.sum() != rows:
            raise errors.InvalidArgumentError(
                f"alltoall splits {split_array.tolist()} must be {size} non-negative counts "
                f"adding up to the rows of the tensor, {rows}"
            )
        data = api.alltoall_async(array, splits=split_array, name=name, process_set=process_set)
        counts = api.alltoall_async(
            split_array.astype(np.int32),
            splits=np.ones(size, np.int64),
            name=_grad_name(name, "splits"),
            process_set=process_set,
        )
        return [data, counts]

    y, received = bridge.run(start, inputs, [x.dtype, tf.int32], "alltoall")
    y.set_shape(_rows_unknown(x.shape))
    received.set_shape([size])
    return y, received


def reducescatter(
    tensor,
    op=Average,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    device_dense="",
    compression=Compression.none,
    ignore_name_scope=False,
):
    """Return this rank's share (of dimension 0) of ``tensor`` reduced over all ranks.

    Integer tensors take scale factors as in Horovod (float64, truncated toward zero).
    """
    name = exchange.call_name(name, "reducescatter", process_set)
    return grouped_reducescatter(
        [tensor], op, name, prescale_factor, postscale_factor, process_set, compression=compression
    )[0]


def grouped_reducescatter(
    tensors,
    op=Average,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    device_dense="",
    compression=Compression.none,
    ignore_name_scope=False,
):
    """Return this rank's share of each of ``tensors`` reduced over all ranks, from one op."""
    op = as_reduce_op(op)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for tensor in tensors:
        _at_least_1d(tensor, "grouped_reducescatter")
    if not tensors:
        return []
    name = exchange.call_name(name, "grouped_reducescatter", process_set)
    outside = around_reduction(compression)
    compressed = [outside.compress(t) for t in tensors]
    wires, group_op, prescale, postscale, finish = _integer_scaling(
        [wire for wire, _ in compressed], op, prescale_factor, postscale_factor, process_set
    )
    outputs = _reducescatter(wires, group_op, prescale, postscale, name, process_set)
    return [
        outside.decompress(finish(y), ctx) for y, (_, ctx) in zip(outputs, compressed, strict=True)
    ]


def _reducescatter(tensors, op, prescale, postscale, name, process_set):
    @tf.custom_gradient
    def forward(*xs):
        def start(*arrays):
            return api.grouped_reducescatter_async(
                list(arrays),
                op=op,
                name=name,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
            )

        ys = bridge.run(start, xs, [x.dtype for x in xs], "reducescatter")
        for x, y in zip(xs, ys, strict=True):
            y.set_shape(_rows_unknown(x.shape))

        def grad(*dys):
            size = resolve(process_set).size()
            return [
                allgather(
                    dy * size if op == ReduceOp.Sum else dy,
                    name=_grad_name(name, f"grad.{i}"),
                    process_set=process_set,
                )
                for i, dy in enumerate(dys)
            ]

        return ys, grad

    return forward(*tensors)


def join():
    """Declare this rank out of data; return (as an int32 tensor) the rank that joined last."""
    return tf.numpy_function(_join, [], tf.int32, stateful=True)


@tf.autograph.experimental.do_not_convert
def _join():
    return np.int32(api.join())


def broadcast_variables(variables, root_rank=0, process_set=None, inplace=False):
    """Assign ``root_rank``'s value to each of ``variables`` on every rank.

    ``inplace`` is Horovod's and changes nothing: the variables are always assigned to.
    """
    _assign_broadcast(list(variables), root_rank, process_set)


def _assign_broadcast(variables, root_rank, process_set):
    """Assign ``root_rank``'s values to ``variables``; return what each ``assign`` returned."""
    labels = [variable_label(v, i) for i, v in enumerate(variables)]
    values = exchange.broadcast_tensors(
        [tf.convert_to_tensor(v) for v in variables],
        labels,
        exchange.site_name("broadcast_variables", process_set),
        root_rank,
        process_set,
    )
    return [variable.assign(value) for variable, value in zip(variables, values, strict=True)]


def broadcast_global_variables(root_rank):
    """Broadcast TensorFlow 1's global variables; eagerly a RuntimeError, as in Horovod."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() does not run eagerly (TensorFlow 2 keeps no global "
            "variables); use broadcast_variables(model.variables + optimizer.variables)"
        )
    broadcast_variables(tf.compat.v1.global_variables(), root_rank)
