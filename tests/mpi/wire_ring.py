"""A NumPy simulation of every rank of the ring that sends 16-bit values, and its error bound.

``simulate`` replays ``ringtrain.transport.schedule``'s steps for every rank at once: what
crosses is rounded to 16 bits, each hop adds it, widened, to the rank's float32 input, and
the owner of a segment keeps its finished sum rounded too. A ring that sent float32 instead,
or rounded elsewhere, gives other bits.
"""

import ml_dtypes
import numpy as np

import ringtrain
from ringtrain.buffers import ALIGNMENT
from ringtrain.transport.schedule import ring_steps, segment_bounds

F32 = np.float32
WIRES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
_OPS = {
    ringtrain.Sum: np.add,
    ringtrain.Min: np.minimum,
    ringtrain.Max: np.maximum,
    ringtrain.Product: np.multiply,
}


def simulate(inputs, op, postscale, wire):
    """Return each rank's result of the compressed ring over float32 ``inputs`` (one per rank).

    ``op`` is Sum, Min, Max or Product (an Average is a Sum with postscale ``1/p``);
    ``wire`` is a 16-bit dtype.
    """
    size, length = len(inputs), len(inputs[0])
    scale = F32(postscale)
    if size == 1 or length == 0:  # nothing crosses a link: copied and scaled
        return [x * scale if postscale != 1 else x.copy() for x in inputs]
    combine = _OPS[op]
    bounds = segment_bounds(length, size)
    steps = [ring_steps(r, size) for r in range(size)]
    sent_bits = [np.zeros(length, wire) for _ in range(size)]
    results = [np.full(length, np.nan, F32) for _ in range(size)]
    for r in range(size):
        lo, hi = bounds[steps[r][0].send]
        sent_bits[r][lo:hi] = inputs[r][lo:hi].astype(wire)
    for t in range(2 * (size - 1)):
        crossing = [sent_bits[r][slice(*bounds[steps[r][t].send])].copy() for r in range(size)]
        for r in range(size):
            step, left = steps[r][t], (r - 1) % size
            assert step.recv == steps[left][t].send, "the schedule's hops do not line up"
            lo, hi = bounds[step.recv]
            got = crossing[left]
            if step.reduce:
                value = combine(inputs[r][lo:hi], got.astype(F32))
                last = t == size - 2
                if last and postscale != 1:
                    value = value * scale
                sent_bits[r][lo:hi] = value.astype(wire)
                if last:
                    results[r][lo:hi] = sent_bits[r][lo:hi].astype(F32)
            else:
                sent_bits[r][lo:hi] = got
                results[r][lo:hi] = got.astype(F32)
    return results


def simulate_group(members, op, postscale, wire, direct_bytes):
    """Return rank 0's results of a grouped allreduce of ``members`` (per rank, a list of arrays).

    As the engine plans it: members of ``direct_bytes`` or more (as float32) go alone, the
    rest share one fusion buffer, each at an ALIGNMENT-aligned offset.
    """
    count = len(members[0])
    sizes = [members[0][i].size for i in range(count)]
    alone = [count == 1 or s * 4 >= direct_bytes for s in sizes]
    results = [None] * count
    fused = [i for i in range(count) if not alone[i]]
    for i in range(count):
        if alone[i]:
            flat = [m[i].reshape(-1).astype(F32) for m in members]
            results[i] = simulate(flat, op, postscale, wire)[0].reshape(members[0][i].shape)
    if fused:
        step = ALIGNMENT // 4
        offsets, total = [], 0
        for i in fused:
            offsets.append(total)
            total += -(-sizes[i] // step) * step
        total = offsets[-1] + sizes[fused[-1]]
        buffers = []
        for m in members:
            buffer = np.zeros(total, F32)
            for i, offset in zip(fused, offsets, strict=True):
                buffer[offset : offset + sizes[i]] = m[i].reshape(-1)
            buffers.append(buffer)
        reduced = simulate(buffers, op, postscale, wire)[0]
        for i, offset in zip(fused, offsets, strict=True):
            results[i] = reduced[offset : offset + sizes[i]].reshape(members[0][i].shape)
    return results


def error_bound(inputs, compression, postscale=1.0):
    """Return the bound on |result - exact| per element of a compressed Sum times ``postscale``.

    Each element is rounded to 16 bits at most ``p`` times, each time a partial sum of
    magnitude at most ``sum |x_i|``: ``p * u * sum |x_i|``. Widened by the float32 additions
    (one float32 rounding per hop), the partial sums' own growth (a factor ``1 + 2pu``), and
    ``p`` half subnormals of float16 near zero.
    """
    size = len(inputs)
    u = UNIT_ROUNDOFF[compression]
    magnitude = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0) * abs(postscale)
    rounding = size * (u + 2.0**-24) * magnitude * (1 + 2 * size * u)
    return rounding + size * (2.0**-25 if compression == "fp16" else 0.0)
