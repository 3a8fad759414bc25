"""Reads one rank's Chrome-trace timeline into its submissions: hand-over time and spans."""

import bisect
import json
from dataclasses import dataclass, field

from ringtrain.engine import timeline as tl

# The spans before the engine starts moving a tensor's data; every other span moves it.
WAITING = frozenset({tl.NEGOTIATE, tl.WAIT_FOR_OTHER_RANKS})


class TraceError(ValueError):
    """A file that is not a readable ringtrain timeline, or one with nothing to summarise."""


@dataclass
class Span:
    """One phase of a submission, from ``start`` to ``end`` (microseconds)."""

    phase: str
    start: float
    end: float


@dataclass
class Submission:
    """One hand-over of tensor ``name`` to the engine at ``handed``, and its spans since."""

    name: str
    handed: float
    spans: list[Span] = field(default_factory=list)

    @property
    def work(self) -> tuple[float, float] | None:
        """Return (start, end) of the spans that move its data, or None if it has none."""
        moving = [s for s in self.spans if s.phase not in WAITING]
        if not moving:
            return None
        return min(s.start for s in moving), max(s.end for s in moving)

    @property
    def ready(self) -> float:
        """Return when its last span ended (its hand-over time if it has none)."""
        return max((s.end for s in self.spans), default=self.handed)


@dataclass
class Trace:
    """The submissions of rank ``rank`` in the file ``path``, in hand-over order."""

    path: str
    rank: int
    submissions: list[Submission]


def load(path: str) -> Trace:
    """Read the timeline at ``path``; raise TraceError, naming it, if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except OSError as error:
        raise TraceError(f"{path}: cannot read it: {error.strerror or error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{path}: not a JSON timeline: {error}") from error
    if isinstance(document, dict):  # Chrome's object form
        document = document.get("traceEvents")
    if not isinstance(document, list):
        raise TraceError(f"{path}: not a timeline: expected a JSON array of trace events")
    if not document:
        raise TraceError(f"{path}: the timeline holds no events")
    try:
        return _parse(path, document)
    except (KeyError, TypeError, ValueError) as error:
        raise TraceError(f"{path}: not a ringtrain timeline: {error}") from error


def _parse(path, events):
    tracks = {}
    for event in events:
        if event["ph"] == "M" and event["name"] == "thread_name":
            tracks[event["tid"]] = event["args"]["name"]
    ranks = sorted({event["pid"] for event in events})
    if len(ranks) > 1:
        raise TraceError(
            f"{path}: holds the events of ranks {ranks}; summarise one rank's file "
            "(RINGTRAIN_TIMELINE with {rank} in its path writes one per rank)"
        )
    handed: dict[str, list[Submission]] = {}
    spans = []
    for index, event in enumerate(events):
        if event["ph"] == "M":
            continue
        tid = event["tid"]
        if tid not in tracks:
            raise ValueError(f"event {index} is on track {tid}, which has no thread_name")
        name, ts = tracks[tid], float(event["ts"])
        if event["ph"] == "i" and event["name"] == tl.ENQUEUE:
            handed.setdefault(name, []).append(Submission(name, ts))
        elif event["ph"] == "X":
            spans.append((name, Span(event["name"], ts, ts + float(event["dur"]))))
    for runs in handed.values():
        runs.sort(key=lambda s: s.handed)
    times = {name: [s.handed for s in runs] for name, runs in handed.items()}
    for name, span in spans:
        # A span belongs to the latest hand-over of its name at or before its start: a
        # name is never handed over again while in flight (DuplicateNameError).
        k = bisect.bisect_right(times.get(name, ()), span.start) - 1
        if k >= 0:  # else it was handed over before the timeline started
            handed[name][k].spans.append(span)
    submissions = sorted((s for runs in handed.values() for s in runs), key=lambda s: s.handed)
    return Trace(path, ranks[0], submissions)
