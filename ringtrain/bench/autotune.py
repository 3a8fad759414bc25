"""Autotune against a sweep: training throughput with the defaults, tuned, and fixed settings.

``python -m ringtrain.bench autotune`` runs ``bench train``'s ringtrain contender (the custom
train step, at ``--np`` ranks) once per round for each of: the defaults, autotune on, and
every point of a sweep of fixed settings (fusion threshold x ring chunk x response cache).
Every run has the same untimed warm-up, at least as long as tuning takes, so the tuned run
is timed under the settings it settled on. It prints, as medians over the rounds of ratios
taken within each round, the tuned run against the best fixed setting of that round's sweep
and against the defaults, and the settings that autotune chose.
"""

import csv
import itertools
import os
import shutil
import sys
import tempfile

import numpy as np

from ringtrain import settings
from ringtrain.bench import train

# The sweep: fusion threshold x ring chunk x response cache (8 fixed settings).
SWEEP = {
    "RINGTRAIN_FUSION_THRESHOLD": (1 << 20, 64 << 20),
    "RINGTRAIN_RING_CHUNK_BYTES": (256 << 10, 4 << 20),
    "RINGTRAIN_CACHE_CAPACITY": (0, 1024),
}


def add_arguments(parser) -> None:
    """Add this benchmark's options to ``parser``."""
    parser.add_argument("--model", default="mlp", help="bench train's model (default mlp)")
    parser.add_argument("--batch", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="timed steps (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--timeout", type=float, default=600, help="per launch, in seconds")
    parser.add_argument(
        "--inter-op-threads", type=int, default=0, help="as bench train (0: TensorFlow's)"
    )


def warmup_steps(environ=os.environ) -> int:
    """Return the untimed steps every run gets: as many as tuning takes, and 20 more."""
    chosen = settings.read(environ)
    per = chosen.autotune_steps_per_sample
    return chosen.autotune_warmup_samples * per + 2 + chosen.autotune_samples * (per + 1) + 20


def sweep_points() -> list[dict]:
    """Return the environment of every fixed setting of the sweep."""
    names = list(SWEEP)
    return [
        {name: str(value) for name, value in zip(names, values, strict=True)}
        for values in itertools.product(*SWEEP.values())
    ]


def run(args) -> int:
    """Run every round; print the ratios and what autotune chose."""
    args.warmup = warmup_steps()
    args.backend, args.compression = "tensorflow", "none"
    command = [*train.worker_command(args, "ringtrain", args.model), "--skip-fit"]
    runner = [sys.executable, "-m", "ringtrain.runner", "-np", str(args.np), *command]
    points = sweep_points()
    rounds, chosen = [], []
    for number in range(1, args.rounds + 1):
        folder = tempfile.mkdtemp(prefix="ringtrain-autotune-")
        try:
            log = os.path.join(folder, "autotune.csv")
            tuned_env = {"RINGTRAIN_AUTOTUNE": "1", "RINGTRAIN_AUTOTUNE_LOG": log}
            rates = {
                "defaults": _rate(runner, args, {}),
                "autotune": _rate(runner, args, tuned_env),
            }
            chosen.append(_best_row(log))
        finally:
            shutil.rmtree(folder)
        for point in points:
            rates[_label(point)] = _rate(runner, args, point)
        rounds.append(rates)
        best = max(rates[_label(p)] for p in points)
        print(
            f"round {number}/{args.rounds}: defaults {rates['defaults']:.0f}, autotune "
            f"{rates['autotune']:.0f}, best fixed {best:.0f} samples/s",
            flush=True,
        )
    _print(args, rounds, points, chosen)
    return 0


def _rate(runner, args, env) -> float:
    (result,) = train.launch([runner], args.timeout, [env])
    return result["samples_per_sec"]


def _label(point) -> str:
    fusion = int(point["RINGTRAIN_FUSION_THRESHOLD"]) >> 20
    chunk = int(point["RINGTRAIN_RING_CHUNK_BYTES"]) >> 10
    cache = "on" if int(point["RINGTRAIN_CACHE_CAPACITY"]) else "off"
    return f"fusion {fusion} MiB, chunk {chunk} KiB, cache {cache}"


def _best_row(log) -> dict:
    """Return the settings in the last row (``best``) of an autotune log."""
    with open(log, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows or rows[-1]["sample"] != "best":
        raise RuntimeError(f"autotune did not finish within the warm-up: {rows[-1:]}")
    return rows[-1]


def _print(args, rounds, points, chosen) -> None:
    labels = ["defaults", "autotune", *(_label(p) for p in points)]
    print(
        f"{args.model}, -np {args.np}, batch {args.batch} per rank, {args.steps} steps timed "
        f"after {args.warmup} (tuning ends within {args.warmup - 20}); medians of "
        f"{args.rounds} rounds"
    )
    print(f"{'setting':<40} {'samples/s':>10}")
    for label in labels:
        print(f"{label:<40} {np.median([r[label] for r in rounds]):>10.0f}")
    best_fixed = [max(r[_label(p)] for p in points) for r in rounds]
    vs_best = np.median([r["autotune"] / b for r, b in zip(rounds, best_fixed, strict=True)])
    vs_defaults = np.median([r["autotune"] / r["defaults"] for r in rounds])
    print(f"autotune / best fixed setting of the same round: {vs_best:.3f}")
    print(f"autotune / defaults: {vs_defaults:.3f}")
    fields = [c for c in chosen[0] if c not in ("sample", "score_bytes_per_second")]
    for number, row in enumerate(chosen, 1):
        print(f"round {number}: autotune chose " + ", ".join(f"{f}={row[f]}" for f in fields))
