"""The search of a sweep on Ray Tune: Optuna's TPE sampler and ASHA early stopping.

- **searcher**: a Ray Tune ``Searcher`` over an Optuna study
  (:class:`~iaa.platform.sweeps.distinct_search.StudySearch`, ask and tell) of a
  :mod:`~iaa.jobs.config.search_space`, with a seeded multivariate ``TPESampler`` after a seeded
  space-filling start that tries every searched value
  (:mod:`~iaa.platform.sweeps.space_filling`), proposing each configuration of a finite space once
  (:mod:`~iaa.platform.sweeps.distinct_search`). It learns from each trial's *best* validation accuracy
  (``best_valid_acc`` of the trial's last report), so that a trial ASHA cut short feeds TPE
  the best score it reached, not a rung-level one;
- **scheduler**: ASHA stops trials on the per-check ``valid_acc``, with ``checks`` as its
  clock: every validation check of the loop (every half epoch by default) is one report.

Each gets its own metric, so the Tune config names none (Tune refuses a metric given twice).
"""

from __future__ import annotations

from typing import Any

from iaa.jobs.config.presets import MODE, STOP_METRIC, TIME_ATTR, TunePreset
from iaa.jobs.config.search_space import SearchSpace

def searcher(space: SearchSpace, seed: int, sweep: str | None = None) -> Any:
    """Optuna TPE over ``space``, told each trial's best validation accuracy; no configuration twice.

    The study is the one that the running process bound to the Tune run ``sweep``
    (:mod:`~iaa.platform.sweeps.driver_side`: by default the SQLite file ``WORKDIR/optuna.db``,
    kept after the process ends, so that ``optuna-dashboard URL`` opens it and a resumed sweep
    continues it); without ``sweep``, a study in memory.
    """
    import optuna

    from iaa.platform.sweeps.distinct_search import StudySearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return StudySearch(to_optuna(space), sampler(space, seed), sweep)


def sampler(space: SearchSpace, seed: int) -> Any:
    """The sweep's Optuna sampler: a space-filling start (every searched value at least once),
    then TPE, both seeded; no configuration twice while the space has untried ones."""
    from optuna.samplers import TPESampler

    from iaa.platform.sweeps.distinct_search import DistinctSampler

    return DistinctSampler(TPESampler(seed=seed), to_optuna(space), space.size, seed=seed)


def scheduler(preset: TunePreset, max_t: int) -> Any:
    """ASHA on the current check's ``valid_acc``; a trial reaching ``max_t`` checks is stopped."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr=TIME_ATTR, metric=STOP_METRIC, mode=MODE, max_t=max_t,
                         grace_period=min(preset.grace_period, max_t), reduction_factor=preset.reduction_factor)


def to_optuna(space: SearchSpace) -> dict[str, Any]:
    """Optuna distributions by parameter name, for ``OptunaSearch(space=...)``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for name, p in space.params.items():
        if p.choices is not None:
            out[name] = CategoricalDistribution(list(p.choices))
        elif p.integer:
            out[name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            out[name] = FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
    return out
