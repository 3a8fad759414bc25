"""The NumPy-level collectives on tf.Tensors, eagerly and inside ``tf.function``.

Gradients are registered for allreduce, allgather and broadcast. They treat the loss being
differentiated as the sum of every rank's loss: the gradient of a Sum (Average) allreduce
is the Sum (Average) allreduce of the incoming gradients, that of an allgather is this
rank's rows of their Sum, and that of a broadcast is their Sum on the root (zero elsewhere).
Every rank must take the same gradients, since they are collectives too.

Each collective runs over ``process_set`` (a registered ``ringtrain.ProcessSet``; None: every
rank), and so do its gradients.
"""

import functools

import numpy as np
import tensorflow as tf

from ringtrain import api
from ringtrain.ops import Average, ReduceOp, Sum, as_reduce_op, resolve_op
from ringtrain.process_sets import resolve
from ringtrain.tensorflow import bridge, compat, exchange
from ringtrain.tensorflow.compression import Compression


def _grad_name(name, what="grad"):
    return None if name is None else f"{name}.{what}"


def _rows_unknown(shape):
    return tf.TensorShape([None]).concatenate(shape[1:])


def _at_least_1d(tensor, what):
    if tensor.shape.rank == 0:
        raise ValueError(f"{what} needs a tensor of at least one dimension; got a scalar")


def _check_differentiable(op, what):
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise ValueError(f"the gradient of {what} is defined for op Sum and Average, not {op.name}")


def allreduce(
    tensor,
    op=None,
    compression=Compression.none,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    average=None,
    process_set=None,
):
    """Return ``tensor`` reduced over all ranks (default op Average); same shape and dtype.

    A ``tf.IndexedSlices`` is allgathered (values and indices) instead, for op Sum or
    Average. Unnamed calls are matched across ranks by order, as in ``ringtrain.allreduce``.
    ``average`` is Horovod's older flag for op (True: Average, False: Sum).
    """
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        site = name or exchange.site_name("allreduce.sparse", process_set)
        return exchange.allreduce_gradients(
            [tensor], ["tensor"], site, op=op, compression=compression, process_set=process_set
        )[0]
    wire, ctx = compression.compress(tf.convert_to_tensor(tensor))
    return compression.decompress(
        _allreduce(wire, op, prescale_factor, postscale_factor, name, process_set), ctx
    )


def _allreduce(tensor, op, prescale, postscale, name, process_set):
    @tf.custom_gradient
    def forward(x):
        start = functools.partial(
            api.allreduce_async,
            name=name,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )  # never a shared result: see exchange.allreduce_gradients
        y = bridge.run(start, [x], x.dtype, "allreduce")
        y.set_shape(x.shape)

        def grad(dy):
            _check_differentiable(op, "allreduce")
            return _allreduce(dy, op, prescale, postscale, _grad_name(name), process_set)

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
):
    """Return ``tensors`` reduced over all ranks as one group (fused together), in order."""
    op = resolve_op(op)
    if not tensors:
        return []
    compressed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    wires = [wire for wire, _ in compressed]
    outputs = _grouped_allreduce(wires, op, prescale_factor, postscale_factor, name, process_set)
    return [compression.decompress(y, ctx) for y, (_, ctx) in zip(outputs, compressed, strict=True)]


def _grouped_allreduce(tensors, op, prescale, postscale, name, process_set):
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
            )

        ys = bridge.run(start, xs, [x.dtype for x in xs], "grouped_allreduce")
        for x, y in zip(xs, ys, strict=True):
            y.set_shape(x.shape)

        def grad(*dys):
            _check_differentiable(op, "grouped_allreduce")
            return _grouped_allreduce(
                list(dys), op, prescale, postscale, _grad_name(name), process_set
            )

        return ys, grad

    return forward(*tensors)


def allgather(tensor, name=None, process_set=None):
    """Return every rank's ``tensor`` concatenated along dimension 0 (sizes may differ)."""
    tensor = tf.convert_to_tensor(tensor)
    _at_least_1d(tensor, "allgather")
    start = functools.partial(api.allgather_async, name=name, process_set=process_set)

    @tf.custom_gradient
    def forward(x):
        y = bridge.run(start, [x], x.dtype, "allgather")
        y.set_shape(_rows_unknown(x.shape))
        return y, lambda dy: _allgather_grad(x, dy, name, process_set)

    return forward(tensor)


def _allgather_grad(x, dy, name, process_set):
    """Return the gradient for ``x`` of its allgather: its rows of the sum of every ``dy``."""
    summed = _allreduce(dy, Sum, 1.0, 1.0, _grad_name(name), process_set)
    rows = tf.shape(x, out_type=tf.int64)[:1]
    counts = allgather(rows, name=_grad_name(name, "rows"), process_set=process_set)
    first = tf.reduce_sum(counts[: resolve(process_set).rank()])
    return summed[first : first + rows[0]]


def grouped_allgather(tensors, name=None, process_set=None):
    """Return each of ``tensors`` allgathered (as ``allgather``), from one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for tensor in tensors:
        _at_least_1d(tensor, "grouped_allgather")
    if not tensors:
        return []

    @tf.custom_gradient
    def forward(*xs):
        def start(*arrays):
            return api.grouped_allgather_async(list(arrays), name=name, process_set=process_set)

        ys = bridge.run(start, xs, [x.dtype for x in xs], "grouped_allgather")
        for x, y in zip(xs, ys, strict=True):
            y.set_shape(_rows_unknown(x.shape))

        def grad(*dys):
            return [
                _allgather_grad(x, dy, None if name is None else f"{name}.{i}", process_set)
                for i, (x, dy) in enumerate(zip(xs, dys, strict=True))
            ]

        return ys, grad

    return forward(*tensors)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return ``root_rank``'s ``tensor`` (a rank of the whole job) on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    wire, restore = exchange.engine_wire(tensor)
    if wire is not tensor:  # bool, uint32, ...: not differentiable anyway
        return restore(_broadcast_once(wire, root_rank, name, process_set))

    @tf.custom_gradient
    def forward(x):
        y = _broadcast_once(x, root_rank, name, process_set)

        def grad(dy):
            summed = _allreduce(dy, Sum, 1.0, 1.0, _grad_name(name), process_set)
            return summed if api.rank() == root_rank else tf.zeros_like(summed)

        return y, grad

    return forward(tensor)


def _broadcast_once(x, root_rank, name, process_set):
    start = functools.partial(
        api.broadcast_async, root_rank=root_rank, name=name, process_set=process_set
    )
    y = bridge.run(start, [x], x.dtype, "broadcast")
    y.set_shape(x.shape)
    return y


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[j]`` rows of ``tensor`` to rank j; return the rows received, by rank.

    Without ``splits`` the rows are spread evenly, the first ranks getting one more.
    """
    tensor = tf.convert_to_tensor(tensor)
    _at_least_1d(tensor, "alltoall")
    inputs = [tensor]
    if splits is not None:
        inputs.append(tf.cast(tf.reshape(splits, [-1]), tf.int64))

    def start(array, split_array=None):
        return api.alltoall_async(array, splits=split_array, name=name, process_set=process_set)

    y = bridge.run(start, inputs, tensor.dtype, "alltoall")
    y.set_shape(_rows_unknown(tensor.shape))
    return y


def reducescatter(
    tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
):
    """Return this rank's share (of dimension 0) of ``tensor`` reduced over all ranks."""
    tensor = tf.convert_to_tensor(tensor)
    _at_least_1d(tensor, "reducescatter")
    start = functools.partial(
        api.reducescatter_async,
        op=as_reduce_op(op),
        name=name,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )
    y = bridge.run(start, [tensor], tensor.dtype, "reducescatter")
    y.set_shape(_rows_unknown(tensor.shape))
    return y


def grouped_reducescatter(
    tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
):
    """Return this rank's share of each of ``tensors`` reduced over all ranks, from one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for tensor in tensors:
        _at_least_1d(tensor, "grouped_reducescatter")
    if not tensors:
        return []

    def start(*arrays):
        return api.grouped_reducescatter_async(
            list(arrays),
            op=as_reduce_op(op),
            name=name,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )

    ys = bridge.run(start, tensors, [t.dtype for t in tensors], "grouped_reducescatter")
    for tensor, y in zip(tensors, ys, strict=True):
        y.set_shape(_rows_unknown(tensor.shape))
    return ys


def join():
    """Declare this rank out of data; return (as an int32 tensor) the rank that joined last."""
    return tf.numpy_function(_join, [], tf.int32, stateful=True)


@tf.autograph.experimental.do_not_convert
def _join():
    return np.int32(api.join())


def broadcast_variables(variables, root_rank=0, process_set=None):
    """Assign ``root_rank``'s value to each of ``variables`` on every rank."""
    variables = list(variables)
    labels = [compat.variable_label(v, i) for i, v in enumerate(variables)]
    values = exchange.broadcast_tensors(
        [tf.convert_to_tensor(v) for v in variables],
        labels,
        exchange.site_name("broadcast_variables", process_set),
        root_rank,
        process_set,
    )
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
