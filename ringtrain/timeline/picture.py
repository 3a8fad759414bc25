"""Draws one step of a ``Split`` with matplotlib: backprop on one lane, each tensor on its own.

matplotlib is an optional extra (``pip install 'ringtrain[plot]'``); this module imports it,
nothing else in ``ringtrain.timeline`` does.
"""

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ringtrain.engine import timeline as tl
from ringtrain.timeline.steps import Step
from ringtrain.timeline.trace import WAITING

_PHASE_COLOURS = {
    tl.MEMCPY_IN_FUSION_BUFFER: "tab:orange",
    tl.REDUCE_SCATTER: "tab:blue",
    tl.ALLGATHER: "tab:green",
    tl.MEMCPY_OUT_FUSION_BUFFER: "tab:purple",
}
_OTHER_PHASE = "tab:gray"
_BACKPROP = "tab:olive"
_WAITING = "lightgray"
_EXPOSED = "tab:red"


def figure(step: Step, title: str = "") -> Figure:
    """Return the picture of ``step``: a lane for backprop, then one per tensor.

    Lane labels are ``backprop`` and the tensors' names less the site, in hand-over order;
    times are ms from the first hand-over, and the exposed time is shaded.
    """
    lanes = ["backprop"] + [s.name[len(step.site) + 1 :] for s in step.submissions]
    fig = Figure(figsize=(9, 1.4 + 0.32 * len(lanes)), layout="constrained")
    ax = fig.add_subplot()

    def ms(us):
        return (us - step.start) / 1000

    ax.broken_barh([(0, ms(step.backprop_end))], (-0.35, 0.7), color=_BACKPROP)
    handed = [ms(s.handed) for s in step.submissions]
    ax.plot(handed, [0] * len(handed), "|", color="black", markersize=10)
    phases = set()
    for lane, submission in enumerate(step.submissions, 1):
        start, _ = submission.work
        wait = (ms(submission.handed), ms(start) - ms(submission.handed))
        ax.broken_barh([wait], (lane - 0.12, 0.24), color=_WAITING)
        for span in submission.spans:
            if span.phase in WAITING:
                continue
            phases.add(span.phase)
            bar = (ms(span.start), (span.end - span.start) / 1000)
            colour = _PHASE_COLOURS.get(span.phase, _OTHER_PHASE)
            ax.broken_barh([bar], (lane - 0.35, 0.7), color=colour)
        ax.plot([ms(submission.handed)], [lane], "|", color="black", markersize=10)
    exposed = (ms(step.backprop_end), ms(step.ready))
    ax.axvspan(*exposed, color=_EXPOSED, alpha=0.15, lw=0, zorder=0)
    ax.axvline(exposed[0], color=_EXPOSED, lw=1, ls="--")
    ax.text(
        exposed[0],
        -0.45,
        f" exposed {step.exposed / 1000:.2f} ms",
        color=_EXPOSED,
        va="bottom",
        fontsize=8,
    )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.5, -1.0)
    ax.set_xlim(0, ms(step.ready) * 1.02 or 1)
    ax.set_xlabel("ms since the step's first gradient was handed over")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=_legend(phases), loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(title or _title(step), fontsize=10)
    return fig


def _title(step):
    hidden = "-" if step.hidden_fraction is None else f"{step.hidden_fraction:.0%}"
    return (
        f"step {step.number} ({step.site}): comm {step.communication / 1000:.2f} ms, "
        f"{hidden} hidden behind backprop, exposed {step.exposed / 1000:.2f} ms"
    )


def _legend(phases):
    handles = [
        Patch(color=_BACKPROP, label="backprop (hand-overs |)"),
        Patch(color=_WAITING, label="negotiate / wait for ranks"),
    ]
    order = list(_PHASE_COLOURS)  # the order the engine runs them in
    for phase in sorted(phases, key=lambda p: (order.index(p) if p in order else len(order), p)):
        handles.append(Patch(color=_PHASE_COLOURS.get(phase, _OTHER_PHASE), label=phase.lower()))
    handles.append(Patch(color=_EXPOSED, alpha=0.15, label="exposed"))
    return handles


def save(step: Step, path: str, title: str = "") -> None:
    """Write ``step``'s picture (see ``figure``) to ``path`` as a PNG."""
    figure(step, title).savefig(path, format="png", dpi=100)
