"""Writes a ``Split`` as readable tables, or as plain values for JSON (times in ms)."""

import statistics

from ringtrain.timeline.steps import Split, Step

_LEGEND = (
    "backprop: first to last gradient handed over; comm: time the engine moved the step's "
    "data;\nhidden: share of comm before the last hand-over; exposed: last hand-over to last "
    "result\n(definitions: pydoc ringtrain.timeline.steps)"
)


def _ms(us):
    return us / 1000


def _percent(fraction):
    return "-" if fraction is None else f"{fraction:.0%}"


def _short(name, site):
    """Return ``name`` without its site's prefix (``SITE.3`` -> ``3``)."""
    return name[len(site) + 1 :]


def text(split: Split, chosen: Step) -> str:
    """Return the table of steps, their medians, and the table of ``chosen``'s tensors."""
    trace = split.trace
    sites = sorted({s.site for s in split.steps})
    lines = [
        f"{trace.path}: rank {trace.rank}, {len(split.steps)} training step(s) of "
        f"{', '.join(sites)}; times in ms",
    ]
    if split.incomplete:
        lines.append(f"({split.incomplete} step(s) cut off by the trace's ends left out)")
    header = f"{'step':>6} {'backprop':>9} {'comm':>8} {'hidden':>7} {'exposed':>8} "
    header += f"{'tensors':>8} {'groups':>7}"
    lines += ["", header]
    for step in split.steps:
        lines.append(
            f"{step.number:>6} {_ms(step.backprop):>9.2f} {_ms(step.communication):>8.2f} "
            f"{_percent(step.hidden_fraction):>7} {_ms(step.exposed):>8.2f} "
            f"{len(step.submissions):>8} {max(step.groups):>7}"
        )
    median = _medians(split.steps)
    lines.append(
        f"{'median':>6} {median['backprop_ms']:>9.2f} {median['communication_ms']:>8.2f} "
        f"{_percent(median['hidden_fraction']):>7} {median['exposed_ms']:>8.2f}"
    )
    lines += ["", _LEGEND, ""]
    lines.append(
        f"step {chosen.number} ({chosen.site}): backprop {_ms(chosen.backprop):.2f}, "
        f"comm {_ms(chosen.communication):.2f}, hidden {_percent(chosen.hidden_fraction)}, "
        f"exposed {_ms(chosen.exposed):.2f}; times from its first hand-over"
    )
    lines.append(
        f"{'tensor':>14} {'handed':>8} {'waited':>8} {'work':>8} {'ready':>8} {'group':>6}"
    )
    for submission, group in zip(chosen.submissions, chosen.groups, strict=True):
        start, end = submission.work
        lines.append(
            f"{_short(submission.name, chosen.site):>14} "
            f"{_ms(submission.handed - chosen.start):>8.2f} "
            f"{_ms(start - submission.handed):>8.2f} {_ms(end - start):>8.2f} "
            f"{_ms(submission.ready - chosen.start):>8.2f} {group:>6}"
        )
    return "\n".join(lines)


def values(split: Split, chosen: Step) -> dict:
    """Return every step's figures and tensors as plain values (ms on the trace's clock)."""
    return {
        "trace": split.trace.path,
        "rank": split.trace.rank,
        "incomplete_steps": split.incomplete,
        "chosen_step": chosen.number,
        "median": _medians(split.steps),
        "steps": [_step_values(step) for step in split.steps],
    }


def _figures(step):
    return {
        "backprop_ms": _ms(step.backprop),
        "communication_ms": _ms(step.communication),
        "hidden_ms": _ms(step.hidden),
        "hidden_fraction": step.hidden_fraction,
        "exposed_ms": _ms(step.exposed),
    }


def _medians(steps):
    every = [_figures(step) for step in steps]
    median = {}
    for key in every[0]:
        known = [f[key] for f in every if f[key] is not None]
        median[key] = statistics.median(known) if known else None
    return median


def _step_values(step):
    tensors = []
    for submission, group in zip(step.submissions, step.groups, strict=True):
        start, end = submission.work
        tensors.append(
            {
                "name": submission.name,
                "handed_ms": _ms(submission.handed),
                "work_start_ms": _ms(start),
                "work_end_ms": _ms(end),
                "ready_ms": _ms(submission.ready),
                "group": group,
            }
        )
    return {
        "step": step.number,
        "site": step.site,
        "start_ms": _ms(step.start),
        "ready_ms": _ms(step.ready),
        **_figures(step),
        "tensors": tensors,
    }
