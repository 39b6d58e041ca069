"""The search of a sweep on Ray Tune: an Optuna sampler and ASHA early stopping.

- **searcher**: a Ray Tune ``Searcher`` over an Optuna study
  (:class:`~iaa.platform.sweeps.search.distinct_search.StudySearch`, ask and tell) of a
  :mod:`~iaa.jobs.config.search_space`, with the sampler the sweep names (:data:`SAMPLERS`,
  seeded; multivariate ``TPESampler`` by default) after a seeded space-filling start that tries
  every searched value (:mod:`~iaa.platform.sweeps.search.space_filling`), proposing each configuration
  of a finite space once (:mod:`~iaa.platform.sweeps.search.distinct_search`); ``grid`` instead tries
  every configuration of a finite space once, in a seeded order. It learns from each trial's
  *best* validation accuracy (``best_valid_acc`` of the trial's last report), so that a trial
  ASHA cut short feeds the sampler the best score it reached, not a rung-level one;
- **scheduler**: ASHA stops trials on the per-check ``valid_acc``, with ``checks`` as its
  clock: every validation check of the loop (every half epoch by default) is one report; the
  trials of configurations given to try first are left out of it
  (:class:`~iaa.platform.sweeps.search.asha.GivenAside`).

Each gets its own metric, so the Tune config names none (Tune refuses a metric given twice).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Mapping, Sequence

from optuna.samplers import BaseSampler, CmaEsSampler, GPSampler, GridSampler, RandomSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from iaa.errors import IaaError
from iaa.jobs.config.presets import DEFAULT_SAMPLER, MODE, STOP_METRIC, TIME_ATTR, TunePreset
from iaa.jobs.config.search_space import SearchSpace


class GridOnce(GridSampler):
    """Optuna's ``GridSampler`` as a Tune searcher asks it: Tune's ``num_samples`` ends the sweep.

    ``GridSampler.after_trial`` stops the study once the grid is done, which only an
    ``optimize`` loop allows: told through ask and tell, it raises instead. The sweep asks for
    at most as many trials as the grid has (:func:`iaa.jobs.tune.settle.grid_samples`)."""

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        return None


def _grid(space: SearchSpace, seed: int) -> BaseSampler:
    """Every configuration of ``space`` (lists of values only), in an order ``seed`` shuffles."""
    ranges = [name for name, p in space.params.items() if p.choices is None]
    if ranges:
        raise IaaError(f"the grid sampler needs a list of values for {ranges[0]}, not a range")
    return GridOnce({name: list(dict.fromkeys(p.choices or ())) for name, p in space.params.items()}, seed=seed)


def _cmaes(space: SearchSpace, seed: int) -> BaseSampler:
    if importlib.util.find_spec("cmaes") is None:
        raise IaaError("the cmaes sampler needs the cmaes package: pip install 'iaa[cmaes]' (or pip install cmaes)")
    return CmaEsSampler(seed=seed, warn_independent_sampling=False)   # categorical parameters: drawn at random


# The sweep's samplers by name (iaa.jobs.config.presets.SAMPLERS): how each is built for a space
# and a seed, and whether DistinctSampler wraps it (a space-filling start, no configuration
# twice). Independent draws are deliberate where a sampler makes them (DistinctSampler's
# fallback, CMA-ES's categorical parameters), so they are not warned about.
SAMPLERS: dict[str, tuple[Callable[[SearchSpace, int], BaseSampler], bool]] = {
    "tpe": (lambda space, seed: TPESampler(seed=seed), True),
    "gp": (lambda space, seed: GPSampler(seed=seed, warn_independent_sampling=False), True),
    "random": (lambda space, seed: RandomSampler(seed=seed), True),
    "grid": (_grid, False),
    "cmaes": (_cmaes, True),
}


def searcher(space: SearchSpace, seed: int, sweep: str | None = None, sampler: str = DEFAULT_SAMPLER,
             try_first: Sequence[Mapping[str, Any]] = ()) -> Any:
    """The Optuna sampler named ``sampler`` (:data:`SAMPLERS`) over ``space``, told each trial's best
    validation accuracy; no configuration twice. The first trials run ``try_first``, in order.

    The study is the one that the running process bound to the Tune run ``sweep``
    (:mod:`~iaa.platform.sweeps.driver_side`: by default the SQLite file ``WORKDIR/optuna.db``,
    kept after the process ends, so that ``optuna-dashboard URL`` opens it and a resumed sweep
    continues it); without ``sweep``, a study in memory.
    """
    from iaa.platform.sweeps.search.distinct_search import StudySearch
    from iaa.platform.sweeps.studies.study_store import quiet_optuna

    quiet_optuna()
    return StudySearch(to_optuna(space), build_sampler(space, seed, sampler), sweep, given=try_first)


def build_sampler(space: SearchSpace, seed: int, name: str = DEFAULT_SAMPLER) -> BaseSampler:
    """The sweep's Optuna sampler ``name`` (:data:`SAMPLERS`), seeded: a space-filling start (every
    searched value at least once), then ``name``'s proposals, no configuration twice while the
    space has untried ones; ``grid``: every configuration once, in a seeded order.

    Raises IaaError when ``name`` cannot search ``space`` (``grid`` over a range) or a package it
    needs is missing (``cmaes``)."""
    from iaa.platform.sweeps.search.distinct_search import DistinctSampler

    build, distinct = SAMPLERS[name]
    inner = build(space, seed)
    return DistinctSampler(inner, to_optuna(space), space.size, seed=seed) if distinct else inner


def scheduler(preset: TunePreset, max_t: int, sweep: str | None = None) -> Any:
    """ASHA on the current check's ``valid_acc``; a trial reaching ``max_t`` checks is stopped. The
    trials of the Tune run ``sweep`` that run a configuration given to try first are left out of
    it (:class:`~iaa.platform.sweeps.search.asha.GivenAside`)."""
    from iaa.platform.sweeps.search.asha import GivenAside

    return GivenAside(time_attr=TIME_ATTR, metric=STOP_METRIC, mode=MODE, max_t=max_t,
                      grace_period=min(preset.grace_period, max_t), reduction_factor=preset.reduction_factor,
                      sweep=sweep)


def to_optuna(space: SearchSpace) -> dict[str, Any]:
    """Optuna distributions by parameter name: what the study samples and what a warm start carries."""
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
