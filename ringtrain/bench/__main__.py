"""Command line of the benchmarks: ``python -m ringtrain.bench allreduce [--json FILE]``."""

import argparse
import sys

from ringtrain.bench import allreduce, autotune, cluster, compare, kernels, negotiation, train


def main(argv=None) -> int:
    """Parse the benchmark's name and options and run it; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench")
    commands = parser.add_subparsers(dest="benchmark", required=True)
    allreduce.add_arguments(commands.add_parser("allreduce", help=allreduce.__doc__))
    kernels.add_arguments(commands.add_parser("kernels", help=kernels.__doc__))
    autotune.add_arguments(commands.add_parser("autotune", help=autotune.__doc__.splitlines()[0]))
    cluster.add_arguments(commands.add_parser("cluster", help=cluster.__doc__.splitlines()[0]))
    train.add_arguments(commands.add_parser("train", help=train.__doc__.splitlines()[0]))
    compare.add_arguments(commands.add_parser("compare", help=compare.__doc__.splitlines()[0]))
    negotiation.add_arguments(
        commands.add_parser("negotiation", help=negotiation.__doc__.splitlines()[0])
    )
    args = parser.parse_args(argv)
    runs = {
        "allreduce": allreduce.run,
        "autotune": autotune.run,
        "cluster": cluster.run,
        "compare": compare.run,
        "kernels": kernels.run,
        "negotiation": negotiation.run,
        "train": train.run,
    }
    return runs[args.benchmark](args)


if __name__ == "__main__":
    sys.exit(main())
