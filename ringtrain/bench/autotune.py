"""Autotune against a sweep: a job's speed with the defaults, tuned, and fixed settings.

``python -m ringtrain.bench autotune`` compares, for one job: the defaults, autotune on,
and every point of a sweep of fixed settings (fusion threshold x ring chunk x response
cache). The job is ``bench train``'s ringtrain contender (``--workload train``: the custom
train step of ``--model`` at ``--np`` ranks, samples/s) or one allreduce of ``--size``
bytes (``--workload allreduce``, calls/s, beside ``MPI_Allreduce``). Each round is one
launch (``autotune_job``) that tunes, then times every setting in ``--blocks`` blocks within
the launch: launches of one setting differ here by more than the settings do. It prints
medians over every block of ratios taken within the block, and the settings that autotune
chose. Two sweep points stand for the sweep: the best fixed setting, the one with the best
median in its launch, and the sweep's pick, held out: in each block, the point with the best
median over the launch's other blocks. The first is the luckiest of 8 and biased upwards by
the very noise it wins on; the second times the point a sweep would pick on blocks that did
not pick it (leave-one-out), so it is not. The defaults are timed twice, under two labels,
and the ratio of the two shows how far apart one setting's two labels land in the run: the
spread within which autotune, where it keeps the defaults, may land above or below them.

With ``--hosts H`` (root) the ranks run on H namespace test hosts (``ringtrain.bench.netns``),
``--slots`` ranks each, with every host's link capped at ``--rate`` both ways.
"""

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
HELD_OUT = "sweep's pick, held out"
DEFAULTS_AGAIN = "defaults, timed again"

# The sweep: fusion threshold x ring chunk x response cache (8 fixed settings).
SWEEP = {
    "fusion_threshold": (1 << 20, 64 << 20),
    "ring_chunk_bytes": (256 << 10, 4 << 20),
    "response_cache": (False, True),
}


def add_arguments(parser) -> None:
    """Add this benchmark's options to ``parser``."""
    parser.add_argument("--workload", choices=["train", "allreduce"], default="train")
    parser.add_argument("--model", default="mlp", help="bench train's model (default mlp)")
    parser.add_argument("--size", type=int, default=1 << 20, help="allreduce bytes (default 1 MiB)")
    parser.add_argument("--batch", type=int, default=64, help="train: per rank (default 64)")
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="launches (default 2)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks in each launch (default 5)")
    parser.add_argument(
        "--steps", type=int, default=30, help="train: steps timed per setting a block (default 30)"
    )
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="allreduce: time per setting a block (0.5)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="per launch, in seconds")
    parser.add_argument("--hosts", type=int, default=0, help="namespace test hosts (root)")
    parser.add_argument("--slots", type=int, default=1, help="with --hosts: ranks per host")
    parser.add_argument("--rate", default="1gbit", help="with --hosts: each host's link cap")


def warmup_steps(environ=os.environ) -> int:
    """Return the untimed steps every launch starts with: as many as tuning takes, and 20."""
    return tuner.steps_to_tune(settings.read(environ)) + 20


def sweep_values(start) -> dict[str, dict]:
    """Return each sweep point's tunable settings by label: ``start`` with the point's values."""
    points = (
        dict(zip(SWEEP, values, strict=True)) for values in itertools.product(*SWEEP.values())
    )
    return {_label(point): {**start, **point} for point in points}


def run(args) -> int:
    """Run every launch, on this machine or on test hosts; print the ratios and the choices."""
    args.warmup = warmup_steps()
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
    return [
        sys.executable, "-m", "ringtrain.bench.autotune_job", "--workload", args.workload,
        "--model", args.model, "--batch", str(args.batch), "--size", str(args.size),
        "--warmup", str(args.warmup), "--blocks", str(args.blocks), "--steps", str(args.steps),
        "--seconds", str(args.seconds),
    ]  # fmt: skip


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
    """Tune and time every setting within each of ``args.rounds`` launches; print them.

    Each block's ratios are taken within the block; the best fixed setting is the sweep
    point with the best median in its launch.
    """
    sweep = list(sweep_values({}))
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for number in range(1, args.rounds + 1):
        result = launch({"RINGTRAIN_AUTOTUNE": "1"})
        launched = result["rates"]
        best = max(sweep, key=lambda label: np.median(launched[label]))
        for label, values in {**launched, "best fixed": launched[best]}.items():
            rates.setdefault(label, []).extend(values)
        pairs = {"autotune / best fixed setting": ("autotune", best)}
        pairs["autotune / defaults"] = ("autotune", "defaults")
        pairs[f"{DEFAULTS_AGAIN} / defaults"] = (DEFAULTS_AGAIN, "defaults")
        if MPI_LABEL in launched:
            for top, shown in (
                ("autotune", "autotune"),
                ("defaults", "defaults"),
                (best, "best fixed"),
            ):
                pairs[f"{shown} / {MPI_LABEL}"] = (top, MPI_LABEL)
        picks = held_out_picks(launched, sweep) if args.blocks > 1 else []
        for block, pick in enumerate(picks):
            rates.setdefault(HELD_OUT, []).append(launched[pick][block])
            ratios.setdefault(f"autotune / {HELD_OUT}", []).append(
                launched["autotune"][block] / launched[pick][block]
            )
        for block in range(args.blocks):
            for name, (top, bottom) in pairs.items():
                ratios.setdefault(name, []).append(launched[top][block] / launched[bottom][block])
        chosen = ", ".join(f"{f}={v}" for f, v in result["settings"]["autotune"].items())
        print(f"round {number}/{args.rounds}: autotune chose {chosen}; best fixed: {best}")
    _print(args, rates, ratios)
    return 0


def held_out_picks(launched: dict[str, list[float]], sweep: list[str]) -> list[str]:
    """Return, for each block, the sweep point with the best median over the other blocks."""
    blocks = len(launched[sweep[0]])
    return [
        max(
            sweep,
            key=lambda label: np.median(launched[label][:block] + launched[label][block + 1 :]),
        )
        for block in range(blocks)
    ]


def _print(args, rates, ratios) -> None:
    where = f", {args.hosts} test hosts x {args.slots}, links at {args.rate}" if args.hosts else ""
    if args.workload == "train":
        job, unit = f"{args.model}, batch {args.batch} per rank", "samples/s"
        each = f"{args.steps} steps"
    else:
        job, unit, each = f"allreduce of {args.size} bytes", "calls/s", f"{args.seconds:g} s"
    print(
        f"{job}, -np {args.np}{where}: tuned within {args.warmup - 20} steps, then every "
        f"setting timed for {each} in each of {args.blocks} blocks of {args.rounds} launches; "
        f"medians over {args.blocks * args.rounds} blocks"
    )
    for label, values in rates.items():
        print(f"  {label:<40} {np.median(values):>10.0f} {unit}")
    for name, values in ratios.items():
        print(f"{name}: {np.median(values):.3f}")


def _label(point) -> str:
    """Return how the table names a sweep point."""
    fusion, chunk = point["fusion_threshold"] >> 20, point["ring_chunk_bytes"] >> 10
    cache = "on" if point["response_cache"] else "off"
    return f"fusion {fusion} MiB, chunk {chunk} KiB, cache {cache}"
