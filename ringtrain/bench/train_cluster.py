"""Training across namespace test hosts with capped links: ``bench train --hosts H`` (root).

Makes H test hosts (``ringtrain.bench.netns``), one rank each, and for every rate of
``--rates`` caps each host's link at it both ways, then runs these contenders on every
model, once per round, with the same model, per-rank batch, data and threads:

- one process alone, on this machine (the scaling baseline);
- H independent processes at once, on this machine, none binding cores (as a rank alone on
  its host binds none): what the cores allow H ranks, with no communication at all;
- ringtrain (``DistributedOptimizer``), and ringtrain with ``Compression.fp16``;
- Horovod's way: each step's gradients packed into one buffer and averaged by one
  ``MPI_Allreduce`` after backprop, as Horovod 0.28 does on CPU;
- ``MultiWorkerMirroredStrategy`` with one worker on each host.

The table gives, per rate, what ``bench train`` gives on one machine (samples/sec over all
ranks, the scaling ratio against one process, the ratio to MultiWorkerMirroredStrategy,
ringtrain's hidden fraction), plus each contender's ratio to Horovod's way, and two bounds
per model: the independent processes' samples/sec (the cores), and what the link allows an
uncompressed allreduce (``link_bound``).
"""

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

from ringtrain.bench import cluster, netns, train
from ringtrain.bench.children import EndedBySignalError, signals_raise

PREFIX = "rttrain"
_PROG = "python -m ringtrain.bench train --hosts"
_PORT = 47_000  # MultiWorkerMirroredStrategy's port on every test host (each has its own)


def run(args) -> int:
    """Make the hosts, measure every rate and model, print the tables; return the exit code."""
    if args.hosts < 2:
        print(f"{_PROG}: {args.hosts} hosts: expected at least 2", file=sys.stderr)
        return 2
    rates = [rate.strip() for rate in args.rates.split(",") if rate.strip()]
    try:
        for rate in rates:
            netns.parse_rate(rate)
        if args.delay:
            netns.check_delay(args.delay)
    except ValueError as error:
        print(f"{_PROG}: {error}", file=sys.stderr)
        return 2
    reason = netns.why_unavailable(PREFIX, ("tbf", "netem") if args.delay else ("tbf",))
    if reason:
        print(f"{_PROG}: cannot run: {reason}", file=sys.stderr)
        return 2
    args.np = args.hosts
    rows = []
    try:
        with signals_raise(), netns.cluster(args.hosts, PREFIX) as hosts:
            for rate in rates:
                netns.unlimit_links(list(hosts), PREFIX)
                netns.limit_links(list(hosts), rate, args.delay, PREFIX)
                rows.extend(_measure_rate(args, hosts, rate))
    except EndedBySignalError as ended:
        print(f"{_PROG}: {ended}; the test hosts are removed", file=sys.stderr)
        return 128 + ended.signum
    except (RuntimeError, TimeoutError) as error:  # a launch failed or ran past --timeout
        print(f"{_PROG}: {error}; the test hosts are removed", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


def _measure_rate(args, hosts, rate):
    """Run every model's rounds with the links at ``rate``; print and return its rows."""
    rows = []
    for model in (m.strip() for m in args.models.split(",")):
        rounds = []
        for k in range(1, args.rounds + 1):
            rounds.append(_measure_round(args, model, hosts))
            rates = ", ".join(f"{name} {sps:.0f}" for name, sps in rounds[-1]["rates"].items())
            print(f"{rate} {model} round {k}/{args.rounds}, samples/s: {rates}", flush=True)
        bound = link_bound(
            rounds[0]["gradient_bytes"], args.hosts, args.batch, netns.parse_rate(rate)
        )
        for row in train.summarize(model, rounds, args.batch):
            row["rate"] = rate
            row["link_bound_samples_per_sec"] = bound
            versus = [r["rates"][row["contender"]] / r["rates"][train.HOROVOD] for r in rounds]
            row["vs_horovod"] = float(np.median(versus))
            rows.append(row)
    print(f"\n{args.hosts} test hosts, one rank each, links capped at {rate} both ways")
    train.print_rows(rows, args.np, args.inter_op_threads, args.rounds)
    print(f"{'model':<6} {'contender':<40} {'vs ' + train.HOROVOD}")
    for row in rows:
        print(f"{row['model']:<6} {row['contender']:<40} {row['vs_horovod']:.2f}")
    for row in rows:
        if row["contender"] == _independent(args.hosts):
            print(
                f"{row['model']}: the cores allow {row['samples_per_sec']:.0f} samples/s "
                f"({row['contender']}); the link {row['link_bound_samples_per_sec']:.0f} "
                "uncompressed"
            )
    print(flush=True)
    return rows


def link_bound(gradient_bytes, hosts, batch, bits_per_s) -> float:
    """Return the samples/sec over ``hosts`` ranks that no uncompressed allreduce can pass.

    An allreduce of ``gradient_bytes`` a step over ``hosts`` hosts sends at least
    ``2(h-1)/h`` of them out of each host (a ring sends just that), and each link carries
    ``bits_per_s`` each way.
    """
    seconds = 2 * (hosts - 1) / hosts * gradient_bytes * 8 / bits_per_s
    return hosts * batch / seconds


def _independent(hosts) -> str:
    return f"{hosts} independent processes"


def _measure_round(args, model, hosts):
    """Run every contender once on ``hosts``; return what ``train.summarize`` takes."""
    names, n = list(hosts), len(hosts)
    with tempfile.TemporaryDirectory(prefix="ringtrain-train-cluster-") as folder:
        hostfile = Path(folder) / "hosts"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in names))

        def ranks(worker, *extra):
            command = [*train.worker_command(args, worker, model), *extra]
            return _launch_ranks(args, names, hostfile, command)

        alone = train.launch([train.worker_command(args, "alone", model)], args.timeout)[0]
        unbound = [{"RINGTRAIN_BIND_CORES": "0"}] * n
        independent = train.launch(train.at_once(args, "alone", model), args.timeout, unbound)
        ringtrain = ranks("ringtrain")
        fp16 = ranks("ringtrain", "--compression", "fp16")
        traced = ranks("ringtrain", "--timeline", os.path.join(folder, "timeline-{rank}.json"))
        packed = ranks("packed")
        mwms = train.launch(
            [
                netns.on_host(name, [*train.worker_command(args, "mwms", model), "--index", str(i)])
                for i, name in enumerate(names)
            ],
            args.timeout,
            _mwms_env(list(hosts.values())),
        )[0]
    together = dict(independent[0], samples_per_sec=sum(r["samples_per_sec"] for r in independent))
    reports = {
        "one process": alone,
        _independent(n): together,
        f"ringtrain, {n} hosts": ringtrain,
        f"ringtrain, {n} hosts, fp16": fp16,
        train.HOROVOD: packed,
        f"MultiWorkerMirroredStrategy, {n} hosts": mwms,
    }
    return {
        "rates": {name: found["samples_per_sec"] for name, found in reports.items()},
        "baselines": {name: "one process" for name in reports},
        "hidden": {f"ringtrain, {n} hosts": traced["hidden_fraction"]},
        "threads": {found["inter_op_threads"] for found in reports.values()},
        "cpus": {name: {found["cpus"]} for name, found in reports.items()},
        "cpu_ms": {name: found["cpu_ms_per_step"] for name, found in reports.items()},
        "gradient_bytes": alone["gradient_bytes"],
    }


def _launch_ranks(args, names, hostfile, command):
    """Run ``command`` as one rank on each host through ``ringtrain-run``; return rank 0's."""
    runner = [
        sys.executable, "-m", "ringtrain.runner", "-np", str(len(names)),
        "--hostfile", str(hostfile), "--network-interface", netns.SUBNET,
        "--mpi-args", shlex.join(cluster.mpi_args()), *command,
    ]  # fmt: skip
    # Unbound, as every other contender here runs: the comparison is of the exchange alone.
    env = dict(cluster.rank_env(), RINGTRAIN_BIND_CORES="0")
    return train.launch([netns.on_host(names[0], runner)], args.timeout, [env])[0]


def _mwms_env(addresses):
    """Return each worker's environment: its TF_CONFIG, one worker on each test host.

    Each host runs one worker, as ringtrain runs one rank per host: none divides the cores.
    """
    workers = [f"{address}:{_PORT}" for address in addresses]
    return [
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            ),
            "RINGTRAIN_BIND_CORES": "0",
        }
        for i in range(len(addresses))
    ]
