"""After the search: its best sample timed again against the starting settings, in turn.

The best of many noisy samples is biased upwards (the winner's curse): among settings
that act alike, one sample is always the luckiest. Fresh samples of the best and of the
start are not, so they decide. The best must beat the start there by the search's margin
too: the start is what the job would have run, and a best that acts alike gains nothing.
The order start, best, best, start (and so on) keeps a steady drift of the machine's speed
from favouring either.
"""

import statistics

# Samples of each of the two settings, after the search.
SAMPLES_EACH = 2


class Confirmation:
    """Times ``best`` against ``start``, ``SAMPLES_EACH`` samples each, in balanced order.

    ``margin``: how much higher the best's mean must be to be kept (0.03 is 3%).
    """

    def __init__(self, start: dict, best: dict, margin: float):
        self.start, self.best, self.margin = dict(start), dict(best), margin
        self._order: list[bool] = []  # True where the sample is the best's
        for turn in range(SAMPLES_EACH):
            self._order += [False, True] if turn % 2 == 0 else [True, False]
        self._scores: dict[bool, list[float]] = {False: [], True: []}

    def next(self) -> dict | None:
        """Return the settings of the next sample to time, or None once all are timed."""
        timed = len(self._scores[False]) + len(self._scores[True])
        if timed == len(self._order):
            return None
        return self.best if self._order[timed] else self.start

    def tell(self, score: float) -> None:
        """Record the score of the sample ``next`` returned last."""
        timed = len(self._scores[False]) + len(self._scores[True])
        self._scores[self._order[timed]].append(score)

    def winner(self) -> tuple[dict, float]:
        """Return the kept settings (the best if it beat the start by the margin) and their mean."""
        start, best = (statistics.fmean(self._scores[side]) for side in (False, True))
        return (self.best, best) if best > start * (1 + self.margin) else (self.start, start)
