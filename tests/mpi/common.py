"""Helpers for the scripts that run under mpirun: rank-distinct data and NumPy answers."""

import sys
import traceback

import ml_dtypes
import numpy as np

import ringtrain
from ringtrain import mpi_tuning, settings

# As ringtrain.init() does, before the imports below start MPI: the scripts that drive the
# transport directly then run with the same Open MPI settings as users' jobs.
mpi_tuning.apply(settings.read().ring_chunk_bytes)

from ringtrain.buffers import BufferPool  # noqa: E402
from ringtrain.topology import Topology, discover  # noqa: E402
from ringtrain.transport.router import Transport  # noqa: E402

DTYPES = [
    np.uint8, np.int8, np.int32, np.int64, np.float16, ml_dtypes.bfloat16, np.float32,
    np.float64,
]  # fmt: skip
OPS = [ringtrain.Sum, ringtrain.Average, ringtrain.Min, ringtrain.Max, ringtrain.Product]


def rank_data(rank, shape, dtype, salt=0):
    """Return data that differs per rank, reproducible on every rank; small enough for Product."""
    rng = np.random.default_rng([rank, salt])
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -5, 6, size=shape).astype(dtype)
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def expected(op, arrays, dtype):
    """Return NumPy's answer for ``op`` over the per-rank ``arrays`` (Product wraps like ints)."""
    dtype = np.dtype(dtype)
    wide = np.float64 if dtype.kind == "f" or dtype == ml_dtypes.bfloat16 else dtype
    stack = np.stack([a.astype(wide) for a in arrays])
    if op == ringtrain.Sum:
        result = stack.sum(axis=0, dtype=wide)
    elif op == ringtrain.Average:
        total = stack.sum(axis=0, dtype=wide)
        # Integers: truncated toward zero, as Horovod (not NumPy's floor, ``//``).
        result = np.trunc(total / len(arrays)) if dtype.kind in "iu" else total / len(arrays)
    elif op == ringtrain.Min:
        result = stack.min(axis=0)
    elif op == ringtrain.Max:
        result = stack.max(axis=0)
    else:
        result = stack.prod(axis=0, dtype=wide)
    return result.astype(dtype)


def _adasum_pair(a, b):
    """Return NumPy's Adasum of two float64 vectors."""
    ab, aa, bb = a @ b, a @ a, b @ b
    ca = 1 - ab / (2 * aa) if aa > 0 else 1.0
    cb = 1 - ab / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_reference(vectors):
    """Return the Adasum of ``vectors`` (in rank order): pairs (0, 1), (2, 3), then theirs."""
    level = [np.asarray(v, np.float64).ravel() for v in vectors]
    while len(level) > 1:
        level = [_adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def tolerance(dtype):
    """Return (rtol, atol) for comparing a ``dtype`` reduction with NumPy's."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 2e-3, 2e-3
    if dtype == ml_dtypes.bfloat16:
        return 1.6e-2, 1.6e-2
    if dtype == np.float32:
        return 1e-5, 1e-5
    return 1e-12, 0


def assert_equal(got, want, what):
    """Fail with ``what`` unless ``got`` matches ``want`` in dtype, shape and values."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "iu":
        ok = np.array_equal(got, want)
    else:
        rtol, atol = tolerance(want.dtype)
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol, atol)
    if not ok:
        bad = np.argwhere(~np.isclose(got.astype(np.float64), want.astype(np.float64)))[:5]
        raise AssertionError(
            f"{what}: differs at {bad.tolist()}: got {got.ravel()[:8]}, expected {want.ravel()[:8]}"
        )


def expect_error(kind, needle, call, *args, **kwargs):
    """Fail unless ``call(*args, **kwargs)`` raises ``kind`` with ``needle`` in its message."""
    try:
        call(*args, **kwargs)
    except kind as err:
        assert needle in str(err), f"{needle!r} not in {err}"
    else:
        raise AssertionError(f"{call.__name__}{args} did not raise {kind.__name__}")


def same_bits_everywhere(array, what):
    """Fail unless every rank holds bitwise-identical ``array`` (checked over plain MPI)."""
    from mpi4py import MPI

    digest = np.ascontiguousarray(array).view(np.uint8).tobytes()
    everyone = MPI.COMM_WORLD.allgather(digest)
    assert all(d == everyone[0] for d in everyone), f"{what}: ranks hold different bits"


def pretend_hosts(comm, per_host) -> Topology:
    """Return the topology of ``comm`` as if every ``per_host`` ranks shared a host."""
    r, n = comm.Get_rank(), comm.Get_size()
    hosts = tuple(i - i % per_host for i in range(n))
    local = [i for i in range(n) if hosts[i] == hosts[r]]
    leaders = sorted(set(hosts))
    names = tuple(f"host{h}" for h in hosts)
    return Topology(
        r, n, local.index(r), len(local), leaders.index(hosts[r]), len(leaders), hosts, names,
        tuple(range(n)),
    )  # fmt: skip


def transport(comm, **overrides):
    """Return a ``Transport`` over ``comm`` (collective) with settings ``overrides``."""
    return Transport(comm, discover(comm), settings.read(**overrides), BufferPool())


def main(body):
    """Run ``body`` under ringtrain; on any failure print it with the rank and abort the job."""
    try:
        body()
    except BaseException:
        sys.stderr.write(
            f"rank {ringtrain.rank() if ringtrain.is_initialized() else '?'}: "
            f"FAILED\n{traceback.format_exc()}"
        )
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
