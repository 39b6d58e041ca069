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
from iaa.jobs.config import search_space
from iaa.jobs.ports import (Launcher, Tracker)
from iaa.jobs.tune import stops
from iaa.jobs.tune.request import TuneRequest
from iaa.jobs.config.presets import DEFAULT_SAMPLER, TUNE_PRESETS, TunePreset
from iaa.jobs.workdir.paths import Workdir

_log = logging.getLogger(__name__)


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
class Settled:
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


def settle(req: TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> Settled:
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
    return Settled(name, folder, storage, prepared, base, space, preset, num_samples, tracker, recorded, sampler)


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
