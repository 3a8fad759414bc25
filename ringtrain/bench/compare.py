"""Checkouts of ringtrain timed in turns on one machine, as ratios (not under mpirun).

For a change's before and after: ``python -m ringtrain.bench compare OLD NEW``, where each
is a source checkout (a folder holding the ``ringtrain`` package). One job per checkout
runs at once under ``mpirun -np N``; the jobs take turns, one batch of every case at a time
(``compare_rank``), so each round compares batches that ran next to each other in time.
On a shared machine whose speed drifts by tens of percent between runs, the median of
those per-round ratios moves by a few percent where separate runs' medians move by tens.
The cases are the allreduce benchmark's: a lone allreduce into ``out=`` and read-only per
size, a grouped allreduce of small tensors, and the same tensors as one ``allreduce_async``
each (the per-tensor negotiation path).
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringtrain.bench.allreduce import parse_sizes
from ringtrain.bench.children import EndedBySignalError, end_group, signals_raise
from ringtrain.runner.locate import find_mpirun

_RANK_SCRIPT = str(Path(__file__).with_name("compare_rank.py"))
_PROG = "python -m ringtrain.bench compare"


def add_arguments(parser) -> None:
    """Add the comparison's options to ``parser``."""
    parser.add_argument(
        "checkouts", nargs="+", help="two or more folders that hold a ringtrain package"
    )
    parser.add_argument("-np", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--rounds", type=int, default=30, help="batches per case (default 30)")
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=[4096, 1 << 20, 16 << 20],
        help="comma-separated buffer sizes in bytes (default 4096,1048576,16777216)",
    )
    parser.add_argument("--small-count", type=int, default=50, help="tensors grouped (0: none)")
    parser.add_argument("--small-bytes", type=int, default=16384)
    parser.add_argument(
        "--batch-seconds", type=float, default=0.05, help="how long a batch of one case runs"
    )
    parser.add_argument(
        "--cycle-time-ms",
        type=float,
        default=20.0,
        help="RINGTRAIN_CYCLE_TIME of every job (default 20): a job that waits for its "
        "turn then wakes its engine thread 50 times a second, not 1000",
    )
    parser.add_argument("--mpi-args", default="", help="more options for mpirun, as one string")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for all jobs")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")


def run(args) -> int:
    """Run one job per checkout in turns and print the per-case medians and ratios."""
    if len(args.checkouts) < 2:
        print(f"{_PROG}: give two or more checkouts to compare, got {args.checkouts}")
        return 2
    for option, value in (("-np", args.np), ("--rounds", args.rounds)):
        if value < 1:
            print(f"{_PROG}: {option} must be 1 or more, got {value}")
            return 2
    if not args.batch_seconds > 0:
        print(f"{_PROG}: --batch-seconds must be above 0, got {args.batch_seconds:g}")
        return 2
    for path in args.checkouts:
        if not (Path(path) / "ringtrain" / "__init__.py").is_file():
            print(f"{_PROG}: {path} holds no ringtrain package ({path}/ringtrain/__init__.py)")
            return 2
    try:
        with signals_raise():
            results = _measure(args)
    except EndedBySignalError as ended:
        print(f"{_PROG}: {ended}; every job was ended", file=sys.stderr)
        return 128 + ended.signum
    except (RuntimeError, FileNotFoundError) as err:  # a job that failed; no mpirun found
        print(f"{_PROG}: {err}", file=sys.stderr)
        return 1
    rows = _rows(args.checkouts, results)
    _print(args, rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


def _measure(args) -> list[dict]:
    """Run every job to its end; return each one's times (``compare_rank``'s JSON)."""
    with tempfile.TemporaryDirectory(prefix="ringtrain-compare-") as tmp:
        turns = Path(tmp) / "turn"
        turns.write_text("0")
        children, logs = [], []
        try:
            for k, checkout in enumerate(args.checkouts):
                log = open(Path(tmp) / f"job{k}.log", "w+")  # noqa: SIM115 - closed below
                logs.append(log)
                children.append(
                    subprocess.Popen(
                        _command(args, k, str(turns), Path(tmp) / f"job{k}.json"),
                        env=_environment(args, checkout),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            _wait(args, children, logs)
            return [
                json.loads((Path(tmp) / f"job{k}.json").read_text()) for k in range(len(children))
            ]
        finally:
            for child in children:
                end_group(child)
            for log in logs:
                log.close()


def _command(args, k, turns, out) -> list[str]:
    return [
        find_mpirun(), "-np", str(args.np), "--oversubscribe", "--bind-to", "none",
        *shlex.split(args.mpi_args),
        sys.executable, "-P", _RANK_SCRIPT, "--turns", turns, "--job", str(k),
        "--jobs", str(len(args.checkouts)), "--rounds", str(args.rounds),
        "--sizes", ",".join(map(str, args.sizes)), "--small-count", str(args.small_count),
        "--small-bytes", str(args.small_bytes), "--batch-seconds", f"{args.batch_seconds:g}",
        "--json", str(out),
    ]  # fmt: skip


def _environment(args, checkout) -> dict[str, str]:
    """Return a job's environment: ``checkout`` first on the path, and the cycle time."""
    path = [str(Path(checkout).resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(path),
        RINGTRAIN_CYCLE_TIME=f"{args.cycle_time_ms:g}",
    )


def _wait(args, children, logs):
    """Return once every job has ended well; raise RuntimeError naming one that did not."""
    deadline = time.monotonic() + args.timeout
    while any(child.poll() is None for child in children):
        for k, child in enumerate(children):
            if child.poll() not in (None, 0):
                raise RuntimeError(_failure(args, k, f"exited {child.returncode}", logs[k]))
        if time.monotonic() > deadline:
            late = [k for k, child in enumerate(children) if child.poll() is None]
            raise RuntimeError(
                _failure(args, late[0], f"ran past {args.timeout:g} s", logs[late[0]])
            )
        time.sleep(0.2)
    for k, child in enumerate(children):
        if child.returncode != 0:
            raise RuntimeError(_failure(args, k, f"exited {child.returncode}", logs[k]))


def _failure(args, k, what, log) -> str:
    log.flush()
    log.seek(0)
    tail = "".join(log.readlines()[-30:])
    return f"the job of {args.checkouts[k]} {what}; every job was ended; its output ends:\n{tail}"


def _rows(checkouts, results) -> list[dict]:
    """Return a row per case and checkout: median time, and ratio to the first checkout's."""
    rows = []
    first = results[0]["cases"]
    for checkout, result in zip(checkouts, results, strict=True):
        for case, base in zip(result["cases"], first, strict=True):
            ratios = [t / b for t, b in zip(case["us"], base["us"], strict=True)]
            rows.append(
                {
                    "case": case["case"],
                    "bytes": case["bytes"],
                    "ranks": result["ranks"],
                    "checkout": checkout,
                    "commit": _commit(checkout),
                    "calls_per_batch": case["calls"],
                    "median_us": statistics.median(case["us"]),
                    "ratio_median": statistics.median(ratios),
                    "ratio_quartiles": _quartiles(ratios),
                    "rounds_faster": sum(r < 1 for r in ratios),
                    "rounds": len(ratios),
                }
            )
    return rows


def _quartiles(values) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    low, _, high = statistics.quantiles(values, n=4)
    return [low, high]


def _commit(checkout) -> str:
    """Return the short commit of ``checkout`` with '+' if it has changes, or '-' if unknown."""
    git = ["git", "-C", checkout]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "-"
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", "ringtrain"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+" if changed.stdout.strip() else "")


def _print(args, rows):
    checkouts = args.checkouts
    letters = [chr(ord("A") + k) for k in range(len(checkouts))]
    print(
        f"{_PROG}: {rows[0]['ranks']} ranks a job, {args.rounds} rounds of batches of "
        f"~{args.batch_seconds:g} s taken in turns; medians over rounds, us; ratio: a "
        "round's time over A's in the same round"
    )
    for letter, checkout in zip(letters, checkouts, strict=True):
        commit = next(r["commit"] for r in rows if r["checkout"] == checkout)
        print(f"  {letter} = {checkout} ({commit})")
    header = ["case", "bytes", *(f"{x} us" for x in letters)]
    for x in letters[1:]:
        header += [f"{x}/A", f"{x}/A quartiles", f"{x} faster"]
    lines = [header]
    cases = len(rows) // len(checkouts)
    for i in range(cases):
        per = [rows[k * cases + i] for k in range(len(checkouts))]
        line = [per[0]["case"], str(per[0]["bytes"]), *(f"{r['median_us']:.1f}" for r in per)]
        for r in per[1:]:
            low, high = r["ratio_quartiles"]
            line += [
                f"{r['ratio_median']:.3f}",
                f"{low:.2f}-{high:.2f}",
                f"{r['rounds_faster']}/{r['rounds']}",
            ]
        lines.append(line)
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)), flush=True)
