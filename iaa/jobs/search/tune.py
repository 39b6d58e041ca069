"""``iaa-cli tune``: a hyperparameter sweep with early stopping, tracked run by run.

A sweep is one run of the :class:`~iaa.jobs.ports.Launcher` named ``NAME`` (``--name``; default
``DATASET-MODEL-<id>`` with a short random id, so sweeps never share a folder). With the Ray
adapter (:class:`iaa.platform.sweeps.launch.RayLauncher`):

- **search** (:data:`~iaa.jobs.training.presets.TUNE_PRESETS`, :mod:`~iaa.platform.sweeps.search_algorithm`): Optuna's TPE
  over the paper's grid, a per-dataset preset, or ``--search-space FILE.yaml``, learning from
  each trial's best check; ASHA stops trials;
- **resources and start**: trials sized to the cluster, checkpoints under ``STORAGE/NAME``;
- **tracking** (the :class:`~iaa.jobs.ports.Tracker`): one parent run per sweep and one child
  run per trial, all from the driver;
- **outputs**: ``WORKDIR/sweeps/NAME/sweep.json`` (:mod:`iaa.jobs.search.sweep`: every trial's config,
  best accuracy, checkpoint file, MLflow run, status), ``best_config.yaml`` (for
  ``iaa-cli train --config``), and a table of the best trials on stderr;
- **resume**: ``--resume NAME`` (or ``--resume`` with ``--name``; alone, the latest sweep of
  the dataset and model) restores the Tune run: finished trials are kept, unfinished ones
  continue from their last checkpoint, and the Optuna study comes back with the searcher.

A name that exists already is refused, never overwritten.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from iaa.errors import IaaError
from iaa.jobs.search import sweep as sweep_file
from iaa.jobs.training.config import ConfigError, JobConfig, config_label, dump_yaml, to_dict
from iaa.jobs.workdir import names
from iaa.jobs.reports import frequency
from iaa.jobs.search import exploration, search_space
from iaa.jobs.search.console import SweepConsole
from iaa.jobs.search.cost import SWEEP_START_S, TRIAL_START_S, SweepCost, probe
from iaa.jobs.ports import (ConnectRequest, Launcher, Placement, SearchPlan, SweepRequest, TrackedRun, Tracker,
                            TrialRecord, TrialTracking)
from iaa.jobs.training.presets import SEARCH_METRIC, STOP_METRIC, TUNE_PRESETS, TunePreset, max_checks
from iaa.jobs.search.sweep import FINISHED_STATUSES
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "sets", tuple(self.sets))
        names.folder_name(self.name)
        names.registered_name(self.register)
        if self.dataset is not None and self.dataset not in TUNE_PRESETS:
            raise ConfigError(f"no tune preset for {self.dataset!r}; choose from {sorted(TUNE_PRESETS)}")
        if self.num_samples is not None and self.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.max_epochs is not None and not self.max_epochs > 0:
            raise ConfigError(f"--max-epochs must be > 0, got {self.max_epochs}")
        if self.grace_period is not None and self.grace_period < 1:
            raise ConfigError(f"--grace-period must be at least 1 check, got {self.grace_period}")
        if self.reduction_factor is not None and not self.reduction_factor > 1:
            raise ConfigError(f"--reduction-factor must be above 1, got {self.reduction_factor}")


def with_dataset(req: TuneRequest) -> TuneRequest:
    """``req`` with its dataset settled from the data, before any cluster or store is touched.

    With ``--data`` alone the dataset is the one its manifest names; with both, they must agree.
    A missing or damaged dataset, a contradiction, or a dataset without a sweep preset is one
    error here, so a bad start fails in a moment.
    """
    from iaa.jobs.datasets import resolve

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
    from iaa.jobs.training import precision_policy as precision
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


def sweep_params(base: JobConfig, plan: SearchPlan, req: TuneRequest, launch: Placement) -> dict[str, Any]:
    """The parent run's params: what every trial shares (the config less the searched keys), the
    search space (``search.KEY``) and the sweep's settings (``tune.*``)."""
    shared = to_dict(base)
    for key in plan.space.params:
        head, _, leaf = key.rpartition(".")
        node = shared
        for part in head.split(".") if head else []:
            node = node.get(part, {})
        node.pop(leaf, None)
    return {**shared, **{f"search.{k}": p.describe() for k, p in plan.space.params.items()},
            "tune.num_samples": plan.num_samples, "tune.seed": req.seed, "tune.workers_per_trial": req.workers_per_trial,
            "tune.grace_period": plan.preset.grace_period, "tune.reduction_factor": plan.preset.reduction_factor,
            "tune.max_checks": plan.max_t, "tune.max_concurrent": launch.max_concurrent,
            "tune.study": plan.study_name, "tune.study_storage": plan.study_storage}


def run_columns(space: search_space.SearchSpace) -> list[str]:
    """The runs table's columns: the accuracies and the searched params (what each trial tried;
    the parent's best config is its ``best.*`` params and its note)."""
    return ["metrics.best_valid_acc", "metrics.valid_acc", *[f"params.{k}" for k in space.params]]


def _start(req: TuneRequest, launch: Placement, plan: SearchPlan, tracker: Tracker) -> tuple[dict[str, Any], TrackedRun]:
    """A fresh sweep: its parent run and its sweep.json."""
    experiment, base, space, preset, num_samples = f"tune-{req.dataset}", plan.base, plan.space, plan.preset, plan.num_samples
    uri = tracker.uri
    parent = tracker.start_run(experiment, launch.name,
                               tags={"dataset": req.dataset, "sweep": launch.name, "model": base.model.kind})
    try:
        parent.log_dataset(launch.prepared)
        parent.log_params(sweep_params(base, plan, req, launch))
        tracker.show_columns(experiment, run_columns(space))   # the runs view, while the sweep runs
        sweep = {"name": launch.name, "dataset": req.dataset, "data_dir": str(launch.prepared.resolve()),
                 "tracking_uri": uri, "experiment": experiment, "parent_run_id": parent.run_id,
                 "storage": launch.experiment_path, "search_space": json.loads(space.to_json()), "num_samples": num_samples,
                 "asha": {"grace_period": preset.grace_period, "reduction_factor": preset.reduction_factor},
                 "workers_per_trial": req.workers_per_trial, "max_concurrent": launch.max_concurrent,
                 "optuna": {"storage": plan.study_storage, "study": plan.study_name}, "trials": []}
        sweep_file.write(sweep_file.sweep_file(req.workdir, launch.name), sweep)
    except BaseException:
        parent.end("FAILED")
        raise
    if req.show_progress:
        print(f"sweep {launch.name}: {num_samples} trials over {space.describe()}; TPE learns from "
              f"{SEARCH_METRIC}, ASHA stops on {STOP_METRIC} at every check (at most {plan.max_t}; grace "
              f"{preset.grace_period}, keeps 1/{preset.reduction_factor:g} at each rung); "
              f"MLflow {uri}, experiment {experiment}", file=sys.stderr)
    return sweep, parent


def _close_lost_runs(tracker: Tracker, parent: TrackedRun, experiment: str, kept: set[str]) -> None:
    """End as KILLED the child runs of trials that a killed sweep started but never recorded.

    Tune saves its state every few seconds; a trial started after the last save is forgotten on
    ``--resume`` (and the searcher samples a new one), but its MLflow child run already exists.
    """
    for run in tracker.find_runs(experiment, status="RUNNING"):
        if run.parent_run_id == parent.run_id and run.run_id not in kept:
            lost = tracker.attach(run.run_id)
            lost.set_tags({"lost": "started before the sweep was killed, after its last saved state; "
                                   "resumed without it"})
            lost.end("KILLED")


def _finish(records: list[TrialRecord], sweep: dict[str, Any], sweep_dir: Path, parent: TrackedRun,
            space: search_space.SearchSpace, prepared: Path, tracker: Tracker,
            register: str | None = None, req: TuneRequest | None = None,
            train_epochs: float | None = None) -> dict[str, Any]:
    """The best trial: its config as YAML, the table, the parent run's metrics and artifacts, and
    on the best trial's run its MLflow model and explain page."""
    name = sweep["name"]
    unfinished = [r for r in records if r.status not in FINISHED_STATUSES]
    if unfinished:
        parent.end("KILLED")
        raise SweepInterrupted(f"sweep {name} interrupted with {len(unfinished)} unfinished trial(s); run "
                               f"`iaa-cli tune ... --resume {name}` to continue it")
    scored = [r for r in records if r.scored]
    if not scored:
        parent.end("FAILED")
        errors = "; ".join(f"{r.trial_id}: {r.error}" for r in records if r.error)[:2000]
        raise RuntimeError(f"sweep {name}: no trial finished a validation check. {errors}")
    best = max(scored, key=lambda r: r.best_valid_acc or 0.0)
    best_config = sweep_dir / "best_config.yaml"
    write_best_config(best, best_config, name, train_epochs, req.data if req is not None else None)
    print(sweep_file.table(records, list(space.params)), file=sys.stderr)
    for note in exploration.notes([r.params for r in scored], list(space.params)):
        print(f"warning: {note}", file=sys.stderr)
    parent.log_metrics({"best_valid_acc": best.best_valid_acc, "trials": len(records),
                        "trials_stopped_early": sum(r.stop_reason == "asha" for r in records),
                        "trials_failed": sum(r.status == "ERROR" for r in records)}, step=0)
    label = config_label(best.params)
    parent.log_params({**{f"best.{k}": v for k, v in best.params.items()}, "best.trial_id": best.trial_id})
    view = tracker.show_columns(sweep["experiment"], run_columns(space))
    link = f"({view.split('/runs?')[0]}/runs/{best.mlflow_run_id})" if view and best.mlflow_run_id else ""
    parent.set_tags({"best_trial_id": best.trial_id, "best_checkpoint": best.checkpoint or "",
                     "best_mlflow_run_id": best.mlflow_run_id or "", "best_config": label,
                     "mlflow.note.content": f"Best trial: [{label}]{link}, best valid_acc {best.best_valid_acc:.4f} "
                                            f"(trial {best.trial_id}, run {best.mlflow_run_id}); its config is "
                                            "the `best.*` params and the artifact `best_config.yaml`."})
    if best.mlflow_run_id:
        tracker.attach(best.mlflow_run_id).set_tags({"best_in_sweep": "true", "mlflow.note.content":
                                                     f"The best trial of sweep {name}."})
    parent.log_artifact(best_config)
    parent.log_artifact(sweep_dir / "sweep.json")
    parent.end("FAILED" if parent.lost else "FINISHED")
    outputs, unlogged = _best_outputs(best, tracker, sweep_dir, prepared, register, records)
    if parent.lost:
        unlogged.insert(0, f"the sweep's run {parent.run_id} (marked FAILED) lacks {', '.join(parent.lost)}")
    ui = f"mlflow ui --backend-store-uri {sweep['tracking_uri']}"
    base = frequency.run(prepared, "valid")["accuracy"]
    warnings = frequency.below_warning(best.best_valid_acc, base, f"the best trial {best.trial_id}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"best trial {best.trial_id} ({label}): valid accuracy {frequency.beside(best.best_valid_acc, base)}\n"
          f"  config:       {best_config}\n"
          + (f"  explain page: {outputs['explain_page']}\n" if outputs.get("explain_page") else "")
          + f"  runs:         {ui}" + (f"  (then open {view})" if view else "") + "\n"
          + next_commands(name, best, outputs, req, best_config), file=sys.stderr)
    if unlogged:
        raise IaaError(f"{sweep['tracking_uri']}: the sweep finished and its files are written, but the store did "
                       f"not record everything; {'; '.join(unlogged)}. Free the store's disk (or unlock it, or "
                       "restart it) and log the models again")
    return {"sweep": name, "tracking_uri": sweep["tracking_uri"], "experiment": sweep["experiment"],
            "best_config": str(best_config), "best_valid_acc": best.best_valid_acc, "baseline_valid_acc": base,
            "best_trial": best.trial_id, "best_checkpoint": best.checkpoint, "trials": len(records),
            "sweep_json": str(sweep_dir / "sweep.json"), "parent_run_id": parent.run_id, **outputs, "mlflow_ui": ui}


def write_best_config(best: TrialRecord, path: Path, sweep: str, train_epochs: float | None,
                      data: Path | None) -> None:
    """The best trial's config, for ``iaa-cli train --config PATH`` with no other flag.

    Its ``train.max_epochs`` is a training length (``train_epochs``, unless the sweep searched
    it): early stopping ends the run sooner. The sweep's per-trial budget is kept apart as
    ``sweep.trial_max_epochs``, and ``data`` names the prepared folder the sweep read (absent: the
    config's ``dataset`` under the work folder).
    """
    trial_epochs = best.config.train.max_epochs
    cfg = best.config
    if train_epochs is not None and "train.max_epochs" not in best.params:
        cfg = replace(cfg, train=replace(cfg.train, max_epochs=float(train_epochs)))
    handoff: dict[str, Any] = {"data": str(Path(data).resolve())} if data is not None else {}
    handoff["sweep"] = {"name": sweep, "trial": best.trial_id, "best_valid_acc": best.best_valid_acc,
                        "trial_max_epochs": trial_epochs}
    dump_yaml(cfg, path, handoff, header=(
        f"The best configuration of sweep {sweep} (trial {best.trial_id}).\n"
        f"`iaa-cli train --config {path.name}` trains it for up to train.max_epochs, stopping early after\n"
        f"train.patience checks without improvement; each trial of the sweep had sweep.trial_max_epochs."))


def next_commands(name: str, best: TrialRecord, outputs: dict[str, Any], req: TuneRequest | None,
                  best_config: Path | None = None) -> str:
    """What to run after the sweep: train its best config, its analytics, an ensemble of its best
    configs, a service. Each line runs as printed (the work folder and store are named when not
    the defaults)."""
    q = shlex.quote
    where = "" if req is None or Path(req.workdir) == Path(DEFAULT_WORKDIR) else f" --workdir {q(str(req.workdir))}"
    store = f" --tracking-uri {q(req.tracking_uri)}" if req is not None and req.tracking_uri else ""
    model = (f"--model models:/{req.register}/latest{where}{store}" if req is not None and req.register
             else f"--checkpoint {q(str(best.checkpoint))}")
    return ("next:\n"
            + (f"  iaa-cli train --config {q(str(best_config))}{where}{store}\n" if best_config is not None else "")
            + f"  iaa-cli report --sweep {name}{where}\n"
            f"  iaa-cli ensemble --sweep {name}{where}{store}\n"
            f"  iaa-cli serve {model}")


EXPLAIN_EXAMPLES = 5  # validation examples on the best trial's explain page


def _best_outputs(best: TrialRecord, tracker: Tracker, sweep_dir: Path, prepared: Path, register: str | None,
                  records: Sequence[TrialRecord] = ()) -> tuple[dict[str, Any], list[str]]:
    """Every trial's tracked model, and the best trial's explain page (first validation examples),
    both stored on their runs; ``register`` registers the best model.

    Returns the outputs and what the store refused for good, run by run: those runs are marked
    FAILED, and the sweep's result stands (every output is written before the command fails)."""
    from iaa.jobs.inference import explain
    from iaa.jobs.inference.predict import MODEL_CODE

    if not best.checkpoint or not Path(best.checkpoint).is_file():
        return {}, []
    runs = []
    for trial in records:             # every trained reader is a logged model; the best one comes last
        if trial is not best and trial.mlflow_run_id and trial.checkpoint and Path(trial.checkpoint).is_file():
            runs.append(tracker.attach(trial.mlflow_run_id))
            tracker.log_model(runs[-1], [Path(trial.checkpoint)], prepared, code=MODEL_CODE)
    page = explain.run(Path(best.checkpoint), prepared, "valid", first=EXPLAIN_EXAMPLES,
                       out=sweep_dir / "explain-best.html", png=sweep_dir / "explain-best.png")
    out: dict[str, Any] = {"explain_page": page["html"], "explain_png": page["png"]}
    if best.mlflow_run_id:
        run = tracker.attach(best.mlflow_run_id)
        runs.append(run)
        for artifact in (page["html"], page["png"]):
            run.log_artifact(Path(artifact), "explain")
        out["model_uri"] = tracker.log_model(run, [Path(best.checkpoint)], prepared, register, code=MODEL_CODE)
    unlogged = []
    for run in runs:
        if run.lost:
            run.end("FAILED")
            unlogged.append(f"run {run.run_id} (marked FAILED) lacks {', '.join(run.lost)}")
    return out, unlogged


@dataclass(frozen=True)
class _Sweep:
    """What a sweep is, settled before Ray starts: name, folders, data, config, space, store."""

    name: str
    folder: Path                     # WORKDIR/sweeps/NAME
    storage: str                     # STORAGE (the Tune run is STORAGE/NAME)
    prepared: Path
    base: JobConfig
    space: search_space.SearchSpace
    preset: TunePreset
    num_samples: int
    tracker: Tracker                 # the store, checked
    recorded: dict[str, Any] | None  # the sweep.json of a sweep to resume


def _settle(req: TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> _Sweep:
    """Every check that needs no cluster: data, config, search space, name, the store."""
    from iaa.jobs.datasets import resolve

    preset, workdir = asha_preset(req), Path(req.workdir)
    _, prepared = resolve.data_dir(req.dataset, req.data, workdir)
    base = base_config(req, prepared, preset)
    space = (search_space.load(req.search_space, base) if req.search_space is not None
             else search_space.parse(preset.space, base))
    for note in searched_overrides(req.sets, space):
        print(f"warning: {note}", file=sys.stderr)
    name = sweep_name(req)
    folder, storage = Workdir(workdir).sweep(name), Workdir(workdir).storage(req.storage_path)
    recorded = None
    if req.resume:
        if not (folder / "sweep.json").is_file():
            raise IaaError(f"no sweep {name!r} to resume: {folder / 'sweep.json'} is missing; run it without --resume")
        recorded = sweep_file.read(folder / "sweep.json")
        tracker = open_tracker(Workdir(workdir).tracking_uri(recorded["tracking_uri"]))
    else:
        tracker = open_tracker(Workdir(workdir).tracking_uri(req.tracking_uri))
        launcher.check_free(storage, name, folder)
    return _Sweep(name, folder, storage, prepared, base, space, preset, req.num_samples or preset.num_samples,
                  tracker, recorded)


def searched_overrides(sets: Sequence[str], space: search_space.SearchSpace) -> list[str]:
    """A note for each ``--set`` of a key the search space searches: the trials never use its value."""
    notes = []
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if key in space.params:
            notes.append(f"--set {item} has no effect: the search space searches {key} "
                         f"{space.params[key].describe()}; give --search-space FILE without {key} to fix it")
    return notes


def asha_notes(reachable_checks: int, preset: TunePreset) -> list[str]:
    """A note when ASHA can never stop a trial early: its first rung (the grace period) is at or
    past the last check a trial makes by itself."""
    if reachable_checks > preset.grace_period:
        return []
    return [f"ASHA can never stop a trial early: a trial makes at most {reachable_checks} validation check(s), "
            f"and ASHA first compares trials after {preset.grace_period} (--grace-period); every trial runs its "
            "whole budget. To let it stop the weak ones, give "
            + (f"--grace-period {reachable_checks - 1} or " if reachable_checks > 1 else "")
            + "a larger --max-epochs (or more checks per epoch, --set train.check_every=BATCHES)"]


def asha_preset(req: TuneRequest) -> TunePreset:
    """The dataset's tune preset with ``--grace-period`` and ``--reduction-factor`` applied."""
    preset = TUNE_PRESETS[req.dataset]
    return replace(preset, grace_period=req.grace_period or preset.grace_period,
                   reduction_factor=req.reduction_factor or preset.reduction_factor)


def _cost(launch: Placement, s: _Sweep, checks: int) -> SweepCost:
    """The sweep's size and expected wall time (``checks``: a trial's validation checks, at most),
    printed before the first trial starts."""
    from iaa.data.manifest import read as read_manifest

    gpus = launch.gpus_per_worker > 0
    rate = 0.0 if gpus else probe(s.base, s.prepared, launch.threads)
    valid_rate = 0.0 if gpus else probe(s.base, s.prepared, launch.threads, split="valid")
    valid = int(((read_manifest(s.prepared) or {}).get("counts") or {}).get("valid", 0))
    cost = SweepCost(trials=s.num_samples, epochs=s.base.train.max_epochs, examples=launch.train_rows,
                     examples_per_s=rate, concurrency=launch.max_concurrent, gpus=gpus,
                     gpus_per_trial=launch.gpus_per_worker, checks=checks, valid_examples=valid,
                     valid_examples_per_s=valid_rate, start_s=SWEEP_START_S, trial_start_s=TRIAL_START_S)
    print(cost.describe(), file=sys.stderr)
    return cost


def run(req: TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> dict[str, Any]:
    """Run (or with ``req.resume`` continue) a sweep, tracked in ``open_tracker(uri)``.

    Returns ``{"sweep", "tracking_uri", "experiment", "best_config", "best_valid_acc"}`` plus the
    best trial, its checkpoint, the number of trials and the ``sweep.json`` path. Raises
    :class:`SweepInterrupted` when the sweep stopped with unfinished trials (after recording
    them).
    """
    req = with_dataset(req)
    s = _settle(req, open_tracker, launcher)
    tracker = s.tracker
    launch = launcher.connect(ConnectRequest(
        name=s.name, prepared=s.prepared, storage=s.storage, num_trials=s.num_samples,
        workers_per_trial=req.workers_per_trial, gpus_per_worker=req.gpus_per_worker,
        threads=s.base.train.threads or None, max_concurrent=req.max_concurrent, show_progress=req.show_progress))
    recorded_study = (s.recorded or {}).get("optuna") or {}
    plan = SearchPlan(base=s.base, space=s.space, preset=s.preset, seed=req.seed, num_samples=s.num_samples,
                      max_t=max_checks(s.base, s.space, launch.train_rows, req.workers_per_trial),
                      study_storage=recorded_study.get("storage") or study_storage(req),
                      study_name=recorded_study.get("study") or s.name)
    for note in asha_notes(plan.max_t - 1, s.preset):
        print(f"warning: {note}", file=sys.stderr)
    console = None
    if s.recorded is not None:
        if not launcher.can_resume(launch):
            raise IaaError(f"no Tune run to resume at {launch.experiment_path}; run the sweep without --resume")
        sweep = s.recorded
        parent = tracker.reopen_run(sweep["parent_run_id"])
        if req.show_progress:
            print(f"resuming sweep {s.name} from {launch.experiment_path}", file=sys.stderr)
    else:
        launcher.claim(s.storage, s.name, s.folder)
        if req.show_progress:
            console = SweepConsole(_cost(launch, s, plan.max_t - 1), list(s.space.params))
        sweep, parent = _start(req, launch, plan, tracker)
    trials = TrialTracking(tracker=tracker, experiment=sweep["experiment"], parent_run_id=parent.run_id,
                           sweep=s.name, dataset=req.dataset, data_dir=s.prepared)
    started = time.time()
    from iaa.jobs.training.train import fit_on_worker

    try:
        sweep["trials"] = launcher.sweep(SweepRequest(
            placement=launch, plan=plan, tracking=trials, fit=fit_on_worker, downloads=s.folder / "checkpoints",
            resume=s.recorded is not None, console=console, show_progress=req.show_progress, verbose=req.verbose))
    except BaseException:
        parent.end("FAILED")
        raise
    sweep["wall_s"] = round(sweep.get("wall_s", 0.0) + time.time() - started, 1)
    if console is not None:
        print(console.summary(time.time() - started), file=sys.stderr)
    sweep_file.write(s.folder / "sweep.json", sweep)
    if s.recorded is not None:
        _close_lost_runs(tracker, parent, sweep["experiment"], {r.mlflow_run_id for r in sweep["trials"]})
    return _finish(sweep["trials"], sweep, s.folder, parent, s.space, s.prepared, tracker, req.register, req,
                   training_epochs(req, s.prepared))
