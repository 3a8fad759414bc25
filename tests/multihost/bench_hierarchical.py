"""Flat ring against hierarchical allreduce on a namespace cluster with slow links (root only).

Two test hosts with two ranks each; ``tc`` limits each host's link to ``--rate``. Runs
``python -m ringtrain.bench allreduce`` through ``ringtrain-run`` once per mode and prints
ringtrain's median time per size side by side:

    python tests/multihost/bench_hierarchical.py --rate 1gbit --sizes 1048576,16777216
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import netns_cluster

REPO = Path(__file__).resolve().parent.parent.parent


def _run_bench(names, hostfile, hierarchical, sizes, seconds, out):
    # Four ranks share this machine's two cores: ranks waiting in MPI must yield them.
    mpi_args = shlex.join(
        ["--prtemca", "plm_ssh_agent", netns_cluster.agent(), "--mca", "mpi_yield_when_idle", "1"]
    )
    command = [
        sys.executable, "-m", "ringtrain.runner", "-np", "4", "--hostfile", str(hostfile),
        "--network-interface", netns_cluster.SUBNET, "--mpi-args", mpi_args,
        sys.executable, "-m", "ringtrain.bench", "allreduce", "--sizes", sizes,
        "--seconds", str(seconds), "--small-count", "20", "--json", str(out),
    ]  # fmt: skip
    # The launcher passes RINGTRAIN_* variables on to every rank.
    env = dict(
        os.environ, PYTHONPATH=str(REPO), RINGTRAIN_HIERARCHICAL_ALLREDUCE=str(int(hierarchical))
    )
    subprocess.run(netns_cluster.on_host(names[0], command), check=True, env=env, timeout=1800)
    return json.loads(Path(out).read_text())


def main() -> None:
    """Make the cluster, limit its links, run both modes and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="tc rate per host link, e.g. 1gbit")
    parser.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with netns_cluster.cluster(2) as hosts, tempfile.TemporaryDirectory() as tmp:
        names = list(hosts)
        for name in names:
            subprocess.run(
                ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root",
                 "tbf", "rate", args.rate, "burst", "256kb", "latency", "50ms"],
                check=True, timeout=20,
            )  # fmt: skip
        hostfile = Path(tmp) / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in names))
        flat = _run_bench(names, hostfile, False, args.sizes, args.seconds, Path(tmp) / "f.json")
        hier = _run_bench(names, hostfile, True, args.sizes, args.seconds, Path(tmp) / "h.json")
    print(f"4 ranks on 2 hosts, links limited to {args.rate}; medians in ms")
    print(f"{'case':>10} {'bytes':>10} {'flat':>9} {'hier':>9} {'flat/hier':>9} {'MPI':>9}")
    for f, h in zip(flat, hier, strict=True):
        print(
            f"{f['case']:>10} {f['bytes']:>10} {f['ringtrain_us'] / 1e3:>9.2f} "
            f"{h['ringtrain_us'] / 1e3:>9.2f} {f['ringtrain_us'] / h['ringtrain_us']:>9.2f} "
            f"{f['mpi_us'] / 1e3:>9.2f}"
        )


if __name__ == "__main__":
    main()
