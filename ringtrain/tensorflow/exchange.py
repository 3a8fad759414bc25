"""Hands a list of tensors (a step's gradients, a model's variables) to the engine at once.

The tensors are enqueued last first, each by a TensorFlow op that runs as soon as
TensorFlow has computed it: backprop produces the last layers' gradients first, so the
engine reduces (and fuses) those while TensorFlow still computes the earlier ones.
Consecutive tensors smaller than the ``bucket_bytes`` setting share one op until they fill
that many bytes, and a larger one has its own (``buckets``): an op costs TensorFlow's thread
about as much as exchanging 1 MiB. Only then does one synchronize op run, which waits for
every result.

With the tensors goes a manifest: a small allreduce of one one-hot row per tensor
(none, dense or sparse), submitted with the first tensor. Ranks that disagree on the
number of tensors fail on its shape, and ranks that disagree on a tensor's kind see two
kinds in its row. The synchronize op checks the manifest before it waits for anything
else, so such ranks raise an error instead of waiting for tensors that the others never
send.
"""

import functools

import numpy as np
import tensorflow as tf

from ringtrain import api
from ringtrain.dtypes import SUPPORTED
from ringtrain.engine.messages import unnamed_name
from ringtrain.ops import Average, Sum, as_reduce_op
from ringtrain.process_sets import ProcessSet, resolve
from ringtrain.tensorflow import bridge, compat
from ringtrain.tensorflow.compression import Compression, around_reduction, for_engine
from ringtrain.tensorflow.errors import MismatchError
from ringtrain.tensorflow.local_sources import LocalSources

_KINDS = ("no tensor", "a dense tensor", "tf.IndexedSlices")
_NONE, _DENSE, _SPARSE = range(len(_KINDS))
_ENGINE_DTYPES = frozenset(SUPPORTED)


class _Part:
    """One tensor that goes to the engine: ``start(name)`` makes the submit function."""

    __slots__ = ("suffix", "tensor", "start", "shape", "reduces", "token")

    def __init__(self, suffix, tensor, start, shape, reduces):
        self.suffix = suffix
        self.tensor = tensor
        self.start = start
        self.shape = shape
        self.reduces = reduces  # an allreduce, whose settings the manifest can share
        self.token = None


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
    process_set_id = resolve(process_set).process_set_id
    return compat.site_name(base if process_set_id == 0 else f"{base}.set{process_set_id}")


def call_name(name, kind, process_set):
    """Return ``name``, or the name that every rank gives this unnamed ``kind`` call alike.

    Eagerly it is ``api.unnamed_name``'s: the caller's file and line, and how many ``kind``
    calls that line made. While tracing a ``tf.function`` it is the function's name and the
    number of the unnamed ``kind`` calls before this one in its trace (``compat.traced_site``),
    which is the same on every rank whichever ranks retraced it.
    """
    if name is not None:
        return name
    process_set_id = resolve(process_set).process_set_id
    base = f"{kind}.noname" if process_set_id == 0 else f"{kind}.noname.set{process_set_id}"
    traced = compat.traced_site(base)
    if traced is None:
        return api.unnamed_name(kind, process_set)
    function, count = traced
    return unnamed_name(kind, f"{function} (tf.function)", count)


def _reducer(op, prescale, postscale, read_only, process_set, compression=None):
    def start(name):
        return functools.partial(
            api.allreduce_async,
            name=name,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            read_only=read_only,
            process_set=process_set,
            compression=compression,
        )

    return start


def _gatherer(process_set):
    def start(name):
        return functools.partial(api.allgather_async, name=name, process_set=process_set)

    return start


def _dense_plan(grad, op, compression, prescale, postscale, shared, process_set):
    outside = around_reduction(compression)
    wire, ctx = outside.compress(tf.convert_to_tensor(grad))
    start = _reducer(op, prescale, postscale, shared, process_set, for_engine(compression))
    part = _Part("", wire, start, wire.shape, reduces=True)
    return _Plan(_DENSE, [part], lambda results: outside.decompress(results[0], ctx))


def _sparse_plan(grad, op, compression, process_set):
    values = tf.convert_to_tensor(grad.values)
    indices = tf.convert_to_tensor(grad.indices)
    if op == Average:
        values = values / tf.cast(resolve(process_set).size(), values.dtype)
    elif op != Sum:
        raise NotImplementedError(
            f"tf.IndexedSlices are exchanged by allgather, which supports op Sum or Average "
            f"only, not {op.name}; pass sparse_as_dense=True to reduce them densely"
        )
    outside = around_reduction(compression)
    wire, ctx = outside.compress(values)
    parts = [
        _Part(
            ".values",
            wire,
            _gatherer(process_set),
            tf.TensorShape([None]).concatenate(wire.shape[1:]),
            reduces=False,
        ),
        _Part(
            ".indices",
            indices,
            _gatherer(process_set),
            tf.TensorShape([None]),
            reduces=False,
        ),
    ]

    def finish(results):
        return tf.IndexedSlices(outside.decompress(results[0], ctx), results[1], grad.dense_shape)

    return _Plan(_SPARSE, parts, finish)


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
        start = _broadcaster(root_rank, process_set)
        part = _Part("", wire, start, wire.shape, reduces=False)
        plans.append(_Plan(_DENSE, [part], _first(restore)))
    return _run(plans, labels, site, process_set)


def _broadcaster(root_rank, process_set):
    def start(name):
        return functools.partial(
            api.broadcast_async, root_rank=root_rank, name=name, process_set=process_set
        )

    return start


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
    codes = np.zeros((len(plans), len(_KINDS)), np.float32)
    for i, plan in enumerate(plans):
        codes[i, _NONE if plan is None else plan.kind] = 1
    manifest_name = f"{site}.manifest"
    manifest_start = functools.partial(
        api.allreduce_async, name=manifest_name, op=Sum, process_set=process_set
    )
    present = [(i, part) for i in reversed(range(len(plans))) for part in _parts(plans[i])]
    sizes = [_static_bytes(part.tensor) for _, part in present]
    manifest = None
    for bucket in buckets(sizes, api.active_settings().bucket_bytes):
        members = [present[k] for k in bucket]
        starts = [part.start(f"{site}.{i}{part.suffix}") for i, part in members]
        tensors = [part.tensor for _, part in members]
        if manifest is None:
            # The manifest goes with the first bucket, in the same submission; reduced like
            # its first tensor (the check needs only its zero pattern), the engine fuses them.
            if members[0][1].reduces:
                manifest_start = members[0][1].start(manifest_name)
            starts.insert(0, manifest_start)
            tensors.insert(0, tf.constant(codes))
        tokens = bridge.enqueue(_each(starts), tensors, site, count=len(starts), ordered=False)
        if manifest is None:
            manifest = tokens.pop(0)
        for (_, part), token in zip(members, tokens, strict=True):
            part.token = token
    if manifest is None:
        manifest = bridge.enqueue(manifest_start, [tf.constant(codes)], site, ordered=False)
    # One op waits for every result, the manifest first: a TensorFlow thread blocks once
    # per step, and only after the last enqueue, whose token is one of its inputs.
    results = bridge.synchronize_each(
        [manifest, *(part.token for _, part in present)],
        [tf.float32, *(part.tensor.dtype for _, part in present)],
        [
            f"{site}: ranks hand over different numbers of tensors (this rank: {len(plans)})",
            *(f"{site}: {labels[i]}" for i, _ in present),
        ],
        [functools.partial(_check_manifest, codes, labels, site)] + [None] * len(present),
        process_set,
    )[1:]
    by_plan: dict[int, list] = {}
    for (i, part), result in zip(present, results, strict=True):
        result.set_shape(part.shape)
        by_plan.setdefault(i, []).append(result)
    return [None if plan is None else plan.finish(by_plan[i]) for i, plan in enumerate(plans)]


def _parts(plan):
    return plan.parts if plan is not None else ()


def _static_bytes(tensor):
    """Return the bytes of ``tensor`` from its static shape (None where that is unknown)."""
    count = tensor.shape.num_elements()
    return None if count is None else count * tensor.dtype.size


def buckets(sizes, cap):
    """Split positions ``0..len(sizes)-1``, in order, into runs of small sizes and lone large ones.

    Consecutive sizes under ``cap`` share a run until it holds ``cap`` bytes or more; a size
    of ``cap`` or more, or an unknown one (None), goes alone, and the run before it closes:
    a large gradient is handed over the moment it is in, never held back for small ones
    around it. ``cap`` 0 puts every position alone.
    """
    runs, run, filled = [], [], 0
    for k, size in enumerate(sizes):
        if size is None or size >= cap:
            if run:
                runs.append(run)
                run, filled = [], 0
            runs.append([k])
            continue
        run.append(k)
        filled += size
        if filled >= cap:
            runs.append(run)
            run, filled = [], 0
    if run:
        runs.append(run)
    return runs


def _each(starts):
    def start(*arrays):
        return [begin(array) for begin, array in zip(starts, arrays, strict=True)]

    return start


def _check_manifest(codes, labels, site, summed):
    # Each row has one non-zero column when every contributing rank agrees (joined ranks
    # contribute the op's identity); any other count means some ranks sent another kind.
    # That holds for every op with non-zero scale factors: Sum and Average keep every
    # column someone set, Max too, and Min and Product zero a column someone left out.
    for i, (mine, row) in enumerate(zip(codes, summed, strict=True)):
        if np.count_nonzero(row) != 1 or not row[np.argmax(mine)]:  # exact zeros stay zero
            kinds = [_KINDS[k] for k in np.flatnonzero(row)]
            raise MismatchError(
                f"{site}: {labels[i]}: ranks disagree on its gradient: this rank has "
                f"{_KINDS[np.argmax(mine)]}, the ranks together have {', '.join(kinds)}"
            )
    return summed


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
            process_set = api.registered_process_set(process_set)  # ranks, from a config
        self.process_set = process_set
        self.shared_results = bool(shared_results)
        self.local_sources = LocalSources(scale_local_gradients)
        self.op = as_reduce_op(op)
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        factor = float(gradient_predivide_factor)
        if not np.isfinite(factor) or factor <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {factor}")
        if factor != 1.0 and self.op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        self.gradient_predivide_factor = factor

    def __call__(self, grads, variables, base):
        """Return ``grads`` (of ``variables``, which name them) reduced over all ranks.

        The gradients of local sources are not exchanged; the manifest still holds their
        places, as no tensor, so ranks that disagree on which variables are local fail.
        """
        labels = [compat.variable_label(v, i) for i, v in enumerate(variables)]
        local = [v is not None and v in self.local_sources for v in variables]
        if any(local):
            labels = [
                f"{t} (local on this rank)" if k else t for t, k in zip(labels, local, strict=True)
            ]
        factor = self.gradient_predivide_factor
        reduced = allreduce_gradients(
            [None if k else g for g, k in zip(grads, local, strict=True)],
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
