"""Negotiation at scale, simulated in one process: what rank 0 handles per step at N ranks.

Every simulated rank submits the same step of allreduces (``--tensors`` gradients of
``--tensor-bytes``) to rank 0's ``Coordinator`` in one control message, as a step's
submissions that all reach rank 0 in one turn; rank 0 takes each message in (unpickles it and
adds it), plans the responses, and pickles them once for the other ranks, as the engine
does. Printed per rank count, for the steps after the first: the messages and bytes that
cross rank 0's control channel, and rank 0's CPU time for that work (median). Two paths:
``ids``, where a rank sends a tensor seen before as its cache id (``RINGTRAIN_CACHE_CAPACITY``
above 0, the default), and ``metas``, where it sends every meta whole (capacity 0).

Both grow with the ranks: rank 0 takes one message from every rank, whatever it holds. The
lines after the table give each path's growth from 16 ranks to the largest count, beside log2
of their ratio, the most that a negotiation whose steady state skips rank 0 may grow (issue
41's target).

    python -m ringtrain.bench negotiation --ranks 2,16,128,1024
"""

import argparse
import json
import math
import pickle
import statistics
import time
from pathlib import Path

from ringtrain.engine import messages
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.stall import StallInspector

_FUSION_THRESHOLD = 64 << 20  # the default setting: a step's gradients fuse into few buffers
_CACHE_CAPACITY = 1024  # the default setting
_BASE_RANKS = 16  # the growth is reported from this many ranks


def add_arguments(parser) -> None:
    """Add the negotiation benchmark's options to ``parser``."""
    parser.add_argument(
        "--ranks",
        type=_counts,
        default=[2, 16, 128, 1024],
        help="comma-separated rank counts to simulate (default 2,16,128,1024)",
    )
    parser.add_argument("--tensors", type=_positive, default=200, help="allreduces per step")
    parser.add_argument(
        "--tensor-bytes", type=_positive, default=16384, help="bytes of each (float32)"
    )
    parser.add_argument("--steps", type=_positive, default=10, help="steps timed after the first")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")


def simulate(ranks: int, tensors: int, tensor_bytes: int, steps: int, cached: bool) -> dict:
    """Return rank 0's per-step messages, bytes and CPU for ``steps`` steps after the first.

    ``cached``: ranks send the cache ids that rank 0's responses gave them, as the engine
    does; else every meta whole, as with a cache capacity of 0.
    """
    coordinator = Coordinator(
        ranks, _FUSION_THRESHOLD, _CACHE_CAPACITY if cached else 0, StallInspector(60.0, None)
    )
    metas = [
        messages.Meta(f"grad.{i}", messages.ALLREDUCE, "float32", (tensor_bytes // 4,))
        for i in range(tensors)
    ]
    known = [{} for _ in range(ranks)]  # per rank: name -> its cache id
    rows = []
    for _ in range(steps + 1):
        payloads = [
            pickle.dumps([known[r].get(m.name, m) for m in metas], pickle.HIGHEST_PROTOCOL)
            for r in range(ranks)
        ]
        started = time.process_time()
        for rank in range(ranks):  # rank 0's own entries go in without a message
            entries = pickle.loads(payloads[rank])
            coordinator.add(rank, entries)
        responses = coordinator.responses()
        reply = pickle.dumps(messages.to_wire(responses), pickle.HIGHEST_PROTOCOL)
        cpu = time.process_time() - started
        names = {name for response in responses for name in response.names}
        if names != {m.name for m in metas}:
            raise AssertionError(f"{ranks} ranks: the step ran {len(names)} of {tensors} tensors")
        for response in responses:
            for name, ids in response.cache_ids.items():
                for rank, ident in enumerate(ids):
                    if ident is not None:
                        known[rank][name] = ident
        others = ranks - 1
        rows.append(
            {
                "messages": 2 * others,  # one in from each other rank, the reply to each
                "bytes": sum(map(len, payloads[1:])) + others * len(reply),
                "cpu_s": cpu,
            }
        )
    steady = rows[1:]  # the first step sends every meta whole on either path
    return {
        "ranks": ranks,
        "path": "ids" if cached else "metas",
        "tensors": tensors,
        "messages": steady[0]["messages"],
        "bytes": statistics.median(r["bytes"] for r in steady),
        "cpu_us": statistics.median(r["cpu_s"] for r in steady) * 1e6,
    }


def growth(rows, path: str, base: int = _BASE_RANKS) -> tuple[int, float] | None:
    """Return (largest rank count, its CPU over ``base`` ranks' CPU) for ``path``, or None."""
    by_ranks = {r["ranks"]: r["cpu_us"] for r in rows if r["path"] == path}
    largest = max(by_ranks)
    if base not in by_ranks or largest <= base:
        return None
    return largest, by_ranks[largest] / by_ranks[base]


def run(args) -> int:
    """Simulate every rank count on both paths; print the table and the growth."""
    rows = [
        simulate(n, args.tensors, args.tensor_bytes, args.steps, cached)
        for n in args.ranks
        for cached in (True, False)
    ]
    print(
        f"rank 0's share of negotiating {args.tensors} allreduces of {args.tensor_bytes} bytes "
        f"a step (median of {args.steps} steps after the first)"
    )
    print(f"{'ranks':>6} {'path':>6} {'messages':>9} {'bytes':>11} {'rank 0 CPU us':>14}")
    for row in rows:
        print(
            f"{row['ranks']:>6} {row['path']:>6} {row['messages']:>9} {row['bytes']:>11.0f} "
            f"{row['cpu_us']:>14.0f}"
        )
    for path in ("ids", "metas"):
        grown = growth(rows, path)
        if grown is not None:
            largest, ratio = grown
            bound = math.log2(largest / _BASE_RANKS)
            print(
                f"{path}: rank 0's CPU at {largest} ranks is {ratio:.1f}x its CPU at "
                f"{_BASE_RANKS} (a steady state without rank 0 may grow {bound:g}x at most)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


def _counts(text):
    parts = text.split(",")
    if not all(part.strip().isdigit() and int(part) >= 2 for part in parts):
        raise argparse.ArgumentTypeError(
            f"rank counts {text!r}: expected whole numbers of at least 2, comma-separated"
        )
    return [int(part) for part in parts]


def _positive(text):
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return int(text)
