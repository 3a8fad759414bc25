"""Command line of the benchmarks: ``python -m ringtrain.bench allreduce [--json FILE]``."""

import argparse
import sys

from ringtrain.bench import allreduce, kernels


def main(argv=None) -> int:
    """Parse the benchmark's name and options and run it; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench")
    commands = parser.add_subparsers(dest="benchmark", required=True)
    allreduce.add_arguments(commands.add_parser("allreduce", help=allreduce.__doc__))
    kernels.add_arguments(commands.add_parser("kernels", help=kernels.__doc__))
    args = parser.parse_args(argv)
    return {"allreduce": allreduce.run, "kernels": kernels.run}[args.benchmark](args)


if __name__ == "__main__":
    sys.exit(main())
