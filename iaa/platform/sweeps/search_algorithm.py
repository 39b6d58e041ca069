"""The search of a sweep on Ray Tune: Optuna's TPE sampler and ASHA early stopping.

- **searcher**: ``OptunaSearch`` over a :mod:`~iaa.jobs.config.search_space` with a seeded
  ``TPESampler`` after a seeded space-filling start that tries every searched value
  (:mod:`~iaa.platform.sweeps.space_filling`), proposing each configuration of a finite space once
  (:mod:`~iaa.platform.sweeps.distinct_search`). It learns from each trial's *best* validation accuracy
  (``best_valid_acc`` of the trial's last report), so that a trial ASHA cut short feeds TPE
  the best score it reached, not a rung-level one;
- **scheduler**: ASHA stops trials on the per-check ``valid_acc``, with ``checks`` as its
  clock: every validation check of the loop (every half epoch by default) is one report.

Each gets its own metric, so the Tune config names none (Tune refuses a metric given twice).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from iaa.jobs.config.presets import MODE, SEARCH_METRIC, STOP_METRIC, TIME_ATTR, TunePreset
from iaa.jobs.config.search_space import SearchSpace

def searcher(space: SearchSpace, seed: int, storage: str | None = None, study_name: str | None = None) -> Any:
    """Optuna TPE over ``space``, told each trial's best validation accuracy; no configuration twice.

    ``storage`` (an Optuna RDB URL, by default the SQLite file ``WORKDIR/optuna.db``) keeps the study
    ``study_name`` after the process ends: ``optuna-dashboard URL`` opens it, and a resumed
    sweep continues it.
    """
    import optuna

    from iaa.platform.sweeps.distinct_search import StudySearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = to_optuna(space)
    with study_writes(storage or "", f"keep the study {study_name}"):
        return StudySearch(space=distributions, metric=SEARCH_METRIC, mode=MODE, sampler=sampler(space, seed),
                           storage=study_storage(storage) if storage else None, study_name=study_name)


def sampler(space: SearchSpace, seed: int) -> Any:
    """The sweep's Optuna sampler: a space-filling start (every searched value at least once),
    then TPE, both seeded; no configuration twice while the space has untried ones."""
    from optuna.samplers import TPESampler

    from iaa.platform.sweeps.distinct_search import DistinctSampler

    return DistinctSampler(TPESampler(seed=seed), to_optuna(space), space.size, seed=seed)


def study_storage(url: str) -> Any:
    """An Optuna RDB storage at ``url``; SQLite waits for a reader (optuna-dashboard) instead of failing.
    A full disk is one :class:`iaa.files.DiskFullError` naming the store."""
    import optuna

    kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
    with study_writes(url, "be opened"):
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


@contextlib.contextmanager
def study_writes(url: str, failed: str) -> Iterator[None]:
    """Turn a full disk met by the Optuna store ``url`` (SQLAlchemy's "database or disk is full",
    an OSError) into one DiskFullError saying what the store could not do (``failed``)."""
    from iaa.files import DiskFullError, disk_full, free_bytes, size_text

    try:
        yield
    except Exception as err:                  # SQLAlchemy's and Optuna's errors have no common base
        if not disk_full(err):
            raise
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        free = free_bytes(path) if path else None
        told = f" ({size_text(free)} free)" if free is not None else ""
        raise DiskFullError(f"no space left on device for the Optuna store {path or url}{told}: it could not "
                            f"{failed}; free some space on its disk or pass another --optuna-storage") from None


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
