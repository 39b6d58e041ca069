"""The search of a sweep: per-dataset budgets, Optuna's TPE sampler and ASHA early stopping.

- **searcher**: ``OptunaSearch`` over a :mod:`~iaa.platform.search_space` with a seeded
  ``TPESampler``, proposing each configuration of a finite space once
  (:mod:`~iaa.platform.distinct_search`). It learns from each trial's *best* validation accuracy
  (``best_valid_acc`` of the trial's last report), so that a trial ASHA cut short feeds TPE
  the best score it reached, not a rung-level one;
- **scheduler**: ASHA stops trials on the per-check ``valid_acc``, with ``checks`` as its
  clock: every validation check of the loop (every half epoch by default) is one report.

Each gets its own metric, so the Tune config names none (Tune refuses a metric given twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from iaa.jobs.config import JobConfig
from iaa.platform import search_space
from iaa.platform.search_space import SearchSpace

SEARCH_METRIC = "best_valid_acc"   # what TPE learns from: a trial's best check
STOP_METRIC = "valid_acc"          # what ASHA compares at each rung: the current check
MODE = "max"
TIME_ATTR = "checks"


@dataclass(frozen=True)
class TunePreset:
    """A dataset's sweep budget: trials, epochs per trial, search space and ASHA's schedule."""

    num_samples: int
    max_epochs: float
    space: Mapping[str, Any]
    grace_period: int = 1          # checks before ASHA may stop a trial
    reduction_factor: float = 2.0  # ASHA keeps the best 1/reduction_factor at each rung


TUNE_PRESETS: dict[str, TunePreset] = {
    # A whole sweep on a 2-core laptop in a few minutes: 4 trials of at most 1.5 epochs (3 checks),
    # 2 at a time; ASHA compares them after one epoch (2 checks), once the reader has learned.
    "demo": TunePreset(num_samples=4, max_epochs=1.5, space=search_space.DEMO_GRID, grace_period=2,
                       reduction_factor=2.0),
    "cbt-ne": TunePreset(num_samples=24, max_epochs=4.0, space=search_space.PAPER_GRID, grace_period=2,
                         reduction_factor=3.0),
    "cbt-cn": TunePreset(num_samples=24, max_epochs=4.0, space=search_space.PAPER_GRID, grace_period=2,
                         reduction_factor=3.0),
    "cnn": TunePreset(num_samples=16, max_epochs=3.0, space=search_space.PAPER_GRID, grace_period=2,
                      reduction_factor=3.0),
}


def searcher(space: SearchSpace, seed: int) -> Any:
    """Optuna TPE over ``space``, told each trial's best validation accuracy; no configuration twice."""
    import optuna
    from optuna.samplers import TPESampler

    from iaa.platform.distinct_search import DistinctOptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return DistinctOptunaSearch(space=search_space.to_optuna(space), metric=SEARCH_METRIC, mode=MODE,
                                sampler=TPESampler(seed=seed), size=space.size)


def scheduler(preset: TunePreset, max_t: int) -> Any:
    """ASHA on the current check's ``valid_acc``; a trial reaching ``max_t`` checks is stopped."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr=TIME_ATTR, metric=STOP_METRIC, mode=MODE, max_t=max_t,
                         grace_period=min(preset.grace_period, max_t), reduction_factor=preset.reduction_factor)


def max_checks(cfg: JobConfig, space: SearchSpace, train_rows: int, workers: int) -> int:
    """An upper bound on a trial's checks: ASHA's ``max_t``."""
    batch_sizes = [cfg.train.batch_size]
    if "train.batch_size" in space.params:
        p = space.params["train.batch_size"]
        batch_sizes += list(p.choices or (p.low,))
    if "train.batch_size" in space.fixed:
        batch_sizes = [space.fixed["train.batch_size"]]
    epochs = [cfg.train.max_epochs]
    if "train.max_epochs" in space.params:
        p = space.params["train.max_epochs"]
        epochs += list(p.choices or (p.high,))
    n_batches = math.ceil(train_rows / max(workers, 1) / max(1, int(min(batch_sizes))))
    check_every = cfg.train.check_every or max(1, n_batches // 2)
    # One more than the trial can reach: a trial that ends by itself is never stopped (killed) by ASHA.
    return max(1, math.ceil(math.ceil(max(epochs) * n_batches) / check_every)) + 1
