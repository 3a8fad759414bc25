"""Autotune against a sweep: a job's speed with the defaults, tuned, and fixed settings.

``python -m ringtrain.bench autotune`` compares, for one job: the defaults, autotune on,
and every point of a sweep of fixed settings (fusion threshold x ring chunk x response
cache). With ``--workload train`` the job is ``bench train``'s ringtrain contender (the
custom train step, at ``--np`` ranks, samples/s), launched once per round for each setting,
after the same untimed warm-up, at least as long as tuning takes, so the tuned run is timed
under the settings it settled on; it prints medians over the rounds of ratios taken within
each round. With ``--workload allreduce`` the job is one allreduce of ``--size`` bytes, and
each round is one launch (``autotune_allreduce``) that tunes, then times every setting and
``MPI_Allreduce`` in ``--blocks`` turns within the launch: launches of one setting differ
here by more than settings do. It prints medians over every block of ratios taken within
the block, the best fixed setting being the one with the best median in its launch. Both
print the settings that autotune chose.

With ``--hosts H`` (root) the ranks run on H namespace test hosts (``ringtrain.bench.netns``),
``--slots`` ranks each, with every host's link capped at ``--rate`` both ways.
"""

import csv
import itertools
import os
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

from ringtrain import settings
from ringtrain.bench import cluster, netns, train
from ringtrain.bench.children import EndedBySignalError, signals_raise
from ringtrain.engine.tuning import tuner

PREFIX = "rttune"
MPI_LABEL = "MPI_Allreduce"

# The sweep: fusion threshold x ring chunk x response cache (8 fixed settings).
SWEEP = {
    "RINGTRAIN_FUSION_THRESHOLD": (1 << 20, 64 << 20),
    "RINGTRAIN_RING_CHUNK_BYTES": (256 << 10, 4 << 20),
    "RINGTRAIN_CACHE_CAPACITY": (0, 1024),
}


def add_arguments(parser) -> None:
    """Add this benchmark's options to ``parser``."""
    parser.add_argument("--workload", choices=["train", "allreduce"], default="train")
    parser.add_argument("--model", default="mlp", help="bench train's model (default mlp)")
    parser.add_argument("--size", type=int, default=1 << 20, help="allreduce bytes (default 1 MiB)")
    parser.add_argument("--batch", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="train: timed steps (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--blocks", type=int, default=5, help="allreduce: turns in each launch")
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="allreduce: each setting's time in a turn"
    )
    parser.add_argument("--timeout", type=float, default=600, help="per launch, in seconds")
    parser.add_argument(
        "--inter-op-threads", type=int, default=0, help="as bench train (0: TensorFlow's)"
    )
    parser.add_argument("--hosts", type=int, default=0, help="namespace test hosts (root)")
    parser.add_argument("--slots", type=int, default=1, help="with --hosts: ranks per host")
    parser.add_argument("--rate", default="1gbit", help="with --hosts: each host's link cap")


def warmup_steps(environ=os.environ) -> int:
    """Return the untimed steps every run gets: as many as tuning takes, and 20 more."""
    return tuner.steps_to_tune(settings.read(environ)) + 20


def sweep_points() -> list[dict]:
    """Return the environment of every fixed setting of the sweep."""
    names = list(SWEEP)
    return [
        {name: str(value) for name, value in zip(names, values, strict=True)}
        for values in itertools.product(*SWEEP.values())
    ]


def sweep_values(start) -> dict[str, dict]:
    """Return each sweep point's tunable settings by label: ``start`` with the point's values."""
    return {
        _env_label(point): {
            **start,
            "fusion_threshold": int(point["RINGTRAIN_FUSION_THRESHOLD"]),
            "ring_chunk_bytes": int(point["RINGTRAIN_RING_CHUNK_BYTES"]),
            "response_cache": int(point["RINGTRAIN_CACHE_CAPACITY"]) > 0,
        }
        for point in sweep_points()
    }


def run(args) -> int:
    """Run every round, on this machine or on test hosts; print the ratios and the choices."""
    args.warmup = warmup_steps()
    args.backend, args.compression = "tensorflow", "none"
    if not args.hosts:
        runner = [sys.executable, "-m", "ringtrain.runner", "-np", str(args.np), *_command(args)]
        return _rounds(args, lambda env: _launch(args, runner, env))
    reason = netns.why_unavailable(PREFIX, ("tbf",))
    if reason:
        print(f"bench autotune: cannot run: {reason}", file=sys.stderr)
        return 2
    try:
        with (
            signals_raise(),
            netns.cluster(args.hosts, PREFIX) as hosts,
            tempfile.TemporaryDirectory(prefix="ringtrain-autotune-") as folder,
        ):
            netns.limit_links(list(hosts), args.rate, None, PREFIX)
            return _rounds(args, _on_hosts(args, list(hosts), Path(folder)))
    except EndedBySignalError as ended:
        print(f"bench autotune: {ended}; the test hosts are removed", file=sys.stderr)
        return 128 + ended.signum


def _command(args):
    if args.workload == "allreduce":
        return [
            sys.executable, "-m", "ringtrain.bench.autotune_allreduce", "--size", str(args.size),
            "--warmup-calls", str(args.warmup), "--blocks", str(args.blocks),
            "--seconds", str(args.seconds),
        ]  # fmt: skip
    return [*train.worker_command(args, "ringtrain", args.model), "--skip-fit"]


def _on_hosts(args, names, folder):
    """Return a function that runs the job on the test hosts with an environment's settings."""
    args.np = len(names) * args.slots
    hostfile = folder / "hosts"
    hostfile.write_text("".join(f"{name} slots={args.slots}\n" for name in names))
    runner = [
        sys.executable, "-m", "ringtrain.runner", "-np", str(args.np),
        "--hostfile", str(hostfile), "--network-interface", netns.SUBNET,
        "--mpi-args", shlex.join(cluster.mpi_args()), *_command(args),
    ]  # fmt: skip
    base = cluster.rank_env()
    return lambda env: _launch(args, netns.on_host(names[0], runner), {**base, **env})


def _launch(args, command, env) -> dict:
    """Run ``command`` once with ``env``; return the result line it printed."""
    (result,) = train.launch([command], args.timeout, [env])
    return result


def _rounds(args, launch) -> int:
    """Measure the defaults, autotune and the sweep ``args.rounds`` times; print them."""
    if args.workload == "allreduce":
        return _rounds_in_one_launch(args, launch)
    points = sweep_points()
    rounds, chosen = [], []
    for number in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="ringtrain-autotune-log-") as folder:
            log = os.path.join(folder, "autotune.csv")
            tuned_env = {"RINGTRAIN_AUTOTUNE": "1", "RINGTRAIN_AUTOTUNE_LOG": log}
            rates = {"defaults": _rate(launch, {}), "autotune": _rate(launch, tuned_env)}
            chosen.append(_best_row(log))
        for point in points:
            rates[_env_label(point)] = _rate(launch, point)
        rounds.append(rates)
        best = max(rates[_env_label(p)] for p in points)
        print(
            f"round {number}/{args.rounds}: defaults {rates['defaults']:.0f}, autotune "
            f"{rates['autotune']:.0f}, best fixed {best:.0f} samples/s",
            flush=True,
        )
    _print(args, rounds, points, chosen)
    return 0


def _rate(launch, env) -> float:
    return launch(env)["samples_per_sec"]


def _rounds_in_one_launch(args, launch) -> int:
    """Tune and time every setting within each of ``args.rounds`` launches; print them.

    Each block's ratios are taken within the block; the best fixed setting is the sweep
    point with the best median in its launch.
    """
    sweep = [_env_label(point) for point in sweep_points()]
    ratios: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    for number in range(1, args.rounds + 1):
        result = launch({"RINGTRAIN_AUTOTUNE": "1"})
        launched = result["rates"]
        best = max(sweep, key=lambda label: np.median(launched[label]))
        for label, values in {**launched, "best fixed": launched[best]}.items():
            rates.setdefault(label, []).extend(values)
        for block in range(len(launched[MPI_LABEL])):
            each = {label: values[block] for label, values in launched.items()}
            for name, (top, bottom) in {
                "autotune / best fixed setting": ("autotune", best),
                "autotune / defaults": ("autotune", "defaults"),
                f"autotune / {MPI_LABEL}": ("autotune", MPI_LABEL),
                f"defaults / {MPI_LABEL}": ("defaults", MPI_LABEL),
                f"best fixed / {MPI_LABEL}": (best, MPI_LABEL),
            }.items():
                ratios.setdefault(name, []).append(each[top] / each[bottom])
        chosen = result["settings"]["autotune"]
        print(
            f"round {number}/{args.rounds}: autotune chose "
            + ", ".join(f"{field}={value}" for field, value in chosen.items())
            + f"; best fixed: {best}",
            flush=True,
        )
    where = f", {args.hosts} test hosts x {args.slots}, links at {args.rate}" if args.hosts else ""
    print(
        f"allreduce of {args.size} bytes, -np {args.np}{where}; tuned within {args.warmup - 20} "
        f"calls, then every setting timed {args.seconds:g} s in each of {args.blocks} turns, "
        f"{args.rounds} launches; medians over {len(ratios[f'autotune / {MPI_LABEL}'])} turns"
    )
    for label, values in rates.items():
        print(f"  {label:<40} {np.median(values):>10.0f} calls/s")
    for name, values in ratios.items():
        print(f"{name}: {np.median(values):.3f}")
    return 0


def _env_label(env) -> str:
    """Return how the table names the run of ``env``: defaults, autotune, or a sweep point."""
    if not env or set(env) <= set(cluster.rank_env()):
        return "defaults"
    if "RINGTRAIN_AUTOTUNE" in env:
        return "autotune"
    fusion = int(env["RINGTRAIN_FUSION_THRESHOLD"]) >> 20
    chunk = int(env["RINGTRAIN_RING_CHUNK_BYTES"]) >> 10
    cache = "on" if int(env["RINGTRAIN_CACHE_CAPACITY"]) else "off"
    return f"fusion {fusion} MiB, chunk {chunk} KiB, cache {cache}"


def _best_row(log) -> dict:
    """Return the settings in the last row (``best``) of an autotune log."""
    with open(log, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows or rows[-1]["sample"] != "best":
        raise RuntimeError(f"autotune did not finish within the warm-up: {rows[-1:]}")
    return rows[-1]


def _print(args, rounds, points, chosen) -> None:
    labels = ["defaults", "autotune", *(_env_label(p) for p in points)]
    where = f", {args.hosts} test hosts x {args.slots}, links at {args.rate}" if args.hosts else ""
    print(
        f"train, -np {args.np}{where}, batch {args.batch} per rank, "
        f"{args.steps} steps timed after {args.warmup} (tuning ends within "
        f"{args.warmup - 20}); medians of {args.rounds} rounds"
    )
    job = args.model
    print(f"{job}: {'setting':<40} {'samples/s':>10}")
    for label in labels:
        rate = np.median([r[label] for r in rounds])
        print(f"{'':<{len(job) + 2}}{label:<40} {rate:>10.0f}")
    best_fixed = [max(r[_env_label(p)] for p in points) for r in rounds]
    vs_best = np.median([r["autotune"] / b for r, b in zip(rounds, best_fixed, strict=True)])
    vs_defaults = np.median([r["autotune"] / r["defaults"] for r in rounds])
    print(f"autotune / best fixed setting of the same round: {vs_best:.3f}")
    print(f"autotune / defaults: {vs_defaults:.3f}")
    fields = [c for c in chosen[0] if c not in ("sample", "score_bytes_per_second")]
    for number, row in enumerate(chosen, 1):
        print(f"round {number}: autotune chose " + ", ".join(f"{f}={row[f]}" for f in fields))
