"""Splits a trace's gradient exchanges into training steps and measures their overlap.

Per step, on the trace's clock:

- hand-over: a tensor's ENQUEUE, the moment TensorFlow handed its gradient to the engine;
- backprop: from the step's first hand-over to its last. Backprop computes for a while
  before its first gradient, unseen by the engine; this is the part the exchange can overlap;
- a tensor's work: from the start of its first span that moves data (the copy into the
  fusion buffer, the ring's reduce-scatter and allgather, the copy out; or an allgather) to
  the end of its last. Tensors fused into one buffer share one work interval, a group;
- communication: the union of the step's work intervals, the time the engine spent moving
  the step's data;
- hidden: the part of communication before the last hand-over; the hidden fraction is
  hidden / communication;
- exposed: from the last hand-over until the last work ended (the last result was ready):
  how long the step waits for the exchange once backprop is done. Besides the
  communication after the last hand-over (communication - hidden) it counts the
  negotiation and the waits for other ranks that the last tensors go through then, so it
  is never less than communication - hidden.

Splitting: the TensorFlow binding hands a step's gradients over as one list whose tensors
are named ``SITE.0``, ``SITE.1``, ... (``SITE.i.values`` and ``SITE.i.indices`` for
``tf.IndexedSlices``) beside ``SITE.manifest``, with the same SITE (``DistributedOptimizer``,
``DistributedGradientTape``) every step. So every name recurs once a step: walking a site's
hand-overs in time order, a step ends where a name it already holds comes again. Sites
whose tensors are broadcast (``broadcast_variables``) are not training steps, and names
outside any site (a script's own collectives, metric averaging) are left out.
"""

import math
import re
from dataclasses import dataclass

from ringtrain.timeline.trace import Submission, Trace, TraceError

_MANIFEST = ".manifest"
_MEMBER = re.compile(r"\d+(\.values|\.indices)?|manifest")
_BROADCAST = "BROADCAST"  # the span the executor records for a broadcast


@dataclass
class Step:
    """One training step's exchange: its submissions in hand-over order, and its figures.

    Times are microseconds on the trace's clock; ``groups`` numbers each submission's
    fusion group (from 1, in the order their work started).
    """

    number: int
    site: str
    submissions: list[Submission]
    groups: list[int]
    start: float
    backprop_end: float
    ready: float
    communication: float
    hidden: float

    @property
    def backprop(self) -> float:
        """Return the time from the first hand-over to the last."""
        return self.backprop_end - self.start

    @property
    def exposed(self) -> float:
        """Return the time from the last hand-over until the last result was ready."""
        return self.ready - self.backprop_end

    @property
    def hidden_fraction(self) -> float | None:
        """Return hidden / communication (None for a step that moved nothing)."""
        return self.hidden / self.communication if self.communication > 0 else None

    @property
    def duration(self) -> float:
        """Return the time from the first hand-over until the last result was ready."""
        return self.ready - self.start


@dataclass
class Split:
    """The training steps found in ``trace``, numbered from 1 in time order.

    ``incomplete`` counts the steps left out because the trace ends (or starts) in the
    middle of their exchange.
    """

    trace: Trace
    steps: list[Step]
    incomplete: int

    def step(self, number: int) -> Step:
        """Return step ``number``; raise TraceError if there is no such step."""
        if not 1 <= number <= len(self.steps):
            raise TraceError(
                f"{self.trace.path}: there is no step {number}: its steps are "
                f"1 to {len(self.steps)}"
            )
        return self.steps[number - 1]

    def representative(self) -> Step:
        """Return the step of median duration (the shorter of the two middle ones)."""
        ordered = sorted(self.steps, key=lambda s: (s.duration, s.number))
        return ordered[(len(ordered) - 1) // 2]


def split(trace: Trace) -> Split:
    """Return the training steps of ``trace``; raise TraceError if it holds none."""
    runs = []
    for site, submissions in _by_site(trace.submissions).items():
        if any(span.phase == _BROADCAST for s in submissions for span in s.spans):
            continue
        run, names = [], set()
        for submission in submissions:
            if submission.name in names:
                runs.append((site, run))
                run, names = [], set()
            run.append(submission)
            names.add(submission.name)
        runs.append((site, run))
    complete = [(site, run) for site, run in runs if all(s.work for s in run)]
    if not complete:
        found = "only steps whose exchange it does not hold to the end" if runs else "none"
        raise TraceError(
            f"{trace.path}: no training steps ({found}): a step is a list of gradients "
            "handed over together, named SITE.0, SITE.1, ... with SITE.manifest; record "
            "the timeline while training with DistributedOptimizer or DistributedGradientTape"
        )
    complete.sort(key=lambda pair: pair[1][0].handed)
    steps = [_measure(n, site, run) for n, (site, run) in enumerate(complete, 1)]
    return Split(trace, steps, len(runs) - len(complete))


def _by_site(submissions):
    """Return the submissions of each site, in hand-over order."""
    sites = {s.name[: -len(_MANIFEST)] for s in submissions if s.name.endswith(_MANIFEST)}
    found: dict[str, list[Submission]] = {}
    for submission in submissions:
        site = _site(submission.name, sites)
        if site is not None:
            found.setdefault(site, []).append(submission)
    return found


def _site(name, sites):
    """Return the longest of ``sites`` that ``name`` is a list member of, or None."""
    best = None
    for site in sites:
        rest = name[len(site) + 1 :]
        if name.startswith(site + ".") and _MEMBER.fullmatch(rest):
            if best is None or len(site) > len(best):
                best = site
    return best


def _measure(number, site, submissions):
    works = [s.work for s in submissions]
    handed = [s.handed for s in submissions]
    first_work = {}
    for work in sorted(set(works)):
        first_work[work] = len(first_work) + 1
    backprop_end = max(handed)
    return Step(
        number=number,
        site=site,
        submissions=submissions,
        groups=[first_work[w] for w in works],
        start=min(handed),
        backprop_end=backprop_end,
        ready=max(s.ready for s in submissions),
        communication=_covered(works),
        hidden=_covered(works, until=backprop_end),
    )


def _covered(intervals, until=math.inf):
    """Return the length of the union of ``intervals`` (start, end) that lies before ``until``."""
    total, reach = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, until)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total
