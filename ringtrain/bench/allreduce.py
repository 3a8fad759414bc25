"""ringtrain's allreduce against MPI_Allreduce on the same float32 buffers, in one run.

With ``--device cuda`` the buffers lie in GPU memory (numba device arrays). MPI's contender
then stages them through host memory around ``MPI_Allreduce``, as Horovod does on a GPU
without NCCL: a copy to the host, the allreduce, a copy back.
"""

import argparse
import json
import statistics
import time

import numpy as np

import ringtrain
from ringtrain.compression import by_name
from ringtrain.kernels import is_device_array

_KIB = 1024
DEFAULT_SIZES = [4 * _KIB * 4**k for k in range(9)]  # 4 KiB .. 256 MiB


def parse_sizes(text: str) -> list[int]:
    """Return the byte sizes of a comma-separated ``--sizes`` option."""
    return [int(x) for x in text.split(",")]


def _count(text: str) -> int:
    """Return ``--small-count``: how many small tensors, 0 for none."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no small tensors) or more, got {value}")
    return value


def _float32_bytes(text: str) -> int:
    """Return ``--small-bytes``: a positive whole number of float32 values, in bytes."""
    value = int(text)
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(
            f"must be a positive multiple of 4 (whole float32 values), got {value}"
        )
    return value


def add_arguments(parser) -> None:
    """Declare this benchmark's options on ``parser``."""
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help="comma-separated buffer sizes in bytes",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        help="time budget per size and contender (default 1.0)",
    )
    parser.add_argument(
        "--small-count",
        type=_count,
        default=200,
        help="small tensors of the many-small-tensors rows (default 200; 0 leaves them out)",
    )
    parser.add_argument(
        "--small-bytes", type=_float32_bytes, default=16 * _KIB, help="bytes of each small tensor"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument(
        "--adasum",
        action="store_true",
        help="also time op Adasum per size (power-of-two ranks), against MPI's Sum: MPI has "
        "no Adasum",
    )
    parser.add_argument(
        "--allgather",
        action="store_true",
        help="also time an allgather per size (each rank gives size / ranks bytes), against "
        "MPI_Allgather; bus bandwidth as nccl-tests: algbw * (n-1)/n",
    )
    parser.add_argument(
        "--compression",
        choices=["none", "fp16", "bf16"],
        default="none",
        help="also time each size with this 16-bit compression on the wire (a row 'single, "
        "fp16'), against MPI's float32 Sum; bandwidths count the float32 bytes",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the buffers lie: 'cuda' puts them in GPU memory, and MPI's contender "
        "stages them through host memory",
    )
    parser.add_argument(
        "--gpu-arrays",
        choices=["numba", "cupy", "torch"],
        default="numba",
        help="with --device cuda, whose arrays the buffers are: numba's (results are numba "
        "arrays, built as the caller takes them), or CuPy's or PyTorch's (results of their "
        "own kind, over the engine's memory)",
    )


def median_time(comm, step, budget, min_iters=5, max_iters=1000):
    """Return the slowest rank's median seconds of ``step()`` over ``budget`` s (collective)."""
    from mpi4py import MPI

    step()  # warm up: first-call compilation and buffer growth are not measured
    times = []
    started = time.perf_counter()
    while len(times) < max_iters:
        comm.Barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        # Every rank must take the same number of iterations: decide together.
        more = len(times) < min_iters or time.perf_counter() - started < budget
        if not comm.allreduce(more, op=MPI.LAND):
            break
    return comm.allreduce(statistics.median(times), op=MPI.MAX)


def _row(case, nbytes, n, ours, theirs, moved=2):
    """Return a row; ``moved``: how many times (n-1)/n of ``nbytes`` each rank sends."""
    factor = moved * (n - 1) / n if n > 1 else 1.0
    return {
        "case": case,
        "bytes": nbytes,
        "ranks": n,
        "ringtrain_us": ours * 1e6,
        "mpi_us": theirs * 1e6,
        "ringtrain_algbw_GBps": nbytes / ours / 1e9,
        "mpi_algbw_GBps": nbytes / theirs / 1e9,
        "ringtrain_busbw_GBps": nbytes / ours / 1e9 * factor,
        "mpi_busbw_GBps": nbytes / theirs / 1e9 * factor,
        "busbw_ratio": theirs / ours,
        "moved": moved,
    }


def _allgather_row(comm, nbytes, seconds):
    """Time an allgather of ``nbytes`` in all (float32, an equal share from each rank)."""
    n = comm.Get_size()
    share = np.full(nbytes // 4 // n, comm.Get_rank(), np.float32)
    gathered = np.empty(len(share) * n, np.float32)

    def ours():
        ringtrain.allgather(share, name="bench.allgather")

    def theirs():
        comm.Allgather(share, gathered)

    ringtrain_time = median_time(comm, ours, seconds)
    mpi_time = median_time(comm, theirs, seconds)
    if not np.array_equal(ringtrain.allgather(share, name="bench.allgather"), gathered):
        raise AssertionError("ringtrain's allgather differs from MPI_Allgather's")
    return _row("allgather", gathered.nbytes, n, ringtrain_time, mpi_time, moved=1)


def run(args) -> int:
    """Measure every size and the many-small-tensors case; print a table on rank 0."""
    place = _placement(args)
    ringtrain.init()  # before mpi4py.MPI is imported, so that MPI starts with its settings
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    rows = []
    compression = by_name(args.compression)
    for nbytes in args.sizes:
        count = nbytes // 4
        src = place(np.random.default_rng(comm.Get_rank()).random(count, dtype=np.float32))
        out = place(np.empty(count, np.float32))
        recv = place(np.empty(count, np.float32))

        def ours(src=src, out=out):
            ringtrain.allreduce(src, op=ringtrain.Sum, out=out, name="bench")

        def ours_read_only(src=src):
            ringtrain.allreduce(src, op=ringtrain.Sum, name="bench.ro", read_only=True)

        def ours_compressed(src=src, out=out):
            ringtrain.allreduce(
                src, op=ringtrain.Sum, out=out, name="bench.wire16", compression=compression
            )

        def ours_adasum(src=src, out=out):
            ringtrain.allreduce(src, op=ringtrain.Adasum, out=out, name="bench.adasum")

        theirs = _mpi_allreduce(comm, src, recv)

        single = median_time(comm, ours, args.seconds)
        mpi = median_time(comm, theirs, args.seconds)
        rows.append(_row("single", nbytes, n, single, mpi))
        # A caller that only reads the result (as TensorFlow's optimizers do) may share it
        # with the host's other ranks: no copy into memory of its own.
        read_only = median_time(comm, ours_read_only, args.seconds)
        rows.append(_row("single, read-only", nbytes, n, read_only, mpi))
        if compression.wire_dtype is not None:
            compressed = median_time(comm, ours_compressed, args.seconds)
            rows.append(_row(f"single, {compression.name}", nbytes, n, compressed, mpi))
        if args.allgather:
            rows.append(_allgather_row(comm, nbytes, args.seconds))
        if args.adasum:
            adasum = median_time(comm, ours_adasum, args.seconds)
            rows.append(_row("single, Adasum", nbytes, n, adasum, mpi))
        del src, out, recv

    if args.small_count:
        rows += _small_rows(comm, args, place)
    if comm.Get_rank() == 0:
        _print(rows)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
    ringtrain.shutdown()
    return 0


def _small_rows(comm, args, place):
    """Return the many-small-tensors rows against one MPI call: grouped and one call each.

    Each into new results, and read-only.
    """
    n = comm.Get_size()
    rows = []
    hosted = [
        np.random.default_rng(i).random(args.small_bytes // 4, dtype=np.float32)
        for i in range(args.small_count)
    ]
    small = [place(t) for t in hosted]
    joined = place(np.concatenate(hosted))
    one_mpi = _mpi_allreduce(comm, joined, place(np.empty(joined.size, np.float32)))

    # Here, not at the top: compare_rank imports mpi4py.MPI, which must follow init().
    from ringtrain.bench.compare_rank import small_tensor_steps

    for case, step in small_tensor_steps(small) + small_tensor_steps(small, read_only=True):
        rows.append(
            _row(
                f"{args.small_count}x{args.small_bytes} {case}",
                joined.nbytes,
                n,
                median_time(comm, step, args.seconds),
                median_time(comm, one_mpi, args.seconds),
            )
        )
    return rows


def _placement(args):
    """Return a function putting a host array where ``--device`` says the buffers lie."""
    if args.device == "cpu":
        if args.gpu_arrays != "numba":
            raise SystemExit(f"--gpu-arrays {args.gpu_arrays} needs --device cuda")
        return lambda array: array
    for flag in ("adasum", "allgather"):
        if getattr(args, flag):
            raise SystemExit(f"--{flag} times host buffers only; drop it or --device cuda")
    if args.gpu_arrays == "cupy":
        import cupy

        return cupy.asarray
    if args.gpu_arrays == "torch":
        import torch

        return lambda array: torch.as_tensor(array, device="cuda")
    from numba import cuda

    return cuda.to_device


def _mpi_allreduce(comm, src, recv):
    """Return a step summing ``src`` into ``recv`` by MPI_Allreduce, staged if on a GPU."""
    from mpi4py import MPI

    if not is_device_array(src):
        return lambda: comm.Allreduce(src, recv, op=MPI.SUM)
    from ringtrain.kernels.cuda import as_numba

    src, recv = as_numba(src), as_numba(recv)  # CuPy's and PyTorch's arrays too
    sent, received = np.empty(src.size, np.float32), np.empty(src.size, np.float32)

    def staged():
        src.copy_to_host(sent)
        comm.Allreduce(sent, received, op=MPI.SUM)
        recv.copy_to_device(received)

    return staged


def _print(rows):
    print(
        f"ranks={rows[0]['ranks']}  medians; busbw as nccl-tests: algbw * 2(n-1)/n, and "
        "(n-1)/n for allgather"
    )
    width = max(18, *(len(r["case"]) for r in rows))
    print(
        f"{'case':>{width}} {'bytes':>11} {'ringtrain us':>13} {'MPI us':>10} "
        f"{'rt busbw GB/s':>14} {'MPI busbw GB/s':>15} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['case']:>{width}} {r['bytes']:>11} {r['ringtrain_us']:>13.1f} "
            f"{r['mpi_us']:>10.1f} "
            f"{r['ringtrain_busbw_GBps']:>14.2f} {r['mpi_busbw_GBps']:>15.2f} "
            f"{r['busbw_ratio']:>6.2f}"
        )
