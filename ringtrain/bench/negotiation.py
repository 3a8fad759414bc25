"""Negotiation at scale, simulated in one process: what the busiest rank handles per step.

Every simulated rank submits the same step of allreduces (``--tensors`` gradients of
``--tensor-bytes``). Printed per rank count, for the steps after the first: the messages
and bytes that cross the busiest rank's control channel, and its CPU time for that work
(median). Two paths:

- ``rounds``, the steady state with ``RINGTRAIN_CACHE_CAPACITY`` above 0 (the default):
  every tensor has a cache id, and every rank agrees on them in one round
  (``engine.rounds``), a bitwise AND by recursive doubling, as MPI runs a small
  allreduce: at each of its log2 N steps a rank sends its partner its vector and ANDs in
  the partner's (N not a power of two: the ranks past the largest power first fold into
  a partner, two messages more). Every rank does the same work, rank 0 included, so the
  busiest is any: the timed work is one rank's round (the vector made, each step's copy
  and AND, the result read) and the fused responses it plans from the result;
- ``metas``, the cache turned off: every rank sends every meta whole to rank 0, which
  takes them in (unpickles and adds them), plans the responses, pickles them once and
  sends them to every other rank (real MPI sends, to itself, so that their cost counts;
  received after the timing). Rank 0 is the busiest.

The lines after the table give each path's growth from 16 ranks to the largest count,
beside log2 of their ratio: issue 64 asks the rounds to stay within 2x.

    python -m ringtrain.bench negotiation --ranks 2,16,128,1024
"""

import argparse
import json
import math
import pickle
import statistics
import time
from pathlib import Path

import numpy as np

from ringtrain.engine import fusion, messages
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.rounds import Rounds, slot_count
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
    """Return the busiest rank's per-step messages, bytes and CPU for ``steps`` steps.

    ``cached``: the ``rounds`` path; else ``metas``.
    """
    metas = [
        messages.Meta(f"grad.{i}", messages.ALLREDUCE, "float32", (tensor_bytes // 4,))
        for i in range(tensors)
    ]
    step = _rounds_step if cached else _metas_step(ranks)
    rows = [step(ranks, metas) for _ in range(steps + 1)]
    steady = rows[1:]  # the first step sends every meta whole on either path
    return {
        "ranks": ranks,
        "path": "rounds" if cached else "metas",
        "tensors": tensors,
        "messages": steady[0]["messages"],
        "bytes": statistics.median(r["bytes"] for r in steady),
        "cpu_us": statistics.median(r["cpu_s"] for r in steady) * 1e6,
    }


class _Doubling:
    """A round's AND by recursive doubling, one rank's part: its messages, copied and ANDed.

    Every rank has the same tensors ready, so each partner's vector equals this rank's.
    """

    def __init__(self, ranks):
        lower = 1 << (ranks.bit_length() - 1)
        self.steps = lower.bit_length() - 1 + (2 if ranks > lower else 0)
        self.messages = 0
        self.bytes = 0

    def __call__(self, vector):
        result = vector.copy()
        for _ in range(self.steps):
            wire = result.tobytes()  # what goes to the partner
            result &= np.frombuffer(wire, np.uint64)  # the partner's, come back
            self.messages += 2
            self.bytes += 2 * len(wire)
        return _Done(result)


class _Done:
    __slots__ = ("result",)

    def __init__(self, result):
        self.result = result

    def test(self):
        return self.result


def _rounds_step(ranks, metas) -> dict:
    """Time one rank's round on ``metas``, all cached, and the responses it plans."""
    doubling = _Doubling(ranks)
    rounds = Rounds(slot_count(_CACHE_CAPACITY), doubling, coordinator=True)
    started = time.process_time()
    for slot in range(len(metas)):
        rounds.ready(slot)
    rounds.start()
    rounds.poll()
    agreed, _ = rounds.result
    fused = fusion.plan([metas[slot] for slot in agreed], _FUSION_THRESHOLD)
    cpu = time.process_time() - started
    if sum(len(f) for f in fused) != len(metas):
        raise AssertionError(f"{ranks} ranks: the round agreed {len(agreed)} of {len(metas)}")
    return {"messages": doubling.messages, "bytes": doubling.bytes, "cpu_s": cpu}


def _metas_step(ranks):
    """Return a step of the ``metas`` path at ``ranks`` ranks: rank 0's side of it, timed."""
    coordinator = Coordinator(ranks, _FUSION_THRESHOLD, 0, StallInspector(60.0, None))

    def step(ranks, metas) -> dict:
        whole = pickle.dumps(metas, pickle.HIGHEST_PROTOCOL)
        incoming = [(rank, whole) for rank in range(1, ranks)]
        started = time.process_time()
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
            raise AssertionError(f"{ranks} ranks: the step ran {len(names)} of {len(metas)}")
        return {
            "messages": len(incoming) + ranks - 1,  # in, and the reply to every rank
            "bytes": sum(len(p) for _, p in incoming) + (ranks - 1) * len(reply),
            "cpu_s": cpu,
        }

    return step


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
        f"the busiest rank's share of negotiating {args.tensors} allreduces of "
        f"{args.tensor_bytes} bytes a step (median of {args.steps} steps after the first)"
    )
    print(f"{'ranks':>6} {'path':>6} {'messages':>9} {'bytes':>11} {'busiest CPU us':>14}")
    for row in rows:
        print(
            f"{row['ranks']:>6} {row['path']:>6} {row['messages']:>9} {row['bytes']:>11.0f} "
            f"{row['cpu_us']:>14.0f}"
        )
    for path in ("rounds", "metas"):
        grown = growth(rows, path)
        if grown is not None:
            largest, ratio = grown
            bound = math.log2(largest / _BASE_RANKS)
            print(
                f"{path}: the busiest rank's CPU at {largest} ranks is {ratio:.1f}x its CPU at "
                f"{_BASE_RANKS} (log2 of the ratio of ranks: {bound:g})"
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
