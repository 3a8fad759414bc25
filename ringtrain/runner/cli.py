"""``ringtrain-run``: read the command line, build the mpirun argv and hand the job to mpirun."""

import argparse
import os
import shlex
import sys

from ringtrain.runner import elastic, exports, hosts, hydra, openmpi, watchdog
from ringtrain.runner.flavour import Flavour, detect
from ringtrain.runner.job import Job, LaunchError
from ringtrain.runner.locate import find_mpirun
from ringtrain.runner.rank_command import guarded

_BUILDERS = {Flavour.OPENMPI: openmpi.build_argv, Flavour.HYDRA: hydra.build_argv}

_EPILOG = """\
examples:
  ringtrain-run -np 4 python train.py --epochs 3
  ringtrain-run -np 8 -H node1:4,node2:4 python train.py
  ringtrain-run -np 8 --hostfile hostfiles/two-machines --network-interface 10.0.0.0/24 \\
      python train.py
  ringtrain-run -np 4 --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh python train.py

Without -H or --hostfile the job runs on this machine, which it may oversubscribe: Open MPI
then oversubscribes only when -np exceeds the cores it counts. With hosts, -np must fit
their slots unless --oversubscribe is given. Python ranks run under a guard that ends the
whole job when one rank raises or exits non-zero. The exit status is the job's; with
--start-timeout, it is 124 when some rank did not start in time.

With --host-discovery-script the job is elastic: the script prints the hosts it may use now
('host:slots' lines), and the job is relaunched on them when a rank fails or the hosts
change, resuming from the state that ringtrain.elastic committed last. A host that failed
the job is left out of the next launches for --blacklist-cooldown seconds, and for good
once it failed --blacklist-limit times.
"""


def main(argv: list[str] | None = None) -> int:
    """Run ``ringtrain-run`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run, e.g. ringtrain-run -np 2 python train.py")
    if args.start_timeout is not None and args.start_timeout <= 0:
        parser.error(f"--start-timeout must be positive, not {args.start_timeout:g}")
    if args.host_discovery_script is not None:
        return _run_elastic(parser, args, command)
    for option in _ELASTIC_ONLY:
        if getattr(args, option) is not None:
            flag = "--" + option.replace("_", "-")
            parser.error(f"{flag} needs --host-discovery-script (an elastic job)")
    try:
        mpirun = find_mpirun()
        flavour = detect(mpirun)
        command = _command(command, args.start_timeout is not None)
        job = _job(args, command, args.num_proc, _hosts(args), _settings(args))
        launch = _BUILDERS[flavour](mpirun, job)
    except (OSError, ValueError) as err:
        print(f"ringtrain-run: error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(launch))
        return 0
    if args.verbose:
        print(f"ringtrain-run: {flavour.value} at {mpirun}", file=sys.stderr)
        print(f"ringtrain-run: {shlex.join(launch)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return watchdog.supervise(launch, job.num_proc, args.start_timeout, _where(job.hosts))


_ELASTIC_ONLY = (
    "min_np",
    "max_np",
    "slots_per_host",
    "elastic_timeout",
    "reset_limit",
    "elastic_state_dir",
    "blacklist_cooldown",
    "blacklist_limit",
)


def _run_elastic(parser, args, command):
    if args.hosts is not None or args.hostfile is not None:
        parser.error("--host-discovery-script lists the hosts itself: drop -H/--hostfile")
    if args.start_timeout is not None:
        parser.error("--start-timeout cannot be combined with --host-discovery-script")
    try:
        given = {  # options left out take Elastic's defaults
            "slots_per_host": args.slots_per_host,
            "timeout": args.elastic_timeout,
            "reset_limit": args.reset_limit,
            "state_dir": args.elastic_state_dir,
            "blacklist_cooldown": args.blacklist_cooldown,
            "blacklist_limit": args.blacklist_limit,
        }
        options = elastic.Elastic(
            script=args.host_discovery_script,
            min_np=args.num_proc if args.min_np is None else args.min_np,
            max_np=args.num_proc if args.max_np is None else args.max_np,
            **{name: value for name, value in given.items() if value is not None},
        )
        mpirun = find_mpirun()
        build = _BUILDERS[detect(mpirun)]
        guarded_command = _command(command, True)
        base_env = _settings(args)

        def launcher(found, num_proc, launch_env):
            job = _job(args, guarded_command, num_proc, found, {**base_env, **launch_env})
            return build(mpirun, job)

        if args.dry_run:
            directory = args.elastic_state_dir or "<a new temporary directory>"
            print(shlex.join(elastic.first_launch(options, launcher, directory)))
            return 0
        sys.stdout.flush()
        return elastic.run(options, launcher)
    except (OSError, ValueError) as err:
        print(f"ringtrain-run: error: {err}", file=sys.stderr)
        return 2


def _job(args, command, num_proc, found, env):
    """Return the Job of ``command`` on ``num_proc`` ranks of ``found`` hosts, with ``env``."""
    return Job(
        command=tuple(command),
        num_proc=num_proc,
        hosts=found,
        env=tuple(sorted(env.items())),
        network_interface=args.network_interface,
        oversubscribe=args.oversubscribe,
        mpi_args=tuple(shlex.split(args.mpi_args or "")),
    )


def _command(command, announce):
    wrapped = guarded(command, announce)
    if announce and wrapped == command:
        raise LaunchError(
            "--start-timeout and --host-discovery-script need a Python command (python "
            "script.py, -m module or -c code): its ranks report their start through "
            "ringtrain's rank guard"
        )
    return wrapped


def _where(found):
    if found is None:
        return lambda rank: "this machine"
    return lambda rank: hosts.host_of_rank(list(found), rank) or "an oversubscribed slot"


def _hosts(args):
    if args.hosts is None and args.hostfile is None:
        return None
    if args.hostfile is not None:
        found, source = hosts.parse_hostfile(args.hostfile), args.hostfile
    else:
        found, source = hosts.parse_host_list(args.hosts), "-H"
    hosts.check_slots(found, args.num_proc, source, args.oversubscribe)
    return tuple(found)


def _settings(args):
    return exports.settings_env(
        os.environ,
        fusion_threshold_mb=args.fusion_threshold_mb,
        cycle_time_ms=args.cycle_time_ms,
        timeline_filename=args.timeline_filename,
        stall_check_warning_time_seconds=args.stall_check_warning_time_seconds,
        stall_check_shutdown_time_seconds=args.stall_check_shutdown_time_seconds,
        hierarchical_allreduce=args.hierarchical_allreduce,
        autotune=args.autotune,
        autotune_log_file=args.autotune_log_file,
    )


def _parser():
    parser = argparse.ArgumentParser(
        prog="ringtrain-run",
        description="Launch a ringtrain job with mpirun (Open MPI 5 or MPICH/Hydra).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "-np",
        "--num-proc",
        type=int,
        required=True,
        metavar="N",
        help="number of ranks (in an elastic job: the default of --min-np and --max-np)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", metavar="HOST:N,...", help="hosts and slots")
    where.add_argument(
        "-hostfile", "--hostfile", metavar="FILE", help="Open MPI hostfile ('host slots=N' lines)"
    )
    parser.add_argument(
        "--oversubscribe", action="store_true", help="allow more ranks than the hosts' slots"
    )
    parser.add_argument(
        "--network-interface",
        metavar="NICS|CIDR",
        help="interface names (eth0,eth1) or a subnet (10.0.0.0/24) for MPI's data and control "
        "traffic",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        metavar="SECONDS",
        help="end the job (exit status 124) unless every rank has started within this time",
    )
    tuning = parser.add_argument_group("ringtrain settings, exported to every rank")
    tuning.add_argument("--fusion-threshold-mb", type=float, metavar="MIB", help="fusion buffer")
    tuning.add_argument("--cycle-time-ms", type=float, metavar="MS", help="engine cycle time")
    tuning.add_argument("--timeline-filename", metavar="FILE", help="Chrome-trace timeline file")
    tuning.add_argument(
        "--stall-check-warning-time-seconds",
        type=float,
        metavar="SECONDS",
        help="warn about a tensor that some ranks have not submitted after this time",
    )
    tuning.add_argument(
        "--stall-check-shutdown-time-seconds",
        type=float,
        metavar="SECONDS",
        help="fail a tensor (StallError) that stays stalled this long",
    )
    tuning.add_argument(
        "--hierarchical-allreduce",
        action="store_true",
        help="reduce within each host, then across hosts",
    )
    tuning.add_argument(
        "--autotune",
        action="store_true",
        help="try settings during the first steps and keep the best (RINGTRAIN_AUTOTUNE)",
    )
    tuning.add_argument(
        "--autotune-log-file", metavar="FILE", help="CSV of every autotune sample and the best"
    )
    flexible = parser.add_argument_group(
        "elastic jobs (relaunched from their last commit when a rank fails or hosts change)"
    )
    flexible.add_argument(
        "--host-discovery-script",
        metavar="FILE",
        help="executable that prints the usable hosts, one 'host:slots' line each",
    )
    flexible.add_argument("--min-np", type=int, metavar="N", help="fewest ranks (default: -np)")
    flexible.add_argument("--max-np", type=int, metavar="N", help="most ranks (default: -np)")
    flexible.add_argument(
        "--slots-per-host", type=int, metavar="N", help="slots of a host listed without :N (1)"
    )
    flexible.add_argument(
        "--elastic-timeout",
        type=float,
        metavar="SECONDS",
        help="how long to wait for --min-np slots before giving up (600)",
    )
    flexible.add_argument(
        "--reset-limit",
        type=int,
        metavar="N",
        help="failed launches to relaunch before giving up (3); host changes do not count",
    )
    flexible.add_argument(
        "--blacklist-cooldown",
        type=float,
        metavar="SECONDS",
        help="how long a host that failed the job is left out of its launches (60)",
    )
    flexible.add_argument(
        "--blacklist-limit",
        type=int,
        metavar="N",
        help="failures after which a host is left out for good (2)",
    )
    flexible.add_argument(
        "--elastic-state-dir",
        metavar="DIR",
        help="where ranks keep their commits (default: a temporary directory, removed on "
        "success); on several hosts, the same path on each",
    )
    parser.add_argument(
        "--mpi-args", metavar="ARGS", help='extra mpirun arguments, e.g. "--mca btl ^openib"'
    )
    parser.add_argument("--verbose", action="store_true", help="print the MPI found and command")
    parser.add_argument("--dry-run", action="store_true", help="print the mpirun command and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program to run and its args")
    return parser
