"""The sweep's request, settled before any cluster starts: data, dataset, base config, search
space, sampler, name, the store, and the ASHA preset with its notes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from iaa.errors import IaaError
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.jobs.workdir import names
from iaa.jobs.config import search_space
from iaa.jobs.ports import (Launcher, Tracker)
from iaa.jobs.tune import stops
from iaa.jobs.config.presets import DEFAULT_SAMPLER, SAMPLERS, TUNE_PRESETS, TunePreset
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir

_log = logging.getLogger(__name__)


class SweepInterrupted(IaaError):
    """The sweep stopped with unfinished trials (Ctrl-C); ``--resume NAME`` continues it."""


@dataclass(frozen=True)
class TuneRequest:
    """What ``iaa-cli tune`` asks for; ``None`` means the dataset's :data:`TUNE_PRESETS` value.

    Checked here, once: a bad value is a ConfigError before anything starts.
    """

    dataset: str | None = None           # None: the one the manifest of ``data`` names (:func:`with_dataset`)
    data: Path | None = None
    model_kind: str = "iaa"
    num_samples: int | None = None
    max_concurrent: int | None = None
    max_epochs: float | None = None
    search_space: Path | None = None
    grace_period: int | None = None      # ASHA: checks before a trial may be stopped
    reduction_factor: float | None = None  # ASHA: keeps the best 1/reduction_factor at each rung
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    name: str | None = None          # None: a new unique name (or, with resume, the latest sweep)
    seed: int = 0
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    workdir: Path = Path(DEFAULT_WORKDIR)
    tracking_uri: str | None = None  # None: the workdir's store (a resumed sweep: the store it was tracked in)
    storage_path: str | None = None
    resume: bool = False
    show_progress: bool = True
    register: str | None = None      # register the best trial's MLflow model under this name
    verbose: bool = False            # Ray Tune's own status tables and result boxes
    optuna_storage: str | None = None  # the study's RDB URL; None: the SQLite file WORKDIR/optuna.db
    sampler: str | None = None       # one of SAMPLERS; None: tpe (a resumed sweep: the one it recorded)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "sets", tuple(self.sets))
        names.folder_name(self.name)
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
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {self.sampler!r}; choose from {', '.join(SAMPLERS)}")


def with_dataset(req: TuneRequest) -> TuneRequest:
    """``req`` with its dataset settled from the data, before any cluster or store is touched.

    With ``--data`` alone the dataset is the one its manifest names; with both, they must agree.
    A missing or damaged dataset, a contradiction, or a dataset without a sweep preset is one
    error here, so a bad start fails in a moment.
    """
    from iaa.jobs.datasets import resolve

    if req.resume and req.dataset is None and req.data is None:
        req = stops.from_record(req)      # --resume NAME alone: the sweep's record knows its data
    name, _ = resolve.data_dir(req.dataset, req.data, Path(req.workdir))
    if name not in TUNE_PRESETS:
        raise ConfigError(f"no tune preset for dataset {name!r}; choose from {sorted(TUNE_PRESETS)}")
    return replace(req, dataset=name)


def training_epochs(req: TuneRequest, prepared: Path) -> float:
    """The training length ``iaa-cli train`` gives this config (preset, config file, ``--set``):
    what the best trial's config is trained for, not the sweep's per-trial budget."""
    from iaa.jobs.datasets import resolve

    return resolve.job_config(req.dataset, prepared, model_kind=req.model_kind, config_file=req.config_file,
                              sets=req.sets).train.max_epochs


def base_config(req: TuneRequest, prepared: Path, preset: TunePreset) -> JobConfig:
    """Dataset preset, config file, --model and --set; then the epochs of the sweep.

    ``--max-epochs`` wins; else a ``train.max_epochs`` from the config file or ``--set`` stays;
    else the tune preset's budget applies.
    """
    from iaa.jobs.modeling import precision_policy as precision
    from iaa.jobs.datasets import resolve

    cfg = resolve.job_config(req.dataset, prepared, model_kind=req.model_kind, config_file=req.config_file,
                             sets=req.sets)
    epochs = req.max_epochs
    if epochs is None and "train.max_epochs" not in resolve.chosen_keys(req.config_file, req.sets):
        epochs = preset.max_epochs  # the tune preset's budget, unless the config file or --set chose one
    if epochs is not None:
        cfg = replace(cfg, train=replace(cfg.train, max_epochs=float(epochs)))
    # auto -> fp32 or bf16 once for the sweep: every trial and its MLflow params use the same
    return precision.resolved(cfg, "cuda" if req.gpus_per_worker > 0 else "cpu")


def sweep_name(req: TuneRequest) -> str:
    """``--name``; else a new unique name, or with ``--resume`` the latest sweep of dataset and model."""
    if req.name:
        return req.name
    base = f"{req.dataset}-{req.model_kind}"
    if not req.resume:
        return sweep_file.unique_name(base)
    return sweep_file.find(Path(req.workdir), base).parent.name


def study_storage(req: TuneRequest) -> str:
    """Where the sweep's Optuna study lives: ``--optuna-storage``, else ``WORKDIR/optuna.db``
    (one file for every sweep of the work folder: ``optuna-dashboard`` on it lists them)."""
    return Workdir(req.workdir).optuna_storage(req.optuna_storage)


@dataclass(frozen=True)
class _Sweep:
    """What a sweep is, settled before Ray starts: name, folders, data, config, space, sampler, store."""

    name: str
    folder: Path                     # WORKDIR/sweeps/NAME
    storage: str                     # STORAGE (the Tune run is STORAGE/NAME)
    prepared: Path
    base: JobConfig
    space: search_space.SearchSpace
    preset: TunePreset
    num_samples: int
    tracker: Tracker                 # the store, checked
    recorded: SweepRecord | None     # the sweep.json of a sweep to resume
    sampler: str = DEFAULT_SAMPLER   # one of SAMPLERS


def _settle(req: TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> _Sweep:
    """Every check that needs no cluster: data, config, search space, sampler, name, the store."""
    from iaa.jobs.datasets import resolve

    workdir = Path(req.workdir)
    name = sweep_name(req)
    folder, recorded = Workdir(workdir).sweep(name), None
    if req.resume:                        # the record first: a damaged one is refused before anything runs
        if not (folder / "sweep.json").is_file():
            raise IaaError(f"no sweep {name!r} to resume: {folder / 'sweep.json'} is missing; run it without `resume`")
        recorded = sweep_file.read_resumable(folder / "sweep.json", launcher.has_study)
        req = stops.with_recorded_budget(req, recorded)
    preset = asha_preset(req)
    _, prepared = resolve.data_dir(req.dataset, req.data, workdir)
    base = base_config(req, prepared, preset)
    space = (search_space.load(req.search_space, base) if req.search_space is not None
             else search_space.parse(preset.space, base))
    for note in searched_overrides(req.sets, space):
        _log.warning(note)
    storage, sampler = Workdir(workdir).storage(req.storage_path), req.sampler or DEFAULT_SAMPLER
    if recorded is not None:
        base = stops.recorded_base(req, recorded, base, folder / "sweep.json")
        space = stops.recorded_space(req, recorded, base, space, folder / "sweep.json")
        sampler = sweep_file.sampler(recorded)
        if req.sampler not in (None, sampler):
            _log.warning(f"sweep {name} continues with the sampler it started with, {sampler}, "
                         f"not {req.sampler}")
    num_samples = req.num_samples or preset.num_samples
    if sampler == "grid":
        num_samples = grid_samples(space, num_samples)
    if recorded is not None:
        tracker = open_tracker(Workdir(workdir).tracking_uri(recorded.tracking_uri))
    else:
        tracker = open_tracker(Workdir(workdir).tracking_uri(req.tracking_uri))
        launcher.check_free(storage, name, folder)
    return _Sweep(name, folder, storage, prepared, base, space, preset, num_samples, tracker, recorded, sampler)


def grid_samples(space: search_space.SearchSpace, num_samples: int) -> int:
    """The trials of a grid sweep: ``num_samples``, at most the space's configurations (each is
    tried once). ConfigError naming the parameter when the space has a range (no finite grid)."""
    ranges = [p for p in space.params.values() if p.choices is None]
    if ranges:
        raise ConfigError(f"the grid sampler needs a list of values for every searched parameter; "
                          f"{ranges[0].name} is a range {ranges[0].describe()}: give it as a list of values "
                          "in the search space, or choose another sampler")
    return min(num_samples, space.size or num_samples)


def searched_overrides(sets: Sequence[str], space: search_space.SearchSpace) -> list[str]:
    """A note for each ``--set`` of a key the search space searches: the trials never use its value."""
    notes = []
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if key in space.params:
            notes.append(f"`sets` {item} has no effect: the search space searches {key} "
                         f"{space.params[key].describe()}; give `search_space` FILE without {key} to fix it")
    return notes


def asha_notes(reachable_checks: int, preset: TunePreset) -> list[str]:
    """A note when ASHA can never stop a trial early: its first rung (the grace period) is at or
    past the last check a trial makes by itself."""
    if reachable_checks > preset.grace_period:
        return []
    return [f"ASHA can never stop a trial early: a trial makes at most {reachable_checks} validation check(s), "
            f"and ASHA first compares trials after {preset.grace_period} (`grace_period`); every trial runs its "
            "whole budget. To let it stop the weak ones, give "
            + (f"`grace_period` {reachable_checks - 1} or " if reachable_checks > 1 else "")
            + "a larger `max_epochs` (or more checks per epoch, `sets` train.check_every=BATCHES)"]


def asha_preset(req: TuneRequest) -> TunePreset:
    """The dataset's tune preset with ``--grace-period`` and ``--reduction-factor`` applied."""
    preset = TUNE_PRESETS[req.dataset]
    return replace(preset, grace_period=req.grace_period or preset.grace_period,
                   reduction_factor=req.reduction_factor or preset.reduction_factor)
