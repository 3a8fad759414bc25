"""PyTorch tensors and JAX arrays in the NumPy-level API: results come back as the same kind.

Each rank's own data goes in as a CPU tensor of each framework (read through DLPack, no
copy); every collective's result must be of that framework and equal NumPy's answer. With
``RINGTRAIN_CHECK_CUDA=1`` (on a GPU), PyTorch's CUDA tensors and CuPy's arrays go through
the allreduces too, and must come back on the GPU as the same kind.
"""

import os

import numpy as np
import torch
from common import assert_equal, expect_error, expected, main, rank_data

import ringtrain

jnp = None  # imported in body, after ringtrain.init: JAX's CPU client starts threads


def body():
    global jnp
    ringtrain.init()
    import jax.numpy

    jnp = jax.numpy
    r, n = ringtrain.rank(), ringtrain.size()
    kinds = {"torch": (torch.from_numpy, torch.Tensor), "jax": (jnp.asarray, jax.Array)}
    for kind, (make, cls) in kinds.items():
        for dtype in (np.float32, np.int32):
            for shape in ((0,), (1,), (5, 3)):
                what = f"{kind} {np.dtype(dtype)} {shape}"
                mine = rank_data(r, shape, dtype)
                everyone = [rank_data(i, shape, dtype) for i in range(n)]
                got = ringtrain.allreduce(make(mine), op=ringtrain.Sum, name=f"ar.{what}")
                _check(got, cls, expected(ringtrain.Sum, everyone, dtype), f"allreduce {what}")
                got = ringtrain.allgather(make(mine), name=f"ag.{what}")
                _check(got, cls, np.concatenate(everyone), f"allgather {what}")
                got = ringtrain.broadcast(make(mine), n - 1, name=f"bc.{what}")
                _check(got, cls, everyone[n - 1], f"broadcast {what}")
        # A group, and the async calls: each result is its framework's.
        shapes = [(0,), (1,), (4, 2)]
        mine = [make(rank_data(r, s, np.float32, k)) for k, s in enumerate(shapes)]
        wants = [
            expected(ringtrain.Sum, [rank_data(i, s, np.float32, k) for i in range(n)], np.float32)
            for k, s in enumerate(shapes)
        ]
        for got, want in zip(
            ringtrain.grouped_allreduce(mine, op=ringtrain.Sum, name=f"group.{kind}"),
            wants,
            strict=True,
        ):
            _check(got, cls, want, f"{kind} grouped_allreduce")
        handles = [
            ringtrain.allreduce_async(x, op=ringtrain.Sum, name=f"async.{kind}.{k}")
            for k, x in enumerate(mine)
        ]
        for handle, want in zip(handles, wants, strict=True):
            _check(ringtrain.synchronize(handle), cls, want, f"{kind} allreduce_async")
        rows = rank_data(r, (2 * n, 3), np.float32)
        got = ringtrain.alltoall(make(rows), name=f"a2a.{kind}")
        want = np.concatenate(
            [rank_data(i, (2 * n, 3), np.float32)[2 * r : 2 * r + 2] for i in range(n)]
        )
        _check(got, cls, want, f"{kind} alltoall")
        got = ringtrain.reducescatter(make(rows), op=ringtrain.Sum, name=f"rs.{kind}")
        total = expected(
            ringtrain.Sum, [rank_data(i, (2 * n, 3), np.float32) for i in range(n)], np.float32
        )
        _check(got, cls, total[2 * r : 2 * r + 2], f"{kind} reducescatter")
    # A PyTorch tensor that requires gradients is read detached; out= is written in place.
    weights = torch.from_numpy(rank_data(r, (6,), np.float32)).requires_grad_()
    out = torch.zeros(6)
    got = ringtrain.allreduce(weights, op=ringtrain.Average, out=out, name="out.torch")
    assert got is out, f"out= gave back a {type(got)}, not the tensor passed"
    want = expected(
        ringtrain.Average, [rank_data(i, (6,), np.float32) for i in range(n)], np.float32
    )
    assert_equal(out.numpy(), want, "allreduce into a torch out=")
    # A JAX array cannot be written to: it is refused as out=, naming why.
    expect_error(
        ValueError, "out must be writable", ringtrain.allreduce, jnp.zeros(6), out=jnp.zeros(6)
    )
    if os.environ.get("RINGTRAIN_CHECK_CUDA") == "1":
        _on_the_gpu(r, n)
    ringtrain.shutdown()


def _on_the_gpu(r, n):
    """Reduce PyTorch CUDA tensors and CuPy arrays; their results stay on the GPU, as they came."""
    import cupy

    kinds = {
        "torch.cuda": (lambda a: torch.from_numpy(a).cuda(), lambda g: g.cpu().numpy()),
        "cupy": (cupy.asarray, cupy.asnumpy),
    }
    for kind, (make, back) in kinds.items():
        shapes = [(0,), (1,), (37, 3)]
        mine = [make(rank_data(r, s, np.float32, k)) for k, s in enumerate(shapes)]
        wants = [
            expected(ringtrain.Sum, [rank_data(i, s, np.float32, k) for i in range(n)], np.float32)
            for k, s in enumerate(shapes)
        ]
        cls = type(mine[0])
        for k, (x, want) in enumerate(zip(mine, wants, strict=True)):
            got = ringtrain.allreduce(x, op=ringtrain.Sum, name=f"gpu.{kind}.{k}")
            assert isinstance(got, cls), f"{kind}: got a {type(got).__name__}"
            assert_equal(back(got), want, f"{kind} allreduce {k}")
        grouped = ringtrain.grouped_allreduce(mine, op=ringtrain.Sum, name=f"gpu.{kind}.group")
        for k, (got, want) in enumerate(zip(grouped, wants, strict=True)):
            assert isinstance(got, cls), f"{kind} group: got a {type(got).__name__}"
            assert_equal(back(got), want, f"{kind} grouped_allreduce {k}")
        out = make(np.zeros((37, 3), np.float32))
        got = ringtrain.allreduce(mine[2], op=ringtrain.Sum, out=out, name=f"gpu.{kind}.out")
        assert got is out, f"{kind}: out= gave back a {type(got).__name__}, not the array passed"
        assert_equal(back(out), wants[2], f"{kind} allreduce into out=")


def _check(got, cls, want, what):
    assert isinstance(got, cls), f"{what}: got a {type(got).__name__}, expected {cls.__name__}"
    assert_equal(np.asarray(got), want, what)


main(body)
