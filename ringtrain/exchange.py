"""The framework-neutral hand-over of a list of arrays (a step's gradients) to the engine.

This is the one interface that framework bindings use (``ringtrain.tensorflow``,
``ringtrain.keras``): a binding turns its tensors into NumPy arrays, hands them over through a
``Handover`` and turns the results back. A ``Handover`` is planned once for a list's layout
and reused while the list repeats:

- **Parts.** Each entry of the list is no tensor, a dense tensor (one allreduce) or a sparse
  one (an allgather of its values and one of its indices). A part is named
  ``{site}.{entry}{suffix}``, the same on every rank.
- **Buckets.** The parts are handed over in runs (``buckets``): consecutive parts under the
  ``bucket_bytes`` setting share one submission until they fill that many bytes, and a
  larger one goes alone, the moment it is in. A bucket of allreduces with one dtype and
  one set of settings is one request to the engine, a grouped allreduce (``Bucket``):
  one meta, one handle and one negotiation a step, not one per part; its parts' results
  are views of its buffer.
- **The manifest.** With the first bucket goes a small allreduce of one one-hot row per
  entry (its kind). Ranks that disagree on the number of entries fail on its shape, and
  ranks that disagree on an entry's kind see two kinds in its row. ``collect`` checks it
  before it waits for anything else, so such ranks raise an error naming the entry
  instead of waiting for tensors that the others never send.
- **Collecting.** ``collect`` waits for the results in order; when one fails, the parts it
  did not reach are withdrawn (``withdraw``), so that they cannot collide with the next
  step's.

The binding's side is small: it submits bucket k's arrays with ``Handover.submit(k, arrays)``
when they are ready (TensorFlow from an op per bucket, JAX all at once from a host
callback), or each part alone as it comes and the manifest last (PyTorch, from a gradient
hook: ``submit_part``, ``submit_manifest``), and calls ``Handover.collect`` once per step.
Where the ranks to reduce over are this rank alone (``alone``), a binding's optimizer hands
nothing over and keeps its gradients as they are, as Horovod's do: every reduction of one
rank's tensor is that tensor.

Beside it, this module passes on what else a binding needs of the engine, so that no binding
reaches into ``ringtrain.api`` or the engine for a name they do not export: ``withdraw``,
``registered_process_set``, the names of unnamed calls (``unnamed_name``,
``unnamed_site_name``), and the ``bucket_bytes`` setting.
"""

import functools
from typing import Protocol

import numpy as np

from ringtrain import api
from ringtrain.api import registered_process_set, unnamed_name, withdraw
from ringtrain.engine.messages import unnamed_name as unnamed_site_name
from ringtrain.errors import CollectiveTimeoutError, MismatchError, RingtrainError
from ringtrain.ops import Average, Sum
from ringtrain.process_sets import resolve

NO_TENSOR, DENSE, SPARSE = range(3)
# How errors name each kind; a binding passes its own name for a sparse tensor.
KIND_NAMES = ("no tensor", "a dense tensor", "a sparse tensor")

__all__ = [
    "DENSE",
    "Bridge",
    "Bucket",
    "KIND_NAMES",
    "NO_TENSOR",
    "SPARSE",
    "Handover",
    "Part",
    "alone",
    "broadcaster",
    "bucket_bytes",
    "buckets",
    "collect",
    "described",
    "gatherer",
    "part_name",
    "predivide_factor",
    "reducer",
    "Reducer",
    "set_site",
    "registered_process_set",
    "unnamed_name",
    "unnamed_site_name",
    "withdraw",
]


class Bridge(Protocol):
    """What a framework implements to hand its tensors over through a ``Handover``.

    ``ringtrain.keras.bridges`` has PyTorch's and JAX's. TensorFlow's binding does the same
    with graph ops (``ringtrain.tensorflow.bridge``: an ``enqueue`` op per bucket and one
    ``collect`` op), so that each bucket goes as soon as backprop has computed it.
    """

    def to_numpy(self, tensor) -> np.ndarray:
        """Return ``tensor`` as a NumPy array, sharing its memory where the framework can."""

    def from_numpy(self, array, like):
        """Return NumPy ``array`` as a tensor of ``like``'s dtype, on its device."""

    def on_host(self, function, tensors) -> list:
        """Return ``function``'s NumPy results for ``tensors``' arrays, as tensors like them.

        The function runs where the framework runs host code: eagerly, or from inside a
        compiled step.
        """


def alone(process_set=None) -> bool:
    """Return True where ``process_set`` (None: every rank) is this rank and no other.

    An optimizer or tape then exchanges nothing: the reduction of one rank's gradient is the
    gradient, whatever the op (Horovod's ``_allreduce_cond``). A compiled step asks once, when
    it is traced; the answer holds, since a job keeps its size for the life of its processes
    (an elastic job is relaunched).
    """
    ranks = resolve(process_set)
    return ranks.size() == 1 and bool(ranks.included())


def bucket_bytes() -> int:
    """Return the ``bucket_bytes`` setting in force (``RINGTRAIN_BUCKET_BYTES``)."""
    return api.active_settings().bucket_bytes


class Part:
    """One array of an entry: ``start(name)`` returns the function that submits it.

    ``nbytes``: its size, None where it is not known when the hand-over is planned.
    ``reduces``: it is an allreduce, whose settings the manifest can share (so that the
    engine fuses the two). ``dtype``: its NumPy dtype where known when the hand-over is
    planned: allreduces of one dtype and ``start`` settings share a bucket's request.
    """

    __slots__ = ("entry", "suffix", "start", "nbytes", "reduces", "dtype")

    def __init__(self, entry, suffix, start, nbytes, reduces, dtype=None):
        self.entry = entry
        self.suffix = suffix
        self.start = start
        self.nbytes = nbytes
        self.reduces = reduces
        self.dtype = None if dtype is None else np.dtype(dtype)


class Bucket:
    """A bucket's parts submitted as one grouped allreduce: its handle, for ``count`` parts.

    ``describe`` names its entries in an error.
    """

    __slots__ = ("handle", "count", "describe")

    def __init__(self, handle, count, describe):
        self.handle = handle
        self.count = count
        self.describe = describe


def predivide_factor(value, op) -> float:
    """Return Horovod's ``gradient_predivide_factor`` checked: above 0, and 1 unless op Average.

    A factor f divides the gradients by f before the sum and by size / f after it, which
    keeps float16 sums in range.
    """
    factor = float(value)
    if not np.isfinite(factor) or factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {factor}")
    if factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    return factor


def set_site(base, process_set=None) -> str:
    """Return ``base`` for a site over every rank, ``base.set{id}`` for one over a process set.

    A rank outside the set has none of its sites, so they must not share names with others.
    """
    process_set_id = resolve(process_set).process_set_id
    return base if process_set_id == 0 else f"{base}.set{process_set_id}"


def part_name(site, entry, suffix="") -> str:
    """Return the engine name of entry ``entry``'s part ``suffix`` at ``site``, on every rank."""
    return f"{site}.{entry}{suffix}"


def reducer(op, prescale=1.0, postscale=1.0, read_only=False, process_set=None, compression=None):
    """Return a ``Part.start`` that allreduces with these settings (a ``Reducer``)."""
    return Reducer(op, prescale, postscale, read_only, process_set, compression)


class Reducer:
    """A ``Part.start`` that allreduces one array, or a bucket's arrays as one group.

    ``key``: its settings; parts whose reducers have equal keys may share a request.
    """

    __slots__ = ("key", "_settings")

    def __init__(self, op, prescale, postscale, read_only, process_set, compression):
        self._settings = {
            "op": op,
            "prescale_factor": prescale,
            "postscale_factor": postscale,
            "read_only": read_only,
            "process_set": process_set,
            "compression": compression,
        }
        self.key = (op, prescale, postscale, read_only, process_set, compression)

    def __call__(self, name):
        """Return the function that allreduces one array under ``name``."""
        return functools.partial(api.allreduce_async, name=name, **self._settings)

    def group(self, name):
        """Return the function that allreduces a list of arrays as one group under ``name``."""
        return functools.partial(api.grouped_allreduce_async, name=name, **self._settings)


def gatherer(process_set=None):
    """Return a ``Part.start`` that allgathers over ``process_set``."""

    def start(name):
        return functools.partial(api.allgather_async, name=name, process_set=process_set)

    return start


def broadcaster(root_rank, process_set=None):
    """Return a ``Part.start`` that broadcasts ``root_rank``'s array over ``process_set``."""

    def start(name):
        return functools.partial(
            api.broadcast_async, root_rank=root_rank, name=name, process_set=process_set
        )

    return start


class Handover:
    """How one list of entries goes to the engine; see the module docstring.

    ``kinds``: each entry's kind (``NO_TENSOR``, ``DENSE``, ``SPARSE``); ``labels`` name the
    entries in errors; ``parts``: the ``Part``s to hand over, in the order they go (a
    binding puts the last layers' gradients first: backprop makes them first). ``cap``: the
    bucket size in bytes (``bucket_bytes()``; 0 puts every part alone).
    """

    def __init__(self, site, kinds, labels, parts, cap, process_set=None, kind_names=KIND_NAMES):
        self.site = site
        self.parts = list(parts)
        self.process_set = process_set
        self.kind_names = kind_names
        codes = np.zeros((len(kinds), len(KIND_NAMES)), np.float32)
        codes[np.arange(len(kinds)), np.asarray(kinds, np.int64)] = 1
        self.codes = codes
        self.labels = list(labels)
        self.buckets = buckets([p.nbytes for p in self.parts], cap) or [[]]
        manifest = f"{site}.manifest"
        first = self.parts[0] if self.parts else None
        if first is not None and first.reduces:  # reduced like its first part: they fuse
            self._manifest = first.start(manifest)
        else:
            self._manifest = functools.partial(
                api.allreduce_async, name=manifest, op=Sum, process_set=process_set
            )
        self._groups = [self._group(b) for b in self.buckets]
        self._submitters = [
            None if group else [self._start(self.parts[k]) for k in b]
            for b, group in zip(self.buckets, self._groups, strict=True)
        ]
        self.describes = [
            f"{site}: ranks hand over different numbers of tensors (this rank: {len(kinds)})",
            *(f"{site}: {self.labels[p.entry]}" for p in self.parts),
        ]
        self.finishes = [self._check_manifest] + [None] * len(self.parts)

    def _group(self, bucket):
        """Return (submit, describe) of ``bucket`` as one grouped allreduce, or None.

        For two parts or more, every one an allreduce of one known dtype through reducers
        of equal settings; the name is the first part's, the same on every rank.
        """
        parts = [self.parts[j] for j in bucket]
        if len(parts) < 2:
            return None
        first = parts[0]
        key = getattr(first.start, "key", None)
        if (
            key is None
            or first.dtype is None
            or not all(
                p.reduces and getattr(p.start, "key", None) == key and p.dtype == first.dtype
                for p in parts
            )
        ):
            return None
        name = part_name(self.site, first.entry, first.suffix) + f".bucket{len(parts)}"
        labels = ", ".join(self.labels[p.entry] for p in parts)
        return first.start.group(name), f"{self.site}: {labels}"

    def handle_count(self, k) -> int:
        """Return how many handles ``submit(k, ...)`` returns: a grouped bucket gives one."""
        return (1 if self._groups[k] else len(self.buckets[k])) + (k == 0)

    def submit(self, k, arrays) -> list:
        """Submit bucket ``k``'s parts (``arrays``, in its order); return their handles.

        A grouped bucket gives one ``Bucket``. Bucket 0 also submits the manifest: its
        handle comes first.
        """
        group = self._groups[k]
        if group is not None:
            submit, describe = group
            handles = [Bucket(submit(list(arrays)), len(arrays), describe)]
        else:
            handles = [
                submit(array) for submit, array in zip(self._submitters[k], arrays, strict=True)
            ]
        if k == 0:
            handles.insert(0, self._manifest(self.codes))
        return handles

    def _start(self, part):
        return part.start(part_name(self.site, part.entry, part.suffix))

    def submit_manifest(self):
        """Submit the manifest alone; return its handle (``collect``'s first).

        For a binding that submits the parts as they come (``ringtrain.keras.backprop``)
        rather than by bucket: each part's handle then comes from its own ``Part.start``.
        """
        return self._manifest(self.codes)

    def submit_part(self, j, array):
        """Submit part ``j`` alone (``array``); return its handle."""
        return self._start(self.parts[j])(array)

    def submit_all(self, arrays) -> list:
        """Submit every part (``arrays`` in the parts' order); return ``collect``'s handles."""
        handles = []
        for k, bucket in enumerate(self.buckets):
            handles.extend(self.submit(k, [arrays[i] for i in bucket]))
        return handles

    def collect(self, handles, translate=None) -> list:
        """Return the parts' results, in the parts' order, from ``handles``, the manifest's first.

        ``handles`` are the buckets' handles in bucket order (runs of consecutive parts, so
        the parts' order too; a ``Bucket`` stands for its parts). The manifest is checked
        before anything else is waited for; ``translate`` is ``collect``'s.
        """
        return collect(handles, self.describes, self.finishes, self.process_set, translate)[1:]

    def _check_manifest(self, summed):
        # Each row has one non-zero column when every contributing rank agrees (joined ranks
        # contribute the op's identity); any other count means some ranks sent another kind.
        # That holds for every op with non-zero scale factors: Sum and Average keep every
        # column someone set, Max too, and Min and Product zero a column someone left out.
        names = self.kind_names
        for i, (mine, row) in enumerate(zip(self.codes, summed, strict=True)):
            if np.count_nonzero(row) != 1 or not row[np.argmax(mine)]:  # exact zeros stay zero
                kinds = [names[k] for k in np.flatnonzero(row)]
                raise MismatchError(
                    f"{self.site}: {self.labels[i]}: ranks disagree on its gradient: this rank "
                    f"has {names[np.argmax(mine)]}, the ranks together have {', '.join(kinds)}"
                )
        return summed


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


def collect(handles, describes, finishes, process_set=None, translate=None) -> list:
    """Return every result, in order, ``finishes[i]`` (or nothing, None) applied.

    ``describes`` and ``finishes`` go by result: a ``Bucket`` among ``handles`` gives its
    ``count`` results, described by its own ``describe``, with no finish. A check in
    ``finishes[0]`` can thus fail the call before it waits for the others. An engine error
    is raised with what failed in front, through ``translate(err, describe)`` where given (a
    binding's own error classes). When one fails, the handles not reached are withdrawn
    from the engine of ``process_set``; after a mismatch, which fails on every rank at the
    same handle, the ranks also wait for each other's withdrawals.
    """
    results = []
    reached = 0
    try:
        for handle in handles:
            if isinstance(handle, Bucket):
                results += _result(handle.handle, handle.describe, None, translate)
            else:
                i = len(results)
                results.append(_result(handle, describes[i], finishes[i], translate))
            reached += 1
    except BaseException as err:
        rest = [h.handle if isinstance(h, Bucket) else h for h in handles[reached:]]
        agree_as = None
        if isinstance(err, MismatchError) and rest:
            agree_as = f"{rest[0].name}.withdrawn"
        withdraw(rest, process_set, agree_as)
        raise
    return results


def _result(handle, describe, finish, translate):
    try:
        result = api.synchronize(handle)
    except RingtrainError as err:
        _raise(err, describe, translate)
    if finish is None:
        return result
    try:
        return finish(result)
    except RingtrainError as err:  # a check's own message says what failed
        _raise(err, None, translate)


def _raise(err, describe, translate):
    """Raise ringtrain error ``err`` with ``describe`` in front, as ``translate`` makes it."""
    raised = (translate or described)(err, describe)
    if raised is err:
        raise err
    raise raised from err


def described(err, describe=None):
    """Return ringtrain error ``err`` with ``describe`` (what failed) in front of its message."""
    if describe is None:
        return err
    if isinstance(err, CollectiveTimeoutError):
        return CollectiveTimeoutError(f"{describe}: {err}", err.peers, err.reported_by)
    return type(err)(f"{describe}: {err}")
