"""``python -m ringtrain.timeline TRACE.json``: how much of each step's exchange is hidden.

Prints a table of the training steps in a timeline that ``RINGTRAIN_TIMELINE`` wrote, then
the tensors of one step (``--step N``, else the step of median duration); ``--json`` prints
every figure as JSON instead, and ``--png FILE`` draws that step.
"""

import argparse
import importlib
import json
import sys

from ringtrain.timeline import report, steps, trace

_PLOT_EXTRA = "pip install 'ringtrain[plot]'"


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m ringtrain.timeline",
        description="Summarise a RINGTRAIN_TIMELINE trace: per training step, backprop, "
        "communication, the share hidden behind backprop, and the exposed time.",
    )
    parser.add_argument("trace", help="one rank's timeline (Chrome trace JSON)")
    parser.add_argument(
        "--step", type=int, help="the step to detail and draw (default: the median one)"
    )
    parser.add_argument("--png", metavar="FILE", help="draw the step into FILE (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def main(argv=None) -> int:
    """Run the command line on ``argv``; return its exit status (errors exit 2 with a message)."""
    parser = _parser()
    args = parser.parse_args(argv)
    picture = None
    if args.png:
        try:
            picture = importlib.import_module("ringtrain.timeline.picture")
        except ModuleNotFoundError as error:
            if not (error.name or "").startswith("matplotlib"):
                raise
            parser.error(f"--png needs matplotlib, which is not installed: {_PLOT_EXTRA}")
    try:
        found = steps.split(trace.load(args.trace))
        chosen = found.representative() if args.step is None else found.step(args.step)
    except trace.TraceError as error:
        parser.error(str(error))
    if args.json:
        print(json.dumps(report.values(found, chosen), indent=1))
    else:
        print(report.text(found, chosen))
    if picture is not None:
        try:
            picture.save(chosen, args.png)
        except OSError as error:
            parser.error(f"cannot write {args.png}: {error.strerror or error}")
        print(f"step {chosen.number} drawn into {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
