"""The fusion kernels' throughput against a plain copy on the same backend (no MPI).

On the CPU the copy is ``np.copyto``; on a GPU it is a device-to-device copy. Each figure is
bytes read plus bytes written per second, its ratio to the copy's, and the time per call. The
staging copies to and from host memory, one pack of a single small tensor (the cost of a
launch) and the allocation of one result per tensor, or of views of one array, close the
table.
"""

import statistics
import time

import numpy as np

from ringtrain import kernels
from ringtrain.ops import ReduceOp


def add_arguments(parser) -> None:
    """Declare this benchmark's options on ``parser``."""
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--mib", type=float, default=64, help="bytes moved per call, in MiB")
    parser.add_argument("--tensors", type=int, default=200, help="tensors per pack/unpack")
    parser.add_argument("--repeats", type=int, default=20)


def _timer(backend_name):
    if backend_name == "cuda":
        from numba import cuda

        return cuda.synchronize
    return lambda: None


def _median_seconds(call, sync, repeats):
    call()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(args) -> int:
    """Time copy, pack, unpack, widening pack, reduce and a 16-bit hop; print GB/s and ratios."""
    count = int(args.mib * 1024 * 1024) // 4
    per_tensor = count // args.tensors
    backend = kernels.backend_for(np.empty(0)) if args.backend == "cpu" else None
    if backend is None:
        from numba import cuda

        backend = kernels.backend_for(cuda.device_array(1))
    sync = _timer(args.backend)
    rng = np.random.default_rng(0)
    host = rng.random(count, dtype=np.float32)
    src, dst, other = (backend.empty(count, np.float32) for _ in range(3))
    for array in (src, dst, other):
        backend.to_device(host, array)
    tensors = [src[i * per_tensor : (i + 1) * per_tensor] for i in range(args.tensors)]
    outputs = [dst[i * per_tensor : (i + 1) * per_tensor] for i in range(args.tensors)]
    offsets = [i * per_tensor for i in range(args.tensors)]
    halves = backend.empty(count, np.float16)
    backend.to_device(host.astype(np.float16), halves)
    half_tensors = [halves[i * per_tensor : (i + 1) * per_tensor] for i in range(args.tensors)]
    wire = backend.empty(count, np.float16)
    staged = np.empty(count, np.float32)
    tiny = src[:256]

    def copy():
        if args.backend == "cuda":
            dst.copy_to_device(src)
        else:
            np.copyto(dst, src)

    nbytes = count * 4
    cases = [
        ("copy", copy, 2 * nbytes),
        (f"pack {args.tensors} tensors", lambda: backend.pack(tensors, dst, offsets), 2 * nbytes),
        (f"unpack {args.tensors}", lambda: backend.unpack(src, offsets, outputs), 2 * nbytes),
        ("pack float16->float32", lambda: backend.pack(half_tensors, dst, offsets), 1.5 * nbytes),
        ("reduce Sum", lambda: backend.reduce(dst, src, other, ReduceOp.Sum), 3 * nbytes),
        ("reduce Sum x0.5", lambda: backend.reduce(dst, src, other, ReduceOp.Sum, 0.5),
         3 * nbytes),
        ("reduce Sum to float16", lambda: backend.reduce_to_wire(wire, src, halves, ReduceOp.Sum),
         2 * nbytes),
        ("to host", lambda: backend.to_host(src, staged), 2 * nbytes),
        ("to device", lambda: backend.to_device(staged, dst), 2 * nbytes),
        ("pack 1 tensor of 1 KiB", lambda: backend.pack([tiny], dst, [0]), 2 * tiny.nbytes),
        (f"{args.tensors} new arrays", lambda: [backend.empty(per_tensor, np.float32)
         for _ in range(args.tensors)], nbytes),
        (f"{args.tensors} views of one", lambda: [other[o : o + per_tensor] for o in offsets],
         nbytes),
    ]  # fmt: skip
    print(f"backend={args.backend}  {args.mib:g} MiB float32 per call, medians of {args.repeats}")
    copy_rate = None
    for label, call, moved in cases:
        seconds = _median_seconds(call, sync, args.repeats)
        rate = moved / seconds / 1e9
        copy_rate = copy_rate or rate
        print(
            f"{label:>24}: {rate:8.1f} GB/s  {rate / copy_rate:5.2f}x copy  "
            f"{seconds * 1e6:9.1f} us per call"
        )
    return 0
