"""The NumPy-level API with Horovod's names: init, the collectives, handles, join.

Every collective is matched across ranks by name, so every rank must submit the same names
(in any order). An unnamed call is named after its call site (the caller's file and line)
and how many calls of its kind that site has made (``unnamed_name``): every rank must make
the same unnamed calls from the same lines, and the coordinator fails, naming each rank's
call sites, unnamed calls that have drifted apart across ranks. Blocking calls synchronise
with every other rank; ``*_async`` calls return a handle at once, and ``synchronize(handle)``
waits for it.
"""

import functools
import math
import os
import pickle

import numpy as np

from ringtrain import call_site, interop, runtime
from ringtrain import settings as settings_module
from ringtrain.compression import wire_dtype
from ringtrain.dtypes import SUPPORTED, check_supported, is_integer, name_of, reduction_dtype
from ringtrain.engine import messages
from ringtrain.engine.handle import GroupHandle, Handle
from ringtrain.engine.turns import BlockingCalls
from ringtrain.kernels import is_c_contiguous, is_device_array
from ringtrain.ops import Average, ReduceOp, as_reduce_op, resolve_op
from ringtrain.process_sets import ProcessSet, global_process_set, resolve
from ringtrain.topology import Topology
from ringtrain.transport.schedule import segment_bounds

_SUPPORTED = frozenset(SUPPORTED)
_FLOAT32 = np.dtype(np.float32)
_calls = BlockingCalls()  # per thread (a threading.local): its blocking call in progress


def init(comm=None, process_sets=None, **settings) -> None:
    """Start ringtrain on ``comm`` (an mpi4py communicator, a list of world ranks, or None).

    None means ``MPI.COMM_WORLD``. ``process_sets``: ``ProcessSet``s (or lists of ranks) to
    register at once, as ``add_process_set`` does; Horovod's ``"dynamic"`` registers none
    (sets may always be added later here). Keyword arguments override
    ``RINGTRAIN_*`` settings (see ``ringtrain.settings.Settings``). Collective over
    ``comm``; a second call is a no-op (and refuses ``process_sets``).
    """
    if process_sets == "dynamic":
        process_sets = None
    if runtime.is_running():
        if process_sets:
            raise ValueError(
                "ringtrain is already initialised, so init() cannot register process sets; "
                "use add_process_set()"
            )
        return
    runtime.start(comm, settings_module.read(**settings))
    for process_set in process_sets or ():
        add_process_set(process_set)


def shutdown() -> None:
    """Stop ringtrain on every rank (pending handles fail), free its communicators, unpin.

    Threads that ``init()`` pinned to this rank's share of the cores get back the CPUs they
    had before it.
    """
    runtime.stop()


def add_process_set(process_set) -> ProcessSet:
    """Register ``process_set`` (a ``ProcessSet`` or a list of ranks) and return it.

    Collective over the whole job: every rank must add the same sets in the same order
    (ranks that add different ones all get a ValueError). The set's ranks start an engine
    for it, with its own thread and shared-memory file; the timeline records only the
    whole job's collectives.
    """
    current = runtime.current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set!r} is already registered")
    registry = current.process_sets
    proposals = allgather_object(process_set.ranks, name=f"add_process_set.{registry.added}")
    # Every rank checks the same proposals against the same registry, so all agree.
    if any(p != proposals[0] for p in proposals):
        parts = ", ".join(f"rank {r}: {p}" for r, p in enumerate(proposals))
        raise ValueError(f"add_process_set: ranks add different process sets ({parts})")
    outside = [r for r in process_set.ranks if not 0 <= r < size()]
    if outside:
        raise ValueError(f"process set ranks {outside} are outside [0, {size()})")
    known = registry.with_ranks(process_set.ranks)
    if known is not None:
        raise ValueError(f"a process set of ranks {known.ranks} is already registered: {known!r}")
    current.add_process_set(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` and stop its engine; return False for the global set.

    Collective over the whole job, like ``add_process_set``. Its pending handles fail.
    """
    registry = runtime.current().process_sets
    if process_set is global_process_set:
        return False
    if not registry.holds(process_set):
        raise ValueError(f"{process_set!r} is not a registered process set")
    count = registry.begin_removal()
    ids = allgather_object(process_set.process_set_id, name=f"remove_process_set.{count}")
    if any(i != ids[0] for i in ids):
        parts = ", ".join(f"rank {r}: {i}" for r, i in enumerate(ids))
        raise ValueError(
            f"remove_process_set: ranks remove different process sets, by id ({parts})"
        )
    registry.remove(process_set)
    return True


def _engine_for(process_set):
    """Return the engine that runs collectives over ``process_set`` (None: every rank)."""
    engine = runtime.current().engine
    if process_set is None or process_set is global_process_set:
        return engine
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(
            f"{process_set!r} is not registered: pass it to init(process_sets=...) or "
            "add_process_set() first"
        )
    if process_set.engine is None:
        raise ValueError(
            f"rank {rank()} is not in {process_set!r}: only its ranks run its collectives"
        )
    return process_set.engine


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """Return the registered process set with ``process_set_id`` (0: ``global_process_set``)."""
    return runtime.current().process_sets.by_id(process_set_id)


def registered_process_set(ranks) -> ProcessSet | None:
    """Return the registered process set of ``ranks`` (None for every rank's), or raise."""
    ranks = sorted(ranks)
    if ranks == list(range(size())):
        return None
    known = runtime.current().process_sets.with_ranks(ranks)
    if known is None:
        raise ValueError(
            f"no process set of ranks {ranks} is registered; add it (add_process_set) first"
        )
    return known


def is_initialized() -> bool:
    """Return True between ``init()`` and ``shutdown()``."""
    return runtime.is_running()


def active_settings() -> settings_module.Settings:
    """Return the settings that ``init()`` read; before it, those of the environment."""
    return runtime.current().settings if runtime.is_running() else settings_module.read()


def _topo() -> Topology:
    return runtime.current().topology


def size() -> int:
    """Return the number of ranks."""
    return _topo().size


def rank() -> int:
    """Return this process's rank."""
    return _topo().rank


def local_size() -> int:
    """Return the number of ranks on this host."""
    return _topo().local_size


def local_rank() -> int:
    """Return this process's rank among those on its host."""
    return _topo().local_rank


def cross_size() -> int:
    """Return the number of hosts that have a rank with this process's local rank."""
    return _topo().cross_size


def cross_rank() -> int:
    """Return the index of this process's host among those with its local rank."""
    return _topo().cross_rank


def is_homogeneous() -> bool:
    """Return True if every host runs the same number of ranks."""
    return _topo().homogeneous


# -- inputs ---------------------------------------------------------------------------


def _host_array(tensor, what: str) -> np.ndarray:
    if type(tensor) is np.ndarray and tensor.flags.c_contiguous and tensor.dtype in _SUPPORTED:
        return tensor  # the common case, checked cheaply
    array = np.asarray(tensor)
    try:
        check_supported(array.dtype)
    except TypeError as err:
        raise TypeError(f"{what}: {err}") from None
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return array if array.flags.c_contiguous else array.copy(order="C")


def _input(tensor, what: str, allow_device: bool = False):
    """Return ``tensor`` checked, as the engine takes it, and its results' way back.

    The way back is ``interop.adopt``'s: None for NumPy and other plain inputs.
    """
    if type(tensor) is np.ndarray:  # the common case, with no way back
        return _host_array(tensor, what), None
    tensor, give_back = interop.adopt(tensor)
    return _checked_input(tensor, what, allow_device), give_back


def _checked_input(tensor, what: str, allow_device: bool):
    if is_device_array(tensor):
        if not allow_device:
            raise TypeError(f"{what} takes host (NumPy) arrays; got a device array")
        _check_device_layout(tensor, what)  # first: a strided framework array comes as it is
        check_supported(tensor.dtype)
        return tensor
    return _host_array(tensor, what)


def _check_device_layout(array, what: str):
    """Raise ValueError unless the CUDA array ``array`` is C-contiguous."""
    if not is_c_contiguous(array):
        raise ValueError(
            f"{what}: a CUDA array of shape {tuple(array.shape)} must be C-contiguous; "
            "pass a contiguous copy"
        )


def _name(kind: str, name, process_set=None) -> str:
    if name is not None:
        return str(name)
    return unnamed_name(kind, process_set)


def unnamed_name(kind: str, process_set=None) -> str:
    """Return the name of an unnamed ``kind`` call made here: its call site and count.

    The site is the innermost caller outside ringtrain (``file.py:line``); each site counts
    its own calls of each kind over each process set, so a rank's n-th call from a line pairs
    with every other rank's n-th call from it, whatever calls the ranks made elsewhere.
    """
    return runtime.current().unnamed(kind, process_set, call_site.user_call_site())


def _scale(value, label, dtype) -> float:
    if value == 1.0 and type(value) in (float, int):
        return 1.0
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{label} must be a number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{label} must be finite, got {value}")
    if value != 1.0 and is_integer(dtype):
        raise ValueError(f"{label} must be 1.0 for integer dtype {dtype}, got {value}")
    return value


def _adopted_out(out, give_back):
    """Return ``out`` as the engine takes it, and the way back: to ``out`` itself where adopted."""
    adopted, out_back = interop.adopt(out)
    if out_back is None:
        return out, None  # a NumPy out: the engine's result is ``out`` itself
    return adopted, lambda _result: out


def _given_back(handle, give_back):
    """Return ``handle``, which gives its result back through ``give_back`` (if not None)."""
    if give_back is not None:
        handle.give_back_as(give_back)
    return handle


def _check_out(out, array):
    if out is None:
        return None
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out must be writable; got a read-only array")
    if is_device_array(array) != is_device_array(out):
        raise TypeError("out must live where the input lives (host or device)")
    if tuple(out.shape) != tuple(array.shape) or np.dtype(out.dtype) != np.dtype(array.dtype):
        raise ValueError(
            f"out has shape {tuple(out.shape)} and dtype {out.dtype}; expected shape "
            f"{tuple(array.shape)} and dtype {array.dtype}"
        )
    if not is_c_contiguous(out):
        raise ValueError("out must be C-contiguous")
    return out


# -- collectives ----------------------------------------------------------------------
#
# Every collective runs over ``process_set`` (a registered ``ProcessSet``; None or
# ``global_process_set``: every rank). Only the set's ranks may call it; ``root_rank`` is
# a rank of the whole job, and results come in the order of the set's ranks.


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    out=None,
    read_only=False,
    process_set=None,
    compression=None,
) -> Handle:
    """Start reducing ``tensor`` over all ranks (default op Average); return a handle.

    float16 and bfloat16 are reduced in float32. Integer Average is a floor division of the
    sum. ``out`` (same shape and dtype) receives the result instead of a new array. With
    ``read_only=True`` the result may be a read-only array in shared memory that every rank
    of the host reads (one copy fewer); for callers that never write to results.
    ``compression``: ``Compression.fp16`` or ``Compression.bf16`` send the partial sums of a
    float32 reduction (float32, float16 and bfloat16 tensors) over the links as 16-bit
    values, half the bytes, rounding once per hop; other dtypes and Adasum pass through
    uncompressed. Every rank must give the same compression (docs/api.md).
    """
    engine = _engine_for(process_set)
    array, give_back = _input(tensor, "allreduce", allow_device=True)
    if out is not None:
        out, give_back = _adopted_out(out, give_back)
    meta = _allreduce_meta(
        _name("allreduce", name, process_set),
        array,
        array.shape,
        op,
        average,
        prescale_factor,
        postscale_factor,
        process_set=process_set,
        compression=compression,
    )
    handle = _submit(engine, meta, array, _check_out(out, array), bool(read_only))
    return _given_back(handle, give_back)


def _allreduce_meta(
    name,
    array,
    shape,
    op,
    average,
    prescale,
    postscale,
    group=None,
    process_set=None,
    compression=None,
):
    op = resolve_op(op, average)
    dtype = np.dtype(array.dtype)
    if op == ReduceOp.Average and is_integer(dtype) and is_device_array(array):
        raise TypeError(f"integer Average is not supported on device arrays ({dtype})")
    if op == ReduceOp.Adasum:
        _check_adasum(dtype, is_device_array(array), len(resolve(process_set).ranks))
    # Positional: a call per tensor of a step, and keywords cost a named tuple a third more.
    return messages.Meta(
        name,
        messages.ALLREDUCE,
        name_of(dtype),
        shape,
        int(op),
        _scale(prescale, "prescale_factor", dtype),
        _scale(postscale, "postscale_factor", dtype),
        -1,
        None,
        group,
        None if compression is None else _wire(compression, dtype, op),
    )


def _wire(compression, dtype, op) -> str | None:
    """Return the 16-bit dtype an allreduce sends (``compression``), or None: uncompressed.

    Only float32 reductions are compressed, and not Adasum: the rest pass through.
    """
    if compression is None:
        return None
    if not hasattr(compression, "wire_dtype"):
        raise TypeError(
            "compression must be ringtrain.Compression.none, .fp16 or .bf16 (a strategy with "
            f"a wire_dtype), got {compression!r}"
        )
    wire = wire_dtype(compression)
    if wire is None or op == ReduceOp.Adasum or reduction_dtype(dtype) != _FLOAT32:
        return None
    return wire


def _check_adasum(dtype, on_device, ranks):
    if is_integer(dtype):
        raise TypeError(f"Adasum reduces floating-point tensors; got {dtype}")
    if on_device:
        raise TypeError("Adasum runs on host (NumPy) arrays; got a device array")
    if ranks & (ranks - 1):  # Adasum's tree pairs ranks level by level
        raise ValueError(f"Adasum needs a power-of-two number of ranks; this call has {ranks}")


def allreduce(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    out=None,
    read_only=False,
    process_set=None,
    compression=None,
):
    """Reduce ``tensor`` over all ranks and return the result (see ``allreduce_async``)."""
    return _blocking(
        allreduce_async,
        tensor,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        out,
        read_only,
        process_set,
        compression,
    )


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    compression=None,
    read_only=False,
) -> Handle:
    """Start reducing ``tensors`` (one dtype) together as one unit; return one handle.

    The group is negotiated and fused as a whole, so it costs the engine one submission, not
    one per tensor. ``synchronize`` on the handle returns the list of results, in order;
    those the group fused are views of one buffer. ``compression`` and ``read_only`` as in
    ``allreduce_async``: with ``read_only=True`` the results may be read-only views of one
    result in shared memory that every rank of the host reads.
    """
    engine = _engine_for(process_set)
    arrays, give_back = _group_inputs(tensors)
    first = arrays[0]
    shapes = tuple(tuple(a.shape) for a in arrays)
    total = sum(math.prod(s) for s in shapes)
    meta = _allreduce_meta(
        _name("grouped_allreduce", name, process_set),
        first,
        (total,),
        op,
        average,
        prescale_factor,
        postscale_factor,
        group=shapes,
        process_set=process_set,
        compression=compression,
    )
    return _given_back(_submit(engine, meta, arrays, None, bool(read_only)), give_back)


def _group_inputs(tensors):
    """Return the checked arrays of a group (one dtype, all on the host or all on a device).

    Also returns the way back of their results (``_input``), or None where every result
    goes back as it is. A group of C-contiguous NumPy arrays of one supported dtype, the
    common case, is checked in three passes over the list instead of a call per tensor.
    """
    arrays = list(tensors)
    if not arrays:
        raise ValueError("grouped_allreduce needs at least one tensor; got an empty list")
    if all(type(a) is np.ndarray and a.flags.c_contiguous for a in arrays):
        kinds = {a.dtype for a in arrays}
        if len(kinds) == 1 and arrays[0].dtype in _SUPPORTED:
            return arrays, None
    arrays, give_backs = zip(
        *[_input(t, "grouped_allreduce", allow_device=True) for t in arrays], strict=True
    )
    arrays = list(arrays)
    first = arrays[0]
    places = ["device" if is_device_array(a) else "host" for a in arrays]
    for i, array in enumerate(arrays):
        if array.dtype != first.dtype or places[i] != places[0]:
            raise TypeError(
                f"grouped_allreduce: tensor {i} is a {array.dtype} {places[i]} array, but "
                f"tensor 0 is {first.dtype} on the {places[0]}; every tensor of a group must "
                "share its dtype and where it lives"
            )
    if not any(give_backs):
        return arrays, None
    return arrays, functools.partial(_each_given_back, give_backs)


def _each_given_back(give_backs, results) -> list:
    """Return each of ``results`` given back through its own way (None: as it is)."""
    return [r if g is None else g(r) for g, r in zip(give_backs, results, strict=True)]


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    compression=None,
    read_only=False,
) -> list:
    """Reduce ``tensors`` as one group and return the results in order."""
    return _blocking(
        grouped_allreduce_async,
        tensors,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
        read_only,
    )


def allgather_async(tensor, name=None, process_set=None) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0 (sizes may differ)."""
    engine = _engine_for(process_set)
    array, meta, give_back = _allgather_request(tensor)
    meta = meta._replace(name=_name("allgather", name, process_set))
    return _given_back(_submit(engine, meta, array), give_back)


def _allgather_request(tensor):
    """Return the array, the still unnamed meta and the way back of an allgather of ``tensor``.

    Callers name the meta after the checks: an unnamed call that fails takes no number.
    """
    array, give_back = _input(tensor, "allgather")
    if array.ndim == 0:
        raise ValueError("allgather needs an array of at least one dimension; got a 0-d array")
    meta = messages.Meta(
        name="", kind=messages.ALLGATHER, dtype=name_of(array.dtype), shape=array.shape
    )
    return array, meta, give_back


def allgather(tensor, name=None, process_set=None):
    """Return every rank's ``tensor`` concatenated along dimension 0, in rank order."""
    return _blocking(allgather_async, tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=None) -> GroupHandle:
    """Start an allgather of each of ``tensors``; return one handle for them all.

    ``synchronize`` on it returns the list of results, in order.
    """
    engine = _engine_for(process_set)
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor; got an empty list")
    # Every tensor is checked before any is submitted: a bad one leaves nothing in flight.
    requests = [_allgather_request(t) for t in tensors]
    return _submit_group(engine, requests, _name("grouped_allgather", name, process_set))


def grouped_allgather(tensors, name=None, process_set=None) -> list:
    """Return each of ``tensors`` concatenated over the ranks along dimension 0, in order."""
    return _blocking(grouped_allgather_async, tensors, name, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=None) -> Handle:
    """Start sending ``root_rank``'s ``tensor`` to every rank."""
    engine = _engine_for(process_set)
    array, give_back = _input(tensor, "broadcast")
    root = _root(root_rank, process_set)
    meta = messages.Meta(
        name=_name("broadcast", name, process_set),
        kind=messages.BROADCAST,
        dtype=name_of(array.dtype),
        shape=array.shape,
        root=root,
    )
    return _given_back(_submit(engine, meta, array), give_back)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return ``root_rank``'s ``tensor`` on every rank (a new array)."""
    return _blocking(broadcast_async, tensor, root_rank, name, process_set)


def _root(root_rank, process_set) -> int:
    """Return the index of job rank ``root_rank`` in ``process_set``, checking it is there."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int | np.integer):
        raise TypeError(f"root_rank must be an int, got {root_rank!r}")
    ranks = resolve(process_set).ranks
    if root_rank not in ranks:
        if process_set is None or process_set is global_process_set:
            raise ValueError(f"root_rank {root_rank} is outside [0, {len(ranks)})")
        raise ValueError(f"root_rank {root_rank} is not in {process_set!r}")
    return ranks.index(root_rank)


def alltoall_async(tensor, splits=None, name=None, process_set=None) -> Handle:
    """Start sending ``splits[j]`` rows of ``tensor`` to rank j, receiving rows from each rank.

    Without ``splits`` the rows are spread evenly, the first ranks getting one more.
    """
    engine = _engine_for(process_set)
    array, give_back = _input(tensor, "alltoall")
    if array.ndim == 0:
        raise ValueError("alltoall needs an array of at least one dimension; got a 0-d array")
    n = len(resolve(process_set).ranks)
    if splits is None:
        splits = tuple(hi - lo for lo, hi in segment_bounds(array.shape[0], n))
    else:
        splits = tuple(int(s) for s in np.asarray(splits).reshape(-1))
        if len(splits) != n or min(splits, default=0) < 0 or sum(splits) != array.shape[0]:
            raise ValueError(
                f"alltoall splits {list(splits)} must be {n} non-negative counts summing to "
                f"the first dimension, {array.shape[0]}"
            )
    meta = messages.Meta(
        name=_name("alltoall", name, process_set),
        kind=messages.ALLTOALL,
        dtype=name_of(array.dtype),
        shape=array.shape,
        splits=splits,
    )
    return _given_back(_submit(engine, meta, array), give_back)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Return the rows every rank sent to this one, concatenated in rank order."""
    return _blocking(alltoall_async, tensor, splits, name, process_set)


def reducescatter_async(
    tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
) -> Handle:
    """Start reducing ``tensor`` over all ranks, keeping this rank's share of dimension 0.

    Rows are shared out evenly, the first ranks getting one more.
    """
    engine = _engine_for(process_set)
    array, meta, give_back = _reducescatter_request(tensor, op, prescale_factor, postscale_factor)
    meta = meta._replace(name=_name("reducescatter", name, process_set))
    return _given_back(_submit(engine, meta, array), give_back)


def _reducescatter_request(tensor, op, prescale, postscale):
    """Return the array, unnamed meta and way back of a reducescatter of ``tensor``, checked."""
    array, give_back = _input(tensor, "reducescatter")
    if array.ndim == 0:
        raise ValueError("reducescatter needs an array of at least one dimension; got 0-d")
    op = as_reduce_op(op)
    if op == ReduceOp.Adasum:
        raise ValueError("reducescatter takes op Sum, Average, Min, Max or Product, not Adasum")
    meta = messages.Meta(
        name="",
        kind=messages.REDUCESCATTER,
        dtype=name_of(array.dtype),
        shape=array.shape,
        op=int(op),
        prescale=_scale(prescale, "prescale_factor", array.dtype),
        postscale=_scale(postscale, "postscale_factor", array.dtype),
    )
    return array, meta, give_back


def reducescatter(
    tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
):
    """Return this rank's share of ``tensor`` reduced over all ranks."""
    return _blocking(
        reducescatter_async, tensor, op, name, prescale_factor, postscale_factor, process_set
    )


def grouped_reducescatter_async(
    tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
) -> GroupHandle:
    """Start a reducescatter of each of ``tensors``; return one handle for them all."""
    engine = _engine_for(process_set)
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor; got an empty list")
    requests = [_reducescatter_request(t, op, prescale_factor, postscale_factor) for t in tensors]
    return _submit_group(engine, requests, _name("grouped_reducescatter", name, process_set))


def grouped_reducescatter(
    tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None
) -> list:
    """Return this rank's share of each of ``tensors`` reduced over the ranks, in order."""
    return _blocking(
        grouped_reducescatter_async,
        tensors,
        op,
        name,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Return ``root_rank``'s ``obj`` (any picklable object) on every rank."""
    _engine_for(process_set)
    _root(root_rank, process_set)
    payload = pickle.dumps(obj) if rank() == root_rank else b""
    gathered = allgather(
        np.frombuffer(payload, np.uint8),
        name=_name("broadcast_object", name, process_set),
        process_set=process_set,
    )
    return pickle.loads(gathered.tobytes())


def allgather_object(obj, name=None, process_set=None) -> list:
    """Return the list of every rank's ``obj`` (any picklable object), in rank order."""
    _engine_for(process_set)
    payload = np.frombuffer(pickle.dumps(obj), np.uint8)
    base = _name("allgather_object", name, process_set)
    lengths = allgather(
        np.array([payload.size], np.int64), name=f"{base}.lengths", process_set=process_set
    )
    data = allgather(payload, name=base, process_set=process_set).tobytes()
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    return [pickle.loads(data[offsets[i] : offsets[i + 1]]) for i in range(len(lengths))]


def join() -> int:
    """Declare this rank out of data; return the rank that joined last, once all have.

    Until every rank has joined, this rank keeps taking part in the others' allreduces
    (contributing the op's identity; Average divides by the ranks that contributed) and
    allgathers (contributing no rows). Alltoall and reducescatter fail while a rank waits
    here. It covers the whole job's collectives, not those of process sets.
    """
    engine = runtime.current().engine
    meta = messages.Meta(name=messages.JOIN_NAME, kind=messages.JOIN, dtype="uint8", shape=())
    return _blocking(_submit, engine, meta, None)


def barrier(process_set=None) -> None:
    """Return once every rank has called ``barrier()``; ranks that have joined count as there.

    It goes through the engine like any unnamed collective (``unnamed_name``), so every rank
    must call it from the same lines, as many times.
    """
    name = _name("barrier", None, process_set)
    allreduce(np.zeros(0, np.uint8), op=ReduceOp.Sum, name=name, process_set=process_set)


def start_timeline(file_path, mark_cycles=False) -> None:
    """Start writing a timeline to ``file_path``, as ``RINGTRAIN_TIMELINE`` does at ``init()``.

    Call it on every rank: rank 0 writes the file, or every rank its own where the path holds
    ``{rank}``. Raises ValueError for an empty path, for ``mark_cycles=True`` (the engine
    has no fixed cycles to mark), and while a timeline is being written.
    """
    engine = runtime.current().engine
    if not file_path:
        raise ValueError("start_timeline needs a file path; got an empty one")
    if mark_cycles:
        raise ValueError(
            "start_timeline(mark_cycles=True) is not supported: ringtrain's engine runs when "
            "work arrives, not in fixed cycles, so it has none to mark"
        )
    engine.start_timeline(os.fspath(file_path))


def stop_timeline() -> None:
    """Stop writing the timeline (the file stays valid JSON); nothing happens if none is."""
    runtime.current().engine.stop_timeline()


def withdraw(handles, process_set=None, agree_as=None) -> None:
    """Take back submissions whose results nobody will wait for (``Engine.withdraw``).

    With ``agree_as`` (a name that every rank gives alike, such as that of the tensor that
    failed), a collective for a call that failed on every rank: it returns once every rank
    of ``process_set`` has withdrawn its part, so that no rank submits a name again while
    another's earlier submission of it can still be matched with it.
    """
    engine = resolve(process_set).engine  # None once stopped: then nothing is in flight
    if engine is None:
        return
    engine.withdraw(handles)
    if agree_as is not None:
        # Each rank's withdrawals reach the coordinator before this, in order on one channel.
        empty = np.zeros(0, np.uint8)
        allreduce(empty, op=ReduceOp.Sum, name=agree_as, process_set=process_set)


def synchronize(handle: Handle | GroupHandle):
    """Wait for ``handle`` and return its result, or raise its error."""
    return handle.wait()


def _submit(engine, meta, array, out=None, read_only=False) -> Handle:
    """Queue one collective with ``engine``; return its handle (``turns.BlockingCalls``)."""
    return _calls.submit(engine, meta, array, out, read_only)


def _submit_group(engine, requests, base) -> GroupHandle:
    """Queue checked (array, meta, way back) ``requests`` as ``base``.0, .1, ...; one handle."""
    return GroupHandle(
        _given_back(_submit(engine, meta._replace(name=f"{base}.{i}"), array), give_back)
        for i, (array, meta, give_back) in enumerate(requests)
    )


def _blocking(start, *args):
    """Call ``start(*args)``, which submits one collective, and wait for its handle.

    The engine thread is not woken for the submission: the waiting caller takes the engine's
    turns itself, which saves a hand-off between threads each way, or wakes the thread where
    it cannot (``ringtrain.engine.turns``).
    """
    return _calls.run(start, *args)


def poll(handle: Handle | GroupHandle) -> bool:
    """Return True if ``handle`` has completed (result or error)."""
    return handle.done()
