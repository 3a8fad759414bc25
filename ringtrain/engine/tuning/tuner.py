"""Rank 0's autotune run: warm up, recall or search, then settle on the best settings.

The engine hands the tuner every allreduce that rank 0 runs (``Tuner.ran``); when it
returns settings, the coordinator's side sends them to every rank as a ``tuned``
response, which each rank applies between two responses, so that every collective runs
whole under one set of settings on every rank (``engine.core``). The run:

1. Warm-up: ``autotune_warmup_samples`` samples' worth of steps run untimed (tracing,
   first-touch allocation). The last whole step names the job (``memory.job_key``).
2. Where the remembered settings (``memory``) hold the job, every rank switches to them,
   and tuning ends there.
3. Otherwise ``autotune_samples`` samples, the job's starting settings first, each
   ``autotune_steps_per_sample`` whole steps long, scored in bytes per second of the
   median step (``steps``) and proposed by the search (``search``). Each is logged
   (``log``).
4. The start stays unless the best sample beats the first (the starting settings) by
   ``KEEP_START_MARGIN``. Where it does, the best and the start are timed again in turn
   (``confirm``), and the best is kept only if its fresh samples beat the start's by the
   margin too. Every rank switches to the one kept; it is logged last and remembered.

A job whose allreduces never repeat a name has no steps to time: after
``GIVE_UP_RESPONSES`` allreduces without one, the tuner warns, and the job keeps (or goes
back to) the settings it started with.
"""

import warnings

from ringtrain.engine.tuning import search as search_module
from ringtrain.engine.tuning import space
from ringtrain.engine.tuning.confirm import SAMPLES_EACH, Confirmation
from ringtrain.engine.tuning.log import TuningLog
from ringtrain.engine.tuning.memory import TuningMemory, job_key
from ringtrain.engine.tuning.steps import StepClock, signature

GIVE_UP_RESPONSES = 10_000
# The best sample must beat the first (the starting settings) by this much to be taken, in
# the search and again in the confirmation:
# settings that act alike differ here by 1-2% between samples, so a smaller win is noise,
# and the start is what the job would have run. In ``bench autotune``, within one launch,
# autotune that took a noisy win ran at 0.96-0.97 of the defaults at 2 hosts x 2 ranks.
KEEP_START_MARGIN = 0.03


def steps_to_tune(settings) -> int:
    """Return the step that begins as tuning ends under ``settings`` at the latest.

    That is with a confirmation, remembering nothing. A step ends as the next begins, and
    each sample's timing starts at a step's start.
    """
    per = settings.autotune_steps_per_sample
    samples = settings.autotune_samples + 2 * SAMPLES_EACH
    return settings.autotune_warmup_samples * per + 2 + samples * (per + 1)


class Tuner:
    """One job's autotune run on rank 0; see the module docstring.

    ``fields``: the settings it tunes (``space.tuned_fields``); ``start``: every tunable
    setting's value at the start (``space.current``); ``key_of(signature)`` returns the
    job's key for the memory. ``settings`` gives the budget, the log and the memory's path.
    """

    def __init__(self, settings, fields, start: dict, key_of, clock, seed: int = 0):
        self.fields = tuple(fields)
        self.start = dict(start)
        self._key_of = key_of
        # Made at init() (80 ms here), not between two steps; a missing optuna fails there.
        self._search = search_module.Search(self.fields, self.start, seed) if fields else None
        self._sampling = False
        self._steps = StepClock(clock)
        self._per_sample = settings.autotune_steps_per_sample
        self._warmup_steps = settings.autotune_warmup_samples * self._per_sample
        self._samples = settings.autotune_samples
        self._log = TuningLog(settings.autotune_log) if settings.autotune_log else None
        self._memory = TuningMemory(settings.autotune_cache) if settings.autotune_cache else None
        self._key = None
        self._trying: dict | None = None  # the sample being timed
        self._first: tuple[dict, float] | None = None  # the first sample and its score
        self._confirmation: Confirmation | None = None  # once the search has ended
        self.sampled = 0  # samples scored, the confirmation's too
        self.done = False
        self.best: dict | None = None  # the settings it settled on: searched or remembered

    def ran(self, metas) -> dict | None:
        """Take one allreduce that rank 0 ran; return settings every rank must switch to."""
        steps = self._steps
        if not steps.ran(metas):
            if steps.since_boundary >= GIVE_UP_RESPONSES:
                return self._give_up()
            return None
        if not self._sampling:
            return self._warmed_up() if steps.steps >= self._warmup_steps else None
        if steps.steps < self._per_sample:
            return None
        score = steps.score()
        self.sampled += 1
        if self._log is not None:
            self._log.sample(self.sampled, self._trying, score)
        if self._confirmation is not None:
            return self._confirmed(score)
        self._search.tell(score)
        if self.sampled == 1:
            self._first = (self._trying, score)
        if self.sampled == self._samples:
            return self._searched()
        return self._ask()

    def switch(self, values) -> dict:
        """Return ``values`` (every field of ``space``) for every rank to switch to, once done.

        Raises ValueError while tuning, for a value out of its range, or for a change to a
        field it does not tune (the user's, or hierarchical where it cannot switch).
        """
        if not self.done:
            raise ValueError("autotune is still tuning: switch settings once it is done")
        tuned = space.checked(values, self.fields)
        kept = {f: self.start[f] for f in space.FIELDS if f not in self.fields}
        missing = [f for f in kept if f not in values]
        if missing:
            raise ValueError(f"no value for {missing[0]}")
        changed = {f: values[f] for f, value in kept.items() if values[f] != value}
        if changed:
            raise ValueError(
                f"cannot change {changed}: the user set them, or they cannot switch on this "
                f"job; they stay {kept}"
            )
        return {**kept, **tuned}

    def _warmed_up(self):
        """Name the job; return its remembered settings, or the first sample's."""
        self._key = self._key_of(signature(self._steps.last_step))
        remembered = self._memory.recall(self._key) if self._memory is not None else None
        if remembered is not None:
            self.done = True
            self._close()
            self.best = {**self.start, **{f: remembered[f] for f in self.fields}}
            return self.best
        if self._search is None:  # the user set every tunable setting: they are the best
            self.done, self.best = True, dict(self.start)
            self._close()
            return None
        self._sampling = True
        return self._ask()

    def _ask(self):
        """Start timing the search's next sample; return its settings."""
        return self._try({**self.start, **self._search.ask()})

    def _searched(self):
        """Keep the start, or time the search's best against it again (``confirm``)."""
        best, best_score = self._search.best()
        best = {**self.start, **best}
        first, first_score = self._first
        if best == first or best_score < first_score * (1 + KEEP_START_MARGIN):
            return self._finish(first, first_score)
        self._confirmation = Confirmation(first, best, KEEP_START_MARGIN)
        return self._try(self._confirmation.next())

    def _confirmed(self, score):
        """Take a confirmation sample's score; time the next, or keep the winner."""
        self._confirmation.tell(score)
        following = self._confirmation.next()
        if following is None:
            return self._finish(*self._confirmation.winner())
        return self._try(following)

    def _try(self, values):
        """Start timing a sample of ``values``; return them for every rank to switch to."""
        self._trying = values
        self._steps.restart()
        return values

    def _finish(self, best, score):
        if self._log is not None:
            self._log.sample("best", best, score)
        if self._memory is not None:
            self._memory.remember(self._key, best, score)
        self.done, self.best = True, best
        self._close()
        return best

    def _give_up(self):
        warnings.warn(
            f"autotune stopped: {GIVE_UP_RESPONSES} allreduces ran without a name coming "
            "back, so there are no steps to time (name the tensors a step reduces); the "
            "settings stay as they were at the start",
            stacklevel=2,
        )
        self.done = True
        self._close()
        return dict(self.start) if self._trying is not None else None

    def _close(self):
        if self._log is not None:
            self._log.close()


def tuner_for(settings, topology, transport, clock) -> Tuner:
    """Return the tuner of an engine on rank 0 over ``transport`` (``router.Transport``)."""
    start = space.current(settings, transport.capabilities.hierarchical)
    fields = space.tuned_fields(settings.user_set, transport.hierarchical_switchable)

    def key_of(model):
        return job_key(model, topology, transport.link_rate())

    return Tuner(settings, fields, start, key_of, clock)
