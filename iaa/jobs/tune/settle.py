"""A sweep, settled once: :func:`settle` turns the request into an immutable :class:`SweepPlan`
before any store is opened or any cluster starts, and every later phase reads only the plan.

It reads the data (verified), the sweep's name and folder, the base config, the search space,
the sampler, the budget, the earlier sweep a new one begins with (``warm_start``), the
configurations it tries first (``try_first``) and where the stores live. A resume reads the
sweep's record here, once: its data, base config, search space, sampler, budget, ASHA settings
and configurations to try first stand unless the command line gives them. It imports no torch,
Ray, MLflow or Optuna, so a bad start fails in a moment.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.data.datasets import TRAINING_SPLITS
from iaa.errors import IaaError
from iaa.jobs.config import search_space
from iaa.jobs.config.job_config import ConfigError, JobConfig, from_dict
from iaa.jobs.config.presets import DEFAULT_SAMPLER, FIRST_COMPARISON_EXAMPLES, TUNE_PRESETS, TunePreset
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.ports import WarmStart
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import Study, SweepRecord
from iaa.jobs.tune import try_first, warm_start
from iaa.jobs.tune.request import TuneRequest
from iaa.jobs.workdir import names
from iaa.jobs.workdir.fields import RecordError
from iaa.jobs.workdir.paths import SWEEP_RECORD, Workdir

_log = logging.getLogger(__name__)

CLUSTER_COMMANDS = ("tune", "train", "ensemble")   # the next commands that train, given --address and --storage-path
CMAES_MISSING = ("the cmaes sampler needs the cmaes package: pip install 'iaa[cmaes]' (in a checkout: "
                 "pip install -e '.[cmaes]'), or choose another `sampler`")


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep is, settled once from its request (:func:`settle`)."""

    name: str
    dataset: str
    prepared: Path                   # the prepared data, verified
    data: Path | None                # the folder the request names (``best_config.yaml`` names it too)
    workdir: Path
    folder: Path                     # WORKDIR/sweeps/NAME
    storage: str                     # STORAGE (the Tune run is STORAGE/NAME)
    storage_path: str | None         # ``storage_path`` as given (or recorded): the cluster checks it
    base: JobConfig                  # what every trial shares, its precision as configured
    train_epochs: float              # the training length ``iaa-cli train`` gives the best config
    space: search_space.SearchSpace
    preset: TunePreset               # the dataset's, with the request's (or record's) ASHA settings
    num_samples: int
    sampler: str                     # one of SAMPLERS
    study: Study                     # where the Optuna study lives
    tracking_uri: str                # the store, checked
    recorded: SweepRecord | None     # the record of a sweep to resume
    seed: int = 0
    time_budget_s: float | None = None   # the trials' time in all, over every run of the sweep; None: no limit
    warm_start: WarmStart | None = None  # an earlier sweep whose scored trials the study begins with
    try_first: tuple[Mapping[str, Any], ...] = ()   # configurations the first trials run, in order
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    max_concurrent: int | None = None
    register: str | None = None
    show_progress: bool = True
    verbose: bool = False
    options: Mapping[str, str] | None = None   # ``workdir`` and ``tracking_uri`` for the next commands
    address: str | None = None                 # the Ray cluster it runs on; None: a local Ray

    @property
    def experiment(self) -> str:
        return (self.recorded.experiment if self.recorded is not None else None) or f"tune-{self.dataset}"

    @property
    def nothing_left(self) -> bool:
        """A resume of a sweep that has nothing left to run (its record's ``finished``): it starts
        no cluster and runs no trial, whatever ``num_samples`` says."""
        return self.recorded is not None and self.recorded.finished

    @property
    def record_file(self) -> Path:
        return self.folder / SWEEP_RECORD

    @property
    def resume_command(self) -> Command:
        """The exact command that continues this sweep, on the cluster it ran on (its record names
        the storage)."""
        return Command.of("tune", resume=self.name, **(self.options or {}),
                          **({"address": self.address} if self.address else {}))

    def command(self, name: str, /, **options: Any) -> Command:
        """A next command, in this sweep's work folder and store where they are not the defaults,
        and for those that train (:data:`CLUSTER_COMMANDS`) on its cluster and storage."""
        cluster = ({"address": self.address, "storage_path": self.storage_path}
                   if self.address and name in CLUSTER_COMMANDS else {})
        return Command.of(name, **options, **(self.options or {}), **cluster)


def settle(req: TuneRequest) -> SweepPlan:
    """The sweep ``req`` asks for, with every check that needs no store and no cluster.

    Raises ConfigError, DataError or IaaError (a missing or damaged dataset or record, a
    contradiction, a dataset without a sweep preset, a bad search space) before anything starts.
    """
    from iaa.jobs.datasets import resolve

    workdir = Path(req.workdir)
    recorded = None
    if req.resume and req.dataset is None and req.data is None:   # ``resume`` NAME alone: its record names the data
        if not req.name:
            raise IaaError("give `resume` NAME (or `dataset` / `data` to resume the latest sweep of a dataset)")
        recorded = _record(workdir, req.name)
        req = _with_recorded_data(req, recorded)
    dataset, prepared = resolve.data_dir(req.dataset, req.data, workdir, splits=TRAINING_SPLITS)
    if dataset not in TUNE_PRESETS:
        raise ConfigError(f"no tune preset for dataset {dataset!r}; choose from {sorted(TUNE_PRESETS)}")
    req = replace(req, dataset=dataset)
    name = sweep_name(req)
    if req.resume:
        recorded = recorded or _record(workdir, name)
        req = _with_recorded_storage(with_recorded_budget(req, recorded), recorded, name)
        req = _with_recorded_placement(req, recorded)
    preset = asha_preset(req)
    cfg = resolve.job_config(dataset, prepared, model_kind=req.model_kind, config_file=req.config_file, sets=req.sets)
    base = sweep_config(req, cfg, preset, resolve.chosen_keys(req.config_file, req.sets))
    if recorded is not None:
        base = _recorded_base(req, recorded, base, sweep_file.sweep_file(workdir, name))
    if req.search_space is not None:
        space = search_space.load(req.search_space, base)
    elif recorded is not None and recorded.search_space:
        space = _recorded_space(recorded, base, sweep_file.sweep_file(workdir, name))
    else:
        space = search_space.parse(preset.space, base)
    for note in searched_overrides(req.sets, space):
        _log.warning(note)
    sampler = req.sampler or DEFAULT_SAMPLER
    study = Study(Workdir(workdir).optuna_storage(req.optuna_storage), name)
    if recorded is not None:
        sampler, study = sweep_file.sampler(recorded), recorded.optuna or study
        if req.sampler not in (None, sampler):
            _log.warning(f"sweep {name} continues with the sampler it started with, {sampler}, not {req.sampler}")
    warm, notes = warm_start.settled(req.warm_start, name, recorded is not None, workdir, dataset, base, space,
                                     sampler, req.seed)
    for note in notes:
        _log.warning(note)
    if sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:   # before any store, record or Ray
        raise ConfigError(CMAES_MISSING)
    num_samples = req.num_samples or preset.num_samples
    if sampler == "grid":
        num_samples = grid_samples(space, num_samples)
    given = _try_first(req, recorded, space, sampler, num_samples, sweep_file.sweep_file(workdir, name))
    tracking = Workdir(workdir).tracking_uri(recorded.tracking_uri if recorded is not None else req.tracking_uri)
    return SweepPlan(name=name, dataset=dataset, prepared=prepared, data=req.data, workdir=workdir,
                     folder=Workdir(workdir).sweep(name), storage=Workdir(workdir).storage(req.storage_path),
                     storage_path=req.storage_path, base=base, train_epochs=cfg.train.max_epochs, space=space,
                     preset=preset, num_samples=num_samples, time_budget_s=req.time_budget_s, warm_start=warm,
                     try_first=given, sampler=sampler, study=study, tracking_uri=tracking,
                     recorded=recorded, seed=req.seed, workers_per_trial=req.workers_per_trial or 1,
                     gpus_per_worker=req.gpus_per_worker or 0.0, max_concurrent=req.max_concurrent,
                     register=req.register,
                     show_progress=req.show_progress, verbose=req.verbose,
                     address=req.address, options=where(workdir, req.tracking_uri or Workdir(workdir).named_store(
                         recorded.tracking_uri if recorded is not None else None)))


def _try_first(req: TuneRequest, recorded: SweepRecord | None, space: search_space.SearchSpace, sampler: str,
               num_samples: int, record_path: Path) -> tuple[dict[str, Any], ...]:
    """The configurations the sweep's first trials run: the request's file, or a resumed sweep's
    record (checked against the space it resumes with, which ``search_space`` may have changed)."""
    if req.try_first is None:
        if recorded is None:
            return ()
        return try_first.held(tuple(dict(c) for c in recorded.try_first or ()), space, f"{record_path}: try_first")
    if sampler == "grid":
        raise ConfigError("the grid sampler tries every configuration of the space once anyway; give `try_first` "
                          "with another sampler")
    given = try_first.load(req.try_first, space)
    if len(given) > num_samples:
        raise ConfigError(f"{req.try_first}: {len(given)} configurations to try first, but the sweep runs "
                          f"{num_samples} trials; raise `num_samples` or give fewer")
    return given


def sweep_config(req: TuneRequest, cfg: JobConfig, preset: TunePreset, chosen: set[str]) -> JobConfig:
    """``cfg`` (dataset preset, config file, ``model_kind``, ``sets``) with the epochs of the sweep.

    ``max_epochs`` wins; else a ``train.max_epochs`` from the config file or ``sets`` (``chosen``:
    the keys they give) stays; else the tune preset's budget applies.
    """
    epochs = req.max_epochs
    if epochs is None and "train.max_epochs" not in chosen:
        epochs = preset.max_epochs
    return cfg if epochs is None else replace(cfg, train=replace(cfg.train, max_epochs=float(epochs)))


def sweep_name(req: TuneRequest) -> str:
    """``name``; else a new unique name, or with ``resume`` the latest sweep of dataset and model
    (named or not)."""
    if req.name:
        return req.name
    if not req.resume:
        return sweep_file.unique_name(f"{req.dataset}-{req.model_kind}")
    return sweep_file.latest(Path(req.workdir), req.dataset, req.model_kind).parent.name


def _record(workdir: Path, name: str) -> SweepRecord:
    """The record of sweep ``name``, checked for what a resume needs; IaaError when it is missing."""
    path = sweep_file.sweep_file(workdir, name)
    if not path.is_file():
        raise IaaError(f"no sweep {name!r} to resume in the work folder {Path(workdir).absolute()}: {path} is "
                       f"missing; give the `workdir` it ran in, or start it without `resume`")
    return sweep_file.read_resumable(path)


def _with_recorded_data(req: TuneRequest, record: SweepRecord) -> TuneRequest:
    """``req`` with the data its sweep recorded (``req`` names none)."""
    data = Path(str(record.data_dir))
    if not data.is_absolute():
        data = Path(req.workdir) / data
    return replace(req, dataset=record.dataset, data=data)


def _with_recorded_placement(req: TuneRequest, record: SweepRecord) -> TuneRequest:
    """``req`` with the workers per trial, GPUs per worker, trials at once and registered model
    name its sweep recorded, where the command line gives none: the trials left run as the first
    ones did, and the best is registered as asked when the sweep began."""
    path = sweep_file.sweep_file(req.workdir, record.name)
    register = req.register or names.registered_name(record.register, f"{path}: register")
    return replace(req, workers_per_trial=req.workers_per_trial or record.workers_per_trial,
                   gpus_per_worker=record.gpus_per_worker if req.gpus_per_worker is None else req.gpus_per_worker,
                   max_concurrent=req.max_concurrent or record.max_concurrent, register=register)


def _with_recorded_storage(req: TuneRequest, record: SweepRecord, name: str) -> TuneRequest:
    """``req`` with the storage its sweep's Tune run is in (``STORAGE/NAME``), unless the command
    line gives one: a resume finds the run where it ran, also on a cluster's shared storage."""
    storage, suffix = str(record.storage or "").rstrip("/"), f"/{name}"
    return replace(req, storage_path=req.storage_path or (storage[: -len(suffix)] if storage.endswith(suffix) else None))


def with_recorded_budget(req: TuneRequest, record: SweepRecord) -> TuneRequest:
    """``req`` with the number of trials, the time budget and the ASHA settings its sweep recorded,
    where the command line gives none: a resume counts and stops trials as the sweep did."""
    asha = record.asha
    return replace(req, num_samples=req.num_samples or record.num_samples,
                   time_budget_s=req.time_budget_s or record.time_budget_s,
                   grace_period=req.grace_period or (asha.grace_period if asha else None),
                   reduction_factor=req.reduction_factor or (asha.reduction_factor if asha else None))


def _recorded_base(req: TuneRequest, record: SweepRecord, base: JobConfig, path: Path) -> JobConfig:
    """The base config the sweep started with, unless the command line changes it
    (``config_file``, ``sets`` or ``max_epochs``); one that is no longer valid is refused naming
    ``path`` (the record) and the key."""
    if not record.base or req.config_file or req.sets or req.max_epochs:
        return base
    try:
        return from_dict(dict(record.base))
    except ConfigError as err:
        raise RecordError(f"{path}: base: {err}; write the file again with the command that made it") from None


def _recorded_space(record: SweepRecord, base: JobConfig, path: Path) -> search_space.SearchSpace:
    """The search space the sweep recorded; one that no longer parses is refused naming ``path``
    (the record) and ``search_space``."""
    saved = record.search_space
    data: dict[str, Any] = dict(saved.get("fixed") or {})
    for name, p in (saved.get("params") or {}).items():
        data[name] = (list(p["choices"]) if p.get("choices") is not None
                      else {k: p[k] for k in ("low", "high", "log", "step") if p.get(k) is not None})
    try:
        return search_space.parse(data, base)
    except ConfigError as err:
        raise RecordError(f"{path}: search_space: {err}; write the file again with the command that made it") from None


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


def early_comparison_notes(dataset: str, grace_period: int, per_check: int, per_trial: float) -> list[str]:
    """A note when ASHA first compares the trials of a sweep of real text (any dataset but the
    generated demo) after fewer than :data:`FIRST_COMPARISON_EXAMPLES` training examples
    (``per_check`` a check) though a trial trains more (``per_trial`` examples in all)."""
    first = grace_period * per_check
    if dataset == "demo" or first >= FIRST_COMPARISON_EXAMPLES or per_trial <= FIRST_COMPARISON_EXAMPLES:
        return []
    grace = math.ceil(FIRST_COMPARISON_EXAMPLES / per_check)
    return [f"ASHA first compares trials after {first:,} training examples ({grace_period} check(s) of {per_check:,}, "
            "`grace_period`); on real text a ranking that early can be worse than chance (docs/search.md, "
            f"\"On real text\"), so ASHA may stop the trials that would end best: give `grace_period` {grace} to "
            f"compare them after {grace * per_check:,}"]


def asha_preset(req: TuneRequest) -> TunePreset:
    """The dataset's tune preset with ``grace_period`` and ``reduction_factor`` applied."""
    preset = TUNE_PRESETS[req.dataset]
    return replace(preset, grace_period=req.grace_period or preset.grace_period,
                   reduction_factor=req.reduction_factor or preset.reduction_factor)
