"""What ``iaa-cli tune`` asks for, checked once when made, and how a stopped sweep says so."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from iaa.errors import IaaError
from iaa.jobs.config.job_config import ConfigError
from iaa.jobs.config.presets import SAMPLERS, TUNE_PRESETS
from iaa.jobs.workdir import names
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR


class SweepInterrupted(IaaError):
    """The sweep stopped with unfinished trials (Ctrl-C); ``--resume NAME`` continues it."""


@dataclass(frozen=True)
class TuneRequest:
    """What ``iaa-cli tune`` asks for; ``None`` means the dataset's :data:`TUNE_PRESETS` value.

    Checked here, once: a bad value is a ConfigError before anything starts.
    """

    dataset: str | None = None           # None: the one the manifest of ``data`` names (:func:`~iaa.jobs.tune.settle.settle`)
    data: Path | None = None
    model_kind: str = "iaa"
    num_samples: int | None = None
    max_concurrent: int | None = None
    max_epochs: float | None = None
    search_space: Path | None = None
    grace_period: int | None = None      # ASHA: checks before a trial may be stopped
    reduction_factor: float | None = None  # ASHA: keeps the best 1/reduction_factor at each rung
    workers_per_trial: int | None = None   # None: 1 (a resumed sweep: the recorded)
    gpus_per_worker: float | None = None   # None: 0 (a resumed sweep: the recorded)
    name: str | None = None          # None: a new unique name (or, with resume, the latest sweep)
    seed: int = 0
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    workdir: Path = Path(DEFAULT_WORKDIR)
    tracking_uri: str | None = None  # None: the workdir's store (a resumed sweep: the store it was tracked in)
    storage_path: str | None = None
    address: str | None = None       # the Ray cluster given; None: a local Ray (the lines that continue it name it)
    resume: bool = False
    show_progress: bool = True
    register: str | None = None      # register the best trial's MLflow model under this name (a resume: the recorded)
    verbose: bool = False            # Ray Tune's own status tables and result boxes
    optuna_storage: str | None = None  # the study's RDB URL; None: the SQLite file WORKDIR/optuna.db
    sampler: str | None = None       # one of SAMPLERS; None: tpe (a resumed sweep: the one it recorded)
    time_budget_s: float | None = None   # the trials' time in all, over every run; None: none (a resume: the recorded)
    warm_start: str | None = None    # an earlier sweep (or a default-named prefix: its latest) to begin the study with
    try_first: Path | None = None    # a YAML file of configurations the first trials run (:mod:`~iaa.jobs.tune.try_first`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "sets", tuple(self.sets))
        names.folder_name(self.name)
        names.folder_name(self.warm_start, "`warm_start`")
        names.registered_name(self.register)
        if self.dataset is not None and self.dataset not in TUNE_PRESETS:
            raise ConfigError(f"no tune preset for {self.dataset!r}; choose from {sorted(TUNE_PRESETS)}")
        if self.num_samples is not None and self.num_samples < 1:
            raise ConfigError(f"`num_samples` must be >= 1, got {self.num_samples}")
        if self.max_epochs is not None and not self.max_epochs > 0:
            raise ConfigError(f"`max_epochs` must be > 0, got {self.max_epochs}")
        if self.grace_period is not None and self.grace_period < 1:
            raise ConfigError(f"`grace_period` must be at least 1 check, got {self.grace_period}")
        if self.reduction_factor is not None and not self.reduction_factor > 1:
            raise ConfigError(f"`reduction_factor` must be above 1, got {self.reduction_factor}")
        if self.time_budget_s is not None and not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
            raise ConfigError(f"`time_budget_s` must be a time above 0, got {self.time_budget_s!r} s")
        if self.try_first is not None and self.resume:
            raise ConfigError("`try_first` begins a new sweep; a resumed one runs what its record holds")
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {self.sampler!r}; choose from {', '.join(SAMPLERS)}")
