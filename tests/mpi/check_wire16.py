"""Allreduce with 16-bit values on the wire: bit for bit the simulated ring, within the bound.

Run with a small RINGTRAIN_RING_CHUNK_BYTES, so that tensors cross in many chunks. Every
result is compared bit for bit with ``wire_ring.simulate`` (which rounds to 16 bits at each
hop of the schedule) and with every other rank's, and a Sum with the float64 sum within
``wire_ring.error_bound``.
"""

import numpy as np
from common import assert_equal, expect_error, expected, main, rank_data, same_bits_everywhere
from wire_ring import WIRES, error_bound, simulate, simulate_group

import ringtrain
from ringtrain import runtime

SHAPES = [(0,), (1,), (7,), (3, 5), (1001,), (10007,)]
OPS = [ringtrain.Sum, ringtrain.Average, ringtrain.Min, ringtrain.Max, ringtrain.Product]


def assert_bits(got, want, what):
    """Fail unless ``got`` has ``want``'s dtype, shape and bits."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    bits = f"u{want.dtype.itemsize}"
    differ = np.flatnonzero(got.reshape(-1).view(bits) != want.reshape(-1).view(bits))
    assert not differ.size, (
        f"{what}: {differ.size} elements differ from the simulated 16-bit ring, first at "
        f"{differ[:4].tolist()}: got {got.reshape(-1)[differ[:4]]}, "
        f"expected {want.reshape(-1)[differ[:4]]}"
    )


def ring_op(op, size):
    """Return the (op, postscale) the ring runs for ``op``: Average is Sum times 1/size."""
    return (ringtrain.Sum, 1.0 / size) if op == ringtrain.Average else (op, 1.0)


def everyone(shape, dtype, salt):
    """Return every rank's data for ``shape``, as float32 (what the ring reduces)."""
    n = ringtrain.size()
    return [rank_data(i, shape, dtype, salt) for i in range(n)]


def check_lone(name):
    """Lone float32 tensors of every shape and op; out=, in place, read_only and scales."""
    r, n = ringtrain.rank(), ringtrain.size()
    strategy = getattr(ringtrain.Compression, name)
    wire = WIRES[name]
    for op in OPS:
        ring, postscale = ring_op(op, n)
        for salt, shape in enumerate(SHAPES):
            data = everyone(shape, np.float32, salt)
            what = f"{name} {op.name} {shape}"
            got = ringtrain.allreduce(data[r], op=op, name=what, compression=strategy)
            want = simulate([d.reshape(-1) for d in data], ring, postscale, wire)[r]
            assert_bits(got, want.reshape(shape), what)
            same_bits_everywhere(got, what)
    data = everyone((4099,), np.float32, 50)
    want = simulate(data, ringtrain.Sum, 1.0, wire)[r]
    out = np.empty_like(data[r])
    assert ringtrain.allreduce(data[r], op=ringtrain.Sum, out=out, compression=strategy) is out
    assert_bits(out, want, f"{name} out=")
    mine = data[r].copy()
    ringtrain.allreduce(mine, op=ringtrain.Sum, out=mine, compression=strategy)
    assert_bits(mine, want, f"{name} in place")
    shared = ringtrain.allreduce(data[r], op=ringtrain.Sum, read_only=True, compression=strategy)
    assert_bits(shared, want, f"{name} read_only")
    # Scales: the prescale goes into the float32 input, the postscale into the last hop.
    scaled = [d * np.float32(0.5) for d in data]
    want = simulate(scaled, ringtrain.Sum, 3.0, wire)[r]
    got = ringtrain.allreduce(
        data[r], op=ringtrain.Sum, prescale_factor=0.5, postscale_factor=3.0, compression=strategy
    )
    assert_bits(got, want, f"{name} scaled")
    # Started asynchronously, several at once: each goes alone (a ring chunk or more).
    handles = [
        ringtrain.allreduce_async(
            d[r], op=ringtrain.Sum, name=f"{name}.async.{i}", compression=strategy
        )
        for i, d in enumerate([data, scaled])
    ]
    results = [ringtrain.synchronize(h) for h in handles]
    assert_bits(results[0], simulate(data, ringtrain.Sum, 1.0, wire)[r], f"{name} async")
    assert_bits(results[1], simulate(scaled, ringtrain.Sum, 1.0, wire)[r], f"{name} async 2")


def check_grouped(name, direct_bytes):
    """Check a group: small members fused in one buffer, a large one alone, for each op."""
    r, n = ringtrain.rank(), ringtrain.size()
    strategy = getattr(ringtrain.Compression, name)
    shapes = [(1,), (7,), (0,), (3, 5), (2, 9), (3001,)]
    for op in OPS:
        ring, postscale = ring_op(op, n)
        members = [
            [rank_data(i, s, np.float32, 60 + k) for k, s in enumerate(shapes)] for i in range(n)
        ]
        what = f"{name} grouped {op.name}"
        got = ringtrain.grouped_allreduce(members[r], op=op, name=what, compression=strategy)
        want = simulate_group(members, ring, postscale, WIRES[name], direct_bytes)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_bits(g, w, f"{what} member {k}")
            same_bits_everywhere(g, f"{what} member {k}")


def check_other_dtypes(name):
    """16-bit floats are reduced in float32 and compressed; the rest pass through exactly."""
    r = ringtrain.rank()
    strategy = getattr(ringtrain.Compression, name)
    for dtype in (np.float16, WIRES["bf16"]):
        data = everyone((999,), dtype, 70)
        got = ringtrain.allreduce(data[r], op=ringtrain.Sum, compression=strategy)
        wide = [d.astype(np.float32) for d in data]
        want = simulate(wide, ringtrain.Sum, 1.0, WIRES[name])[r].astype(dtype)
        assert_bits(got, want, f"{name} {np.dtype(dtype)} input")
    for dtype in (np.float64, np.int32, np.uint8):
        data = everyone((999,), dtype, 71)
        got = ringtrain.allreduce(data[r], op=ringtrain.Sum, compression=strategy)
        want = ringtrain.allreduce(data[r], op=ringtrain.Sum)
        assert_bits(got, want, f"{name} passes {np.dtype(dtype)} through")
        assert_equal(got, expected(ringtrain.Sum, data, dtype), f"{name} {np.dtype(dtype)}")


def check_bound(name):
    """Sum and Average of a large tensor: within the documented bound of the float64 answer."""
    r, n = ringtrain.rank(), ringtrain.size()
    strategy = getattr(ringtrain.Compression, name)
    data = [
        np.random.default_rng([i, 80]).standard_normal(200_003).astype(np.float32) for i in range(n)
    ]
    exact = np.sum([d.astype(np.float64) for d in data], axis=0)
    for op, postscale in ((ringtrain.Sum, 1.0), (ringtrain.Average, 1.0 / n)):
        got = ringtrain.allreduce(data[r], op=op, compression=strategy).astype(np.float64)
        error = np.abs(got - exact * postscale)
        bound = error_bound(data, name, postscale)
        worst = int(np.argmax(error - bound))
        assert np.all(error <= bound), (
            f"{name} {op.name}: error {error[worst]:.3g} at {worst} exceeds the bound "
            f"{bound[worst]:.3g}"
        )
        if n > 1:  # the error is really there: 16 bits, not float32, crossed the link
            assert error.max() > 2.0**-20 * np.abs(exact * postscale).max(), "no rounding seen"


def check_join(name):
    """While the last rank has joined, the others' compressed calls count it as zeros."""
    r, n = ringtrain.rank(), ringtrain.size()
    strategy = getattr(ringtrain.Compression, name)
    data = everyone((1001,), np.float32, 90)
    joined = [*data[:-1], np.zeros_like(data[-1])]
    if r == n - 1:
        ringtrain.join()
        return
    for op, postscale in ((ringtrain.Sum, 1.0), (ringtrain.Average, 1.0 / max(n - 1, 1))):
        what = f"{name} {op.name} with rank {n - 1} joined"
        got = ringtrain.allreduce(data[r], op=op, name=what, compression=strategy)
        assert_bits(got, simulate(joined, ringtrain.Sum, postscale, WIRES[name])[r], what)
    ringtrain.join()


def check_mismatch():
    """Ranks that disagree on the compression get a mismatch error naming both."""
    r, n = ringtrain.rank(), ringtrain.size()
    expect_error(
        TypeError,
        "compression must be ringtrain.Compression",
        ringtrain.allreduce,
        np.ones(5, np.float32),
        compression="fp16",
    )
    if n > 1:
        mine = ringtrain.Compression.fp16 if r == 0 else ringtrain.Compression.none
        expect_error(
            ringtrain.MismatchError,
            "compression differs across ranks (rank 0: float16, rank 1: none",
            ringtrain.allreduce,
            np.ones(5, np.float32),
            name="disagree",
            compression=mine,
        )
    ringtrain.barrier()  # the engine goes on working


def body():
    ringtrain.init()
    direct_bytes = runtime.current().engine.transport.chunk_bytes
    for name in WIRES:
        check_lone(name)
        check_grouped(name, direct_bytes)
        check_other_dtypes(name)
        check_bound(name)
        check_join(name)
    check_mismatch()
    ringtrain.shutdown()


main(body)
