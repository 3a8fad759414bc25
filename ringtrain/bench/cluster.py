"""Allreduce across namespace hosts with rate-limited links, against MPI_Allreduce (root).

Makes ``--hosts`` test hosts (``ringtrain.bench.netns``), caps each host's link at ``--rate``
both ways, measures the raw TCP ceiling with ``iperf3``, and for each ``--ranks-per-host``
runs ``python -m ringtrain.bench allreduce`` through ``ringtrain-run --hostfile`` once per
transport that applies: the flat ring, and the hierarchical allreduce where a host runs
several ranks. The namespaces and every process in them are removed on any exit.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import ringtrain
from ringtrain import settings
from ringtrain.bench import netns
from ringtrain.bench.allreduce import parse_sizes
from ringtrain.bench.ceiling import tcp_ceiling
from ringtrain.bench.children import EndedBySignalError, end_group, signals_raise

PREFIX = "rtbench"
DEFAULT_SIZES = [1 << 20, 4 << 20, 16 << 20]
_PROG = "python -m ringtrain.bench cluster"
_PACKAGE_ROOT = str(Path(ringtrain.__file__).resolve().parent.parent)
_COLLECTIVE_TIMEOUT = settings.env_name("collective_timeout")
_HIERARCHICAL = settings.env_name("hierarchical_allreduce")


def add_arguments(parser) -> None:
    """Declare this benchmark's options on ``parser``."""
    parser.add_argument("--hosts", type=_checked(_hosts), default=2, help="test hosts (default 2)")
    parser.add_argument(
        "--ranks-per-host",
        type=_checked(_counts),
        default=[1, 2],
        help="comma-separated layouts to run, ranks on each host (default 1,2)",
    )
    parser.add_argument(
        "--rate",
        type=_checked(_rate),
        default="1gbit",
        help="each host's link, both ways (default 1gbit)",
    )
    parser.add_argument(
        "--burst",
        type=_checked(_burst),
        help="each link's token bucket, e.g. 256kb for a strict link (default: 2 ms of the "
        "rate, 256 KiB at least)",
    )
    parser.add_argument(
        "--delay",
        type=_checked(netns.check_delay),
        help="one-way delay added to what each host sends, e.g. 1ms",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help="comma-separated buffer sizes in bytes (default 1, 4 and 16 MiB)",
    )
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="time budget per size and contender"
    )
    parser.add_argument(
        "--bench-args",
        default="--small-count 20",
        help="more options for `python -m ringtrain.bench allreduce`, as one string "
        "(default '--small-count 20')",
    )
    parser.add_argument("--mpi-args", default="", help="more options for mpirun, as one string")
    parser.add_argument(
        "--iperf-seconds", type=float, default=3.0, help="length of the TCP ceiling measurement"
    )
    parser.add_argument(
        "--launch-timeout",
        type=float,
        default=300.0,
        help="seconds one benchmark launch may take before it is killed (default 300); its "
        "ranks' RINGTRAIN_COLLECTIVE_TIMEOUT is half of it unless set",
    )
    parser.add_argument("--prefix", default=PREFIX, help="name prefix of the namespaces")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


def run(args) -> int:
    """Make the cluster, run every layout and transport, print and save the results."""
    qdiscs = ("tbf", "netem") if args.delay else ("tbf",)
    reason = netns.why_unavailable(args.prefix, qdiscs)
    if reason:
        print(f"{_PROG}: cannot run: {reason}", file=sys.stderr)
        return 2
    try:
        with signals_raise(), netns.cluster(args.hosts, args.prefix) as hosts:
            result = _measure(args, hosts)
    except EndedBySignalError as ended:
        print(f"{_PROG}: {ended}; the test hosts are removed", file=sys.stderr)
        return 128 + ended.signum
    except (RuntimeError, TimeoutError) as error:
        print(f"{_PROG}: {error}; the test hosts are removed", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def _measure(args, hosts):
    names, addresses = list(hosts), list(hosts.values())
    netns.limit_links(names, args.rate, args.delay, args.prefix, args.burst)
    ceiling, note = tcp_ceiling(names[1], addresses[1], names[0], args.iperf_seconds)
    result = {
        "hosts": args.hosts,
        "rate": args.rate,
        "rate_bits_per_s": netns.parse_rate(args.rate),
        "burst": args.burst,
        "delay": args.delay,
        "tcp_ceiling_bits_per_s": ceiling,
        "runs": [],
    }
    _print_header(result, note)
    for per_host in args.ranks_per_host:
        for transport in ("flat", "hierarchical") if per_host > 1 else ("flat",):
            rows = _launch(args, names, per_host, transport)
            rows = [_link_fractions(row, result) for row in rows]
            result["runs"].append(
                {"ranks_per_host": per_host, "transport": transport, "rows": rows}
            )
            _print_run(result, per_host, transport, rows)
    return result


def _launch(args, names, per_host, transport):
    """Run the allreduce benchmark on ``per_host`` ranks of every host; return its rows."""
    with tempfile.TemporaryDirectory(prefix="ringtrain-cluster-") as tmp:
        hostfile = Path(tmp) / "hosts"
        hostfile.write_text("".join(f"{name} slots={per_host}\n" for name in names))
        out = Path(tmp) / "rows.json"
        command = [
            sys.executable, "-m", "ringtrain.runner", "-np", str(per_host * len(names)),
            "--hostfile", str(hostfile), "--network-interface", netns.SUBNET,
            "--mpi-args", shlex.join(mpi_args(args.mpi_args)),
            sys.executable, "-m", "ringtrain.bench", "allreduce",
            "--sizes", ",".join(map(str, args.sizes)), "--seconds", f"{args.seconds:g}",
            "--json", str(out), *shlex.split(args.bench_args),
        ]  # fmt: skip
        env = launch_env(transport, args.launch_timeout)
        what = f"{len(names)} hosts x {per_host} ranks, {transport}"
        _run_bounded(netns.on_host(names[0], command), env, args.launch_timeout, what, tmp)
        return json.loads(out.read_text())


def mpi_args(extra: str = "") -> list[str]:
    """Return ``ringtrain-run --mpi-args``'s words for a launch on the test hosts.

    Open MPI reaches the hosts through the namespace agent instead of ssh, and ranks, which
    may outnumber the cores, yield their core while they wait in MPI; ``extra`` is added.
    """
    words = ["--prtemca", "plm_ssh_agent", netns.agent(), "--mca", "mpi_yield_when_idle", "1"]
    return words + shlex.split(extra)


def launch_env(transport: str, launch_timeout: float, environ=os.environ) -> dict[str, str]:
    """Return the environment of one launch on ``transport``: ``environ`` and ``rank_env``'s.

    ``ringtrain-run`` passes ``RINGTRAIN_*`` variables on to every rank. Unless ``environ``
    sets one, the ranks' collective timeout is half the launch's, so that a wait that never
    ends says what it waited for before the launch is killed.
    """
    env = dict(environ, **rank_env())
    env[_HIERARCHICAL] = str(int(transport == "hierarchical"))
    env.setdefault(_COLLECTIVE_TIMEOUT, f"{launch_timeout / 2:g}")
    return env


def rank_env() -> dict[str, str]:
    """Return the environment that a launch on the test hosts adds for its ranks.

    Ranks bind to cores as they would anywhere: every test host runs on this machine's one
    kernel, so its ranks divide the machine's cores together (``affinity.machine_id``).
    """
    pythonpath = [_PACKAGE_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(pythonpath)}


def _run_bounded(argv, env, timeout, what, folder):
    """Run one launch to its end; on a failure, a timeout or a signal end its process tree."""
    log = Path(folder) / "launch.log"
    with open(log, "w+") as output:
        child = subprocess.Popen(
            argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = child.wait(timeout)
            failure = f"exited {code}"
        except subprocess.TimeoutExpired:
            code, failure = None, f"ran past {timeout:g} s"
        finally:
            end_group(child)
        if code != 0:
            output.seek(0)
            tail = "".join(output.readlines()[-40:])
            raise RuntimeError(f"the benchmark on {what} {failure}; its output ends:\n{tail}")


def _link_fractions(row, result):
    """Add to a benchmark row its bus bandwidth over the link rate and the TCP ceiling.

    Here bus bandwidth counts what each host's link must carry each way at the least,
    ``moved * (h-1)/h`` of the buffer for ``h`` hosts, whatever the ranks per host: twice
    for an allreduce, once for an allgather (the row's ``moved``).
    """
    hosts = result["hosts"]
    bits = row["bytes"] * 8 * row["moved"] * (hosts - 1) / hosts
    fractions = {"link": result["rate_bits_per_s"], "tcp": result["tcp_ceiling_bits_per_s"]}
    extra = {}
    for name, ceiling in fractions.items():
        for who in ("ringtrain", "mpi"):
            busbw = bits / (row[f"{who}_us"] * 1e-6)
            extra[f"{who}_{name}_fraction"] = busbw / ceiling if ceiling else None
    return {**row, **extra}


def _print_header(result, note):
    delay = f", {result['delay']} one-way delay" if result["delay"] else ""
    burst = f", a {result['burst']} burst" if result["burst"] else ""
    print(
        f"{result['hosts']} test hosts, each link capped at {result['rate']} both ways"
        f"{burst}{delay}"
    )
    ceiling = result["tcp_ceiling_bits_per_s"]
    if ceiling:
        rate = result["rate_bits_per_s"]
        print(f"TCP ceiling (iperf3, both ways at once): {ceiling / 1e6:.0f} Mbit/s, "
              f"{ceiling / rate:.3f} of the rate")  # fmt: skip
    else:
        print(note)
    print(
        "busbw counts 2(h-1)/h of the buffer per host link ((h-1)/h in an allgather); "
        "ratio = MPI time / ringtrain's\n"
    )


def _print_run(result, per_host, transport, rows):
    tcp = result["tcp_ceiling_bits_per_s"] is not None
    ranks = per_host * result["hosts"]
    print(f"{result['hosts']} hosts x {per_host} ranks ({ranks} ranks), ringtrain {transport}")
    columns = ["case", "bytes", "ringtrain ms", "MPI ms", "rt/link", "MPI/link"]
    columns += ["rt/TCP", "MPI/TCP"] * tcp + ["ratio"]
    widths = [18, 10, 12, 9, 8, 8] + [8, 8] * tcp + [6]
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        cells = [row["case"], row["bytes"], f"{row['ringtrain_us'] / 1e3:.2f}"]
        cells += [f"{row['mpi_us'] / 1e3:.2f}"]
        names = ["link", "tcp"] if tcp else ["link"]
        cells += [
            f"{row[f'{who}_{name}_fraction']:.3f}" for name in names for who in ("ringtrain", "mpi")
        ]
        cells += [f"{row['busbw_ratio']:.2f}"]
        print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), flush=True)
    print(flush=True)


def _checked(parse):
    """Return ``parse`` reporting a ValueError as argparse reports a bad option."""

    def checked(text):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return checked


def _hosts(text):
    if int(text) < 2:
        raise ValueError(f"{text} hosts: expected at least 2")
    return int(text)


def _counts(text):
    counts = [int(x) for x in text.split(",")]
    if min(counts) < 1:
        raise ValueError(f"ranks per host {text!r}: expected whole numbers of at least 1")
    return counts


def _rate(text):
    netns.parse_rate(text)
    return text


def _burst(text):
    netns.parse_burst(text)
    return text
