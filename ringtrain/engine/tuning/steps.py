"""Steps found in the stream of allreduces that rank 0 runs, and a sample's score.

The engine knows no steps, so a step ends where a name comes back: a training step hands
over each gradient once, under the same name every step. A sample's score is the bytes
its whole steps reduced per second of wall time (Horovod's score), so it counts the time
between the steps as well: the model's compute, and what the settings cost it.
"""

import hashlib

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
        self._began = None  # the first boundary's time
        self._bytes = 0  # bytes since it
        self._timed = (0, 0.0)  # (bytes, seconds) of the whole steps since it

    def ran(self, metas) -> bool:
        """Take one allreduce of ``metas`` (this rank's); return True if it began a step."""
        names = self._names
        boundary = any(meta.name in names for meta in metas)
        if boundary:
            now = self._clock()
            if self._began is None:
                self._began, self._bytes = now, 0
            else:
                self.steps += 1
                self._timed = (self._bytes, now - self._began)
            names.clear()
            self.last_step, self._step = self._step, []
            self.since_boundary = 0
        names.update(meta.name for meta in metas)
        self._step.extend(metas)
        self.since_boundary += 1
        self._bytes += sum(nbytes_in_buffer(meta) for meta in metas)
        return boundary

    def score(self) -> float:
        """Return the bytes per second of the whole steps timed since ``restart``."""
        nbytes, seconds = self._timed
        return nbytes / seconds if seconds > 0 else 0.0


def signature(metas) -> str:
    """Return a short hash of a step's tensors: names, dtypes, shapes and ops, sorted."""
    text = repr(sorted((m.name, m.dtype, tuple(m.shape), m.op) for m in metas))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
