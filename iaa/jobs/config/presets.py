"""Per-dataset presets: model size, check interval and budget that suit each corpus, and each
tunable dataset's sweep (trials, epochs, search space, ASHA schedule)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from iaa.data.datasets import DATASETS
from iaa.jobs.config.job_config import ConfigError, JobConfig, TrainConfig
from iaa.jobs.config import search_space
from iaa.jobs.config.search_space import SearchSpace
from iaa.model.config import PRESETS

_PAPER = PRESETS["paper"]

# The paper checks validation every 2,000 batches on CBT and 5,000 on CNN (half an epoch).
DATASET_PRESETS: dict[str, JobConfig] = {
    "demo": JobConfig(
        dataset="demo",
        model=PRESETS["demo"],
        # One torch thread: the demo model's ops are too small to gain from two.
        train=TrainConfig(check_every=0, max_epochs=4.0, patience=4, embed_l2=1e-4, threads=1),
    ),
    **{
        name: JobConfig(dataset=name, model=_PAPER, train=TrainConfig(check_every=2000, max_epochs=10.0))
        for name in ("cbt-ne", "cbt-cn", "cbt-v", "cbt-p")
    },
    "cnn": JobConfig(dataset="cnn", model=_PAPER, train=TrainConfig(check_every=5000, max_epochs=10.0)),
}


def for_dataset(name: str, model_kind: str | None = None) -> JobConfig:
    """The preset job config of ``name``, optionally for another model kind."""
    if name not in DATASET_PRESETS:
        raise ConfigError(f"unknown dataset {name!r}; choose from {list(DATASETS)}")
    cfg = DATASET_PRESETS[name]
    if model_kind is not None:
        cfg = replace(cfg, model=replace(cfg.model, kind=model_kind))
    return cfg


# --- sweeps ----------------------------------------------------------------------------------------

SEARCH_METRIC = "best_valid_acc"   # what TPE learns from: a trial's best check
STOP_METRIC = "valid_acc"          # what ASHA compares at each rung: the current check
MODE = "max"
TIME_ATTR = "checks"

# How a sweep proposes its trials (``iaa-cli tune --sampler``), each one of Optuna's samplers
# (the platform maps a name to its class): multivariate TPE, a Gaussian process, independent
# random draws, every configuration of a finite space, CMA-ES (numeric parameters only).
SAMPLERS = ("tpe", "gp", "random", "grid", "cmaes")
UNINFORMED_SAMPLERS = ("random", "grid")   # their proposals do not depend on the trials' scores
DEFAULT_SAMPLER = "tpe"   # also the sampler of a sweep whose record names none (recorded before samplers were)


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
    # CBT's four word types share the paper's CBT sweep (the paper tuned on NE and CN; make-cloze
    # writes V and P questions in the same format). ASHA compares trials from their first check
    # and keeps a third at each rung: replayed against the reader's own learning curves (192
    # configurations, docs/search.md), that came within 0.5 points of the best with a median 6%
    # of the grid's compute, against 8% for grace 2 keeping a half (9% and 22% on a table built
    # on another CPU).
    **{name: TunePreset(num_samples=24, max_epochs=4.0, space=search_space.PAPER_GRID, grace_period=1,
                        reduction_factor=3.0)
       for name in ("cbt-ne", "cbt-cn", "cbt-v", "cbt-p")},
    "cnn": TunePreset(num_samples=16, max_epochs=3.0, space=search_space.PAPER_GRID, grace_period=1,
                      reduction_factor=3.0),
}


# On real text, ASHA's first comparison of trials should come after this many training examples:
# on cbt-recon CN the ranking at 8,000 examples was worse than chance against the ranking at
# 64,000, and from 16,000 a sweep found the best configuration (docs/search.md, "On real text").
FIRST_COMPARISON_EXAMPLES = 16_000


def _longest_trial(cfg: JobConfig, space: SearchSpace, train_rows: int, workers: int) -> tuple[TrainConfig, int]:
    """The training settings of the trial with the most steps and checks ``space`` allows (its most
    epochs, at its smallest batch), and its batches per epoch on each worker."""
    from iaa.data.loading.loader import num_batches

    train = space.costliest(cfg)[0].train
    return train, num_batches(train_rows, train.batch_size, max(workers, 1))


def max_checks(cfg: JobConfig, space: SearchSpace, train_rows: int, workers: int) -> int:
    """ASHA's ``max_t``: one more than the most checks a trial makes, so that a trial that ends by
    itself is never stopped (killed) by ASHA."""
    train, n_batches = _longest_trial(cfg, space, train_rows, workers)
    return train.checks(n_batches) + 1


def examples_per_check(cfg: JobConfig, space: SearchSpace, train_rows: int, workers: int) -> int:
    """The training examples a trial sees between two checks (at the smallest batch it may run)."""
    train, n_batches = _longest_trial(cfg, space, train_rows, workers)
    return (train.check_every or max(1, n_batches // 2)) * train.batch_size * max(workers, 1)
