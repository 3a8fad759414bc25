"""Negotiation at scale, simulated in one process: what rank 0 handles per step at N ranks.

Every simulated rank submits the same step of allreduces (``--tensors`` gradients of
``--tensor-bytes``), and rank 0 does what its engine does with them, timed: it takes in its
messages (unpickles and adds them), plans the responses, pickles them once and sends them
to every other rank (real MPI sends, to itself, so that their cost counts; received after
the timing). Printed per rank count, for the steps after the first: the messages and
bytes that cross rank 0's control channel, and rank 0's CPU time for that work (median).
Two paths:

- ``tree``, the steady state with ``RINGTRAIN_CACHE_CAPACITY`` above 0 (the default): a
  tensor negotiated once is counted under its cache id up the agreement tree
  (``engine.agreement``), so rank 0 takes one message from each of its children (16 at
  most), not one from every rank (the other ranks' counting is simulated too, untimed);
- ``metas``, the cache turned off: every rank sends every meta whole to rank 0.

The lines after the table give each path's growth from 16 ranks to the largest count,
beside log2 of their ratio, the most that a steady state without rank 0 may grow (issue
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
from ringtrain.engine.agreement import CountTree
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.stall import StallInspector

_FUSION_THRESHOLD = 64 << 20  # the default setting: a step's gradients fuse into few buffers
_CACHE_CAPACITY = 1024  # the default setting
_BASE_RANKS = 16  # the growth is reported from this many ranks
_TAG = 99  # the replies' tag on MPI_COMM_SELF


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

    ``cached``: the ``tree`` path (cache ids counted up the tree); else ``metas``.
    """
    coordinator = Coordinator(
        ranks, _FUSION_THRESHOLD, _CACHE_CAPACITY if cached else 0, StallInspector(60.0, None)
    )
    metas = [
        messages.Meta(f"grad.{i}", messages.ALLREDUCE, "float32", (tensor_bytes // 4,))
        for i in range(tensors)
    ]
    trees = [CountTree(rank, ranks) for rank in range(ranks)]
    ids: dict[str, int] = {}  # name -> the cache id every rank has for it
    rows = []
    for _ in range(steps + 1):
        if ids:  # every other rank counts the step and passes its subtree's counts up
            for tree in trees[1:]:
                for meta in metas:
                    tree.submit(ids[meta.name])
            for rank in reversed(range(1, ranks)):
                tree = trees[rank]
                if tree.parent:
                    trees[tree.parent].heard(rank, tree.risen())
            incoming = [
                (child, pickle.dumps(trees[child].risen(), pickle.HIGHEST_PROTOCOL))
                for child in trees[0].children
            ]
        else:
            whole = pickle.dumps(metas, pickle.HIGHEST_PROTOCOL)
            incoming = [(rank, whole) for rank in range(1, ranks)]
        started = time.process_time()
        if ids:
            for meta in metas:  # rank 0's own submissions
                trees[0].submit(ids[meta.name])
            for child, payload in incoming:
                trees[0].heard(child, pickle.loads(payload))
            coordinator.agree(trees[0].risen())
        else:
            coordinator.add(0, metas)
            for rank, payload in incoming:
                coordinator.add(rank, pickle.loads(payload))
        responses = coordinator.responses()
        reply = pickle.dumps(messages.to_wire(responses), pickle.HIGHEST_PROTOCOL)
        sends = _send_to_every_rank(reply, ranks)
        cpu = time.process_time() - started
        _receive(sends)
        names = {name for response in responses for name in response.names}
        if names != {m.name for m in metas}:
            raise AssertionError(f"{ranks} ranks: the step ran {len(names)} of {tensors} tensors")
        if cached:
            for response in responses:
                ids.update(response.cache_ids)
        rows.append(
            {
                "messages": len(incoming) + ranks - 1,  # in, and the reply to every rank
                "bytes": sum(len(p) for _, p in incoming) + (ranks - 1) * len(reply),
                "cpu_s": cpu,
            }
        )
    steady = rows[1:]  # the first step sends every meta whole on either path
    return {
        "ranks": ranks,
        "path": "tree" if cached else "metas",
        "tensors": tensors,
        "messages": steady[0]["messages"],
        "bytes": statistics.median(r["bytes"] for r in steady),
        "cpu_us": statistics.median(r["cpu_s"] for r in steady) * 1e6,
    }


def _send_to_every_rank(reply, ranks):
    """Send ``reply`` once per other rank as the control channel does (to this process)."""
    from mpi4py import MPI

    comm = MPI.COMM_SELF
    return [comm.isend(reply, 0, _TAG) for _ in range(ranks - 1)]


def _receive(sends):
    """Receive the replies ``_send_to_every_rank`` sent and complete its sends."""
    from mpi4py import MPI

    for _ in sends:
        MPI.COMM_SELF.recv(source=0, tag=_TAG)
    MPI.Request.waitall(sends)


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
    for path in ("tree", "metas"):
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
