"""Steps found in the stream of allreduces that rank 0 runs, and a sample's score.

The engine knows no steps, so a step ends where a name comes back: a training step hands
over each gradient once, under the same name every step. A sample's score is the bytes a
whole step reduced, on average, per second of its median step's wall time. The time
between the steps counts as well: the model's compute, and what the settings cost it.
Horovod divides the bytes by the whole sample's time; the median keeps one step that a
busy machine stalled from deciding a short sample's score.
"""

import hashlib
import statistics

from ringtrain.engine.fusion import nbytes_in_buffer


class StepClock:
    """Counts the steps in the allreduces ``ran`` is given, and times the whole ones.

    ``clock`` gives seconds. Timing starts at the first step boundary after ``restart``,
    so a partial step never counts. ``last_step`` holds the metas of the last whole step.
    """

    def __init__(self, clock):
        self._clock = clock
        self._names: set = set()  # names run since the last boundary
        self._step: list = []  # their metas
        self.last_step: list = []
        self.since_boundary = 0  # allreduces since the last boundary
        self.restart()

    def restart(self) -> None:
        """Start a new sample: forget the steps and bytes counted so far."""
        self.steps = 0
        self._began = None  # the last boundary's time, once timing has started
        self._bytes = 0  # bytes since it
        self._timed: list = []  # (bytes, seconds) of each whole step since timing started

    def ran(self, metas) -> bool:
        """Take one allreduce of ``metas`` (this rank's); return True if it began a step."""
        names = self._names
        boundary = any(meta.name in names for meta in metas)
        if boundary:
            now = self._clock()
            if self._began is not None:
                self.steps += 1
                self._timed.append((self._bytes, now - self._began))
            self._began, self._bytes = now, 0
            names.clear()
            self.last_step, self._step = self._step, []
            self.since_boundary = 0
        names.update(meta.name for meta in metas)
        self._step.extend(metas)
        self.since_boundary += 1
        self._bytes += sum(nbytes_in_buffer(meta) for meta in metas)
        return boundary

    def score(self) -> float:
        """Return a whole step's mean bytes per second of the median step (0 before one)."""
        if not self._timed:
            return 0.0
        seconds = statistics.median(seconds for _, seconds in self._timed)
        nbytes = sum(nbytes for nbytes, _ in self._timed) / len(self._timed)
        return nbytes / seconds if seconds > 0 else 0.0


def signature(metas) -> str:
    """Return a short hash of a step's tensors: names, dtypes, shapes and ops, sorted."""
    text = repr(sorted((m.name, m.dtype, tuple(m.shape), m.op) for m in metas))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
