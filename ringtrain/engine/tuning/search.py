"""The optimiser behind autotune: optuna's TPE sampler, asked for one sample at a time.

Each tuned setting is searched as its position in ``space.Parameter.choices``, an ordered
integer range, so that the sampler models sizes as sizes. The first sample is the
settings the job started with, so the best found is never a sample worse than those; the
second is the same with every switch (hierarchical, the cache) the other way, so both
sides of each switch are measured whatever the sampler draws.
"""

import warnings

from ringtrain.engine.tuning.space import BY_FIELD

# TPE learns from this many samples at least; those before it are drawn at random.
_STARTUP_SAMPLES = 5


class Search:
    """Proposes samples of the tuned ``fields`` (``ask``) and learns their scores (``tell``).

    ``start``: the values the job started with, the first sample. ``seed`` makes the
    sequence of samples repeatable.
    """

    def __init__(self, fields, start: dict, seed: int = 0):
        optuna = _load_optimiser()

        self.fields = tuple(fields)
        self._parameters = [BY_FIELD[field] for field in self.fields]
        self._distributions = {
            p.field: optuna.distributions.IntDistribution(0, len(p.choices) - 1)
            for p in self._parameters
        }
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=_STARTUP_SAMPLES, multivariate=True
        )
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        # A starting value off the choices (a settings object built in code) is drawn instead.
        first = {
            p.field: p.index(start[p.field])
            for p in self._parameters
            if start[p.field] in p.choices
        }
        self._study.enqueue_trial(first)
        switches = [p.field for p in self._parameters if len(p.choices) == 2 and p.field in first]
        if switches:
            self._study.enqueue_trial({**first, **{field: 1 - first[field] for field in switches}})
        self._trial = None

    def ask(self) -> dict:
        """Return the next sample's values of the tuned fields."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is marked experimental
            self._trial = self._study.ask(self._distributions)
        return {p.field: p.choices[self._trial.params[p.field]] for p in self._parameters}

    def tell(self, score: float) -> None:
        """Record the score of the sample ``ask`` returned last (higher is better)."""
        self._study.tell(self._trial, score)
        self._trial = None

    def best(self) -> tuple[dict, float]:
        """Return the best sample's values and its score."""
        trial = self._study.best_trial
        values = {p.field: p.choices[trial.params[p.field]] for p in self._parameters}
        return values, trial.value


def _load_optimiser():
    """Import optuna quietly and return it; say how to install it where it is missing."""
    try:
        import optuna
    except ImportError:
        raise ImportError(
            "RINGTRAIN_AUTOTUNE needs optuna: pip install 'ringtrain[autotune]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna
