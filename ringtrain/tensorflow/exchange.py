"""Hands a list of tensors (a step's gradients, a model's variables) to the engine at once.

The hand-over itself is ``ringtrain.exchange``'s (its manifest, buckets and names); here each
bucket becomes a TensorFlow op that submits it as soon as TensorFlow has computed its
tensors. The tensors go last first: backprop produces the last layers' gradients first, so
the engine reduces (and fuses) those while TensorFlow still computes the earlier ones. An op
costs TensorFlow's thread about as much as exchanging 1 MiB, so small gradients share one
(``bucket_bytes``). Only then does one op collect every result, checking the manifest first.
"""

import functools

import numpy as np
import tensorflow as tf

from ringtrain.dtypes import SUPPORTED
from ringtrain.exchange import (
    DENSE,
    KIND_NAMES,
    NO_TENSOR,
    SPARSE,
    Handover,
    Part,
    alone,
    broadcaster,
    bucket_bytes,
    gatherer,
    predivide_factor,
    reducer,
    registered_process_set,
    set_site,
    unnamed_name,
    unnamed_site_name,
)
from ringtrain.keras.labels import variable_label
from ringtrain.ops import Average, Sum, as_reduce_op
from ringtrain.process_sets import ProcessSet, resolve
from ringtrain.tensorflow import bridge, compat
from ringtrain.tensorflow.compression import Compression, around_reduction, for_engine
from ringtrain.tensorflow.local_sources import LocalSources

_KINDS = (*KIND_NAMES[:SPARSE], "tf.IndexedSlices")
_ENGINE_DTYPES = frozenset(SUPPORTED)


class _Part:
    """One tensor that goes to the engine: ``start(name)`` makes the submit function."""

    __slots__ = ("suffix", "tensor", "start", "shape", "reduces")

    def __init__(self, suffix, tensor, start, shape, reduces):
        self.suffix = suffix
        self.tensor = tensor
        self.start = start
        self.shape = shape
        self.reduces = reduces  # an allreduce, whose settings the manifest can share


class _Plan:
    """What one list entry becomes: its kind, its parts, and how results become the output."""

    __slots__ = ("kind", "parts", "finish")

    def __init__(self, kind, parts, finish):
        self.kind = kind
        self.parts = parts
        self.finish = finish


def site_name(base, process_set):
    """Return ``compat.site_name`` for ``base``, whose sites over a process set count apart.

    A rank outside the set has none of its sites, so they must not shift its other names.
    """
    return compat.site_name(set_site(base, process_set))


def call_name(name, kind, process_set):
    """Return ``name``, or the name that every rank gives this unnamed ``kind`` call alike.

    Eagerly it is ``exchange.unnamed_name``'s: the caller's file and line, and how many ``kind``
    calls that line made. While tracing a ``tf.function`` it is the function's name and the
    number of the unnamed ``kind`` calls before this one in its trace (``compat.traced_site``),
    which is the same on every rank whichever ranks retraced it.
    """
    if name is not None:
        return name
    traced = compat.traced_site(set_site(f"{kind}.noname", process_set))
    if traced is None:
        return unnamed_name(kind, process_set)
    function, count = traced
    return unnamed_site_name(kind, f"{function} (tf.function)", count)


def _dense_plan(grad, op, compression, prescale, postscale, shared, process_set):
    outside = around_reduction(compression)
    wire, ctx = outside.compress(tf.convert_to_tensor(grad))
    start = reducer(op, prescale, postscale, shared, process_set, for_engine(compression))
    part = _Part("", wire, start, wire.shape, reduces=True)
    return _Plan(DENSE, [part], lambda results: outside.decompress(results[0], ctx))


def _sparse_plan(grad, op, compression, process_set):
    values = tf.convert_to_tensor(grad.values)
    indices = tf.convert_to_tensor(grad.indices)
    _check_sparse_op(op)
    if op == Average:
        values = values / tf.cast(resolve(process_set).size(), values.dtype)
    outside = around_reduction(compression)
    wire, ctx = outside.compress(values)
    parts = [
        _Part(
            ".values",
            wire,
            gatherer(process_set),
            tf.TensorShape([None]).concatenate(wire.shape[1:]),
            reduces=False,
        ),
        _Part(
            ".indices",
            indices,
            gatherer(process_set),
            tf.TensorShape([None]),
            reduces=False,
        ),
    ]

    def finish(results):
        return tf.IndexedSlices(outside.decompress(results[0], ctx), results[1], grad.dense_shape)

    return _Plan(SPARSE, parts, finish)


def _check_sparse_op(op):
    if op not in (Average, Sum):
        raise NotImplementedError(
            f"tf.IndexedSlices are exchanged by allgather, which supports op Sum or Average "
            f"only, not {op.name}; pass sparse_as_dense=True to reduce them densely"
        )


def _kept(grads, sparse_as_dense, op):
    """Return ``grads`` as one rank's reduction of them leaves them (``exchange.alone``).

    Dense ones as tensors, sparse ones as they are or dense with ``sparse_as_dense``; an op
    that sparse ones do not support fails as it would on more ranks.
    """
    kept = []
    for grad in grads:
        if isinstance(grad, tf.IndexedSlices) and not sparse_as_dense:
            _check_sparse_op(op)
        elif grad is not None:
            grad = tf.convert_to_tensor(grad)
        kept.append(grad)
    return kept


@tf.autograph.experimental.do_not_convert
def allreduce_gradients(
    grads,
    labels,
    site,
    op=Average,
    compression=None,
    sparse_as_dense=False,
    prescale=1.0,
    postscale=1.0,
    shared=False,
    process_set=None,
):
    """Return ``grads`` reduced over ``process_set``'s ranks (None entries stay None).

    ``labels`` name the variables in error messages; ``site`` (see ``compat.site_name``)
    prefixes the engine names. ``tf.IndexedSlices`` are allgathered (values and indices)
    unless ``sparse_as_dense``. ``shared``: dense results may be read-only arrays that the
    host's ranks share (``ringtrain.allreduce(read_only=True)``). Only for results whose
    every consumer is known never to write into them: a TensorFlow op may write its output
    into the memory of an input it took over, and it takes over the memory of an aligned
    slice of a ``numpy_function`` result (docs/benchmarks.md), which would change the
    result under the other ranks.
    """
    compression = compression or Compression.none
    plans = []
    for grad in grads:
        if grad is None:
            plans.append(None)
        elif isinstance(grad, tf.IndexedSlices) and not sparse_as_dense:
            plans.append(_sparse_plan(grad, op, compression, process_set))
        else:
            plans.append(
                _dense_plan(grad, op, compression, prescale, postscale, shared, process_set)
            )
    return _run(plans, labels, site, process_set)


@tf.autograph.experimental.do_not_convert
def broadcast_tensors(values, labels, site, root_rank, process_set=None):
    """Return every tensor of ``values`` as ``root_rank`` holds it."""
    plans = []
    for value in values:
        wire, restore = engine_wire(tf.convert_to_tensor(value))
        start = broadcaster(root_rank, process_set)
        part = _Part("", wire, start, wire.shape, reduces=False)
        plans.append(_Plan(DENSE, [part], _first(restore)))
    return _run(plans, labels, site, process_set)


def _first(restore):
    return lambda results: restore(results[0])


def engine_wire(tensor):
    """Return a tensor of a dtype the engine carries, and the function that undoes it."""
    if tensor.dtype.is_numpy_compatible and np.dtype(tensor.dtype.as_numpy_dtype) in _ENGINE_DTYPES:
        return tensor, lambda result: result
    dtype = tensor.dtype
    if dtype == tf.bool:
        return tf.cast(tensor, tf.uint8), lambda result: tf.cast(result, tf.bool)
    # Any other fixed-size dtype (uint32 seed states, int16, complex) travels as its bytes.
    return tf.bitcast(tensor, tf.uint8), lambda result: tf.bitcast(result, dtype)


def _run(plans, labels, site, process_set):
    if not plans:
        return []
    present = [(i, part) for i in reversed(range(len(plans))) for part in _parts(plans[i])]
    handover = Handover(
        site,
        [NO_TENSOR if plan is None else plan.kind for plan in plans],
        labels,
        [
            Part(
                i,
                part.suffix,
                part.start,
                _static_bytes(part.tensor),
                part.reduces,
                part.tensor.dtype.as_numpy_dtype if part.tensor.dtype.is_numpy_compatible else None,
            )
            for i, part in present
        ],
        bucket_bytes(),
        process_set,
        _KINDS,
    )
    tokens = []
    for k, bucket in enumerate(handover.buckets):
        tensors = [present[j][1].tensor for j in bucket]
        count = handover.handle_count(k)  # the manifest goes with the first
        tokens += bridge.enqueue(
            functools.partial(_submit, handover, k), tensors, site, count=count, ordered=False
        )
    # One op waits for every result, the manifest first: a TensorFlow thread blocks once
    # per step, and only after the last enqueue, whose token is one of its inputs.
    results = bridge.collect(tokens, [part.tensor.dtype for _, part in present], handover)
    by_plan: dict[int, list] = {}
    for (i, part), result in zip(present, results, strict=True):
        result.set_shape(part.shape)
        by_plan.setdefault(i, []).append(result)
    return [None if plan is None else plan.finish(by_plan[i]) for i, plan in enumerate(plans)]


def _submit(handover, k, *arrays):
    return handover.submit(k, arrays)


def _parts(plan):
    return plan.parts if plan is not None else ()


def _static_bytes(tensor):
    """Return the bytes of ``tensor`` from its static shape (None where that is unknown)."""
    count = tensor.shape.num_elements()
    return None if count is None else count * tensor.dtype.size


def check_groups(num_groups=0, groups=None) -> None:
    """Check Horovod's ``num_groups``/``groups`` as Horovod does; ringtrain needs neither.

    Horovod groups gradients into fused allreduces by count or by lists of variables; here
    the engine fuses what is ready, and the ``bucket_bytes`` setting groups the hand-overs.
    """
    chosen = num_groups if groups is None and num_groups else groups
    if chosen is not None and not isinstance(chosen, list) and not chosen > 0:
        raise ValueError(
            f"groups must be a positive number or a list of lists of variables, got {chosen!r}"
        )


class GradientReduction:
    """How a step's gradients are reduced; validated once, shared by the tape and optimizer.

    ``gradient_predivide_factor`` f (op Average only) divides by f before the sum and by
    size / f after it, which keeps float16 sums in range. ``local_sources`` holds the
    variables whose gradients stay on this rank (``scale_local_gradients``: see
    ``LocalSources``). ``process_set``: the ranks to reduce over (a ``ProcessSet``; None:
    every rank), kept in the config as its ranks. ``shared_results``: see
    ``allreduce_gradients``'s ``shared``; not part of the config.
    """

    def __init__(
        self,
        op=Average,
        compression=Compression.none,
        sparse_as_dense=False,
        gradient_predivide_factor=1.0,
        scale_local_gradients=True,
        process_set=None,
        shared_results=False,
    ):
        if process_set is not None and not isinstance(process_set, ProcessSet):
            process_set = registered_process_set(process_set)  # ranks, from a config
        self.process_set = process_set
        self.shared_results = bool(shared_results)
        self.local_sources = LocalSources(scale_local_gradients)
        self.op = as_reduce_op(op)
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.gradient_predivide_factor = predivide_factor(gradient_predivide_factor, self.op)

    def __call__(self, grads, variables, base):
        """Return ``grads`` (of ``variables``, which name them) reduced over all ranks.

        The gradients of local sources are not exchanged; the manifest still holds their
        places, as no tensor, so ranks that disagree on which variables are local fail.
        """
        labels = [variable_label(v, i) for i, v in enumerate(variables)]
        local = [v is not None and v in self.local_sources for v in variables]
        if any(local):
            labels = [
                f"{t} (local on this rank)" if k else t for t, k in zip(labels, local, strict=True)
            ]
        exchanged = [None if k else g for g, k in zip(grads, local, strict=True)]
        if alone(self.process_set):  # nothing to exchange, as in Horovod
            reduced = _kept(exchanged, self.sparse_as_dense, self.op)
        else:
            factor = self.gradient_predivide_factor
            reduced = allreduce_gradients(
                exchanged,
                labels,
                site_name(base, self.process_set),
                op=self.op,
                compression=self.compression,
                sparse_as_dense=self.sparse_as_dense,
                prescale=1.0 / factor,
                postscale=factor,
                shared=self.shared_results,
                process_set=self.process_set,
            )
        size = resolve(self.process_set).size()
        gradient = self.local_sources.gradient
        return [
            gradient(g, size) if k else r for g, r, k in zip(grads, reduced, local, strict=True)
        ]

    def get_config(self) -> dict:
        """Return the settings as plain values (for a Keras optimizer's config)."""
        return {
            "op": self.op.name,
            "compression": self.compression.name,
            "sparse_as_dense": self.sparse_as_dense,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "scale_local_gradients": self.local_sources.scale_gradients,
            "process_set": None if self.process_set is None else list(self.process_set.ranks),
        }
