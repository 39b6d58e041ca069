"""``iaa-cli tune``: Optuna (TPE) search with ASHA on Ray Tune, tracked in MLflow.

A sweep is one Tune run named ``NAME`` (default ``DATASET-MODEL``):

- **search**: ``OptunaSearch`` over a :mod:`~iaa.platform.search_space` (the paper's grid, a
  per-dataset preset, or ``--search-space FILE.yaml``) with a seeded ``TPESampler``;
- **early stopping**: ASHA on ``valid_acc`` with ``checks`` as its clock: every validation
  check of the loop (every half epoch by default) is one report;
- **resources**: :func:`iaa.platform.cluster.plan` sizes trials and their concurrency so that
  trial drivers never hold the CPUs their workers need;
- **tracking**: the driver creates one MLflow parent run per sweep and one child run per trial
  (tag ``mlflow.parentRunId``; params: the trial's whole config; metrics at every check;
  tags: trial id, dataset, git commit, checkpoint). Only the driver talks to MLflow, so the
  default SQLite store works on multi-node clusters too;
- **outputs**: ``WORKDIR/sweeps/NAME/sweep.json`` (every trial: config, best accuracy,
  checkpoint file, MLflow run, status), ``best_config.yaml`` (for ``iaa-cli train --config``),
  and a table of the best trials on stderr;
- **resume**: ``--resume`` restores the Tune run (``Tuner.restore(..., resume_errored=True)``):
  finished trials are kept, unfinished ones continue from their last checkpoint, and the
  Optuna study (with its seeded sampler) comes back with the searcher's saved state.

Trials write checkpoints under ``STORAGE/NAME`` (``STORAGE``: ``--storage-path``, else
``WORKDIR/ray``). :func:`train_many` runs a list of configs (seeds of an ensemble) through the
same trial function, without search or early stopping.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray.tune as tune

from iaa.jobs.config import JobConfig, dump_yaml, from_dict, to_dict
from iaa.platform import cluster, search_space, tracking
from iaa.platform.ray_train import CHECKPOINT_FILE, CHECKPOINT_SCORE, remove_run
from iaa.platform.trial import MEMBER_KEY, TrialSpec, job_config, run_trial

METRIC, MODE = "valid_acc", "max"
TRIAL_METRICS = ("train_loss", "valid_acc", "valid_loss", "best_valid_acc", "lr", "epoch", "train_examples_per_s")
MAX_TRIAL_FAILURES = 2      # a failed trial restarts from its last checkpoint this many times
# (a multi-worker trial once more only: its Train run already restarts failed workers itself)
TABLE_ROWS = 10


@dataclass(frozen=True)
class TunePreset:
    """A dataset's sweep budget: trials, epochs per trial, search space and ASHA's schedule."""

    num_samples: int
    max_epochs: float
    space: Mapping[str, Any]
    grace_period: int = 1          # checks before ASHA may stop a trial
    reduction_factor: float = 2.0  # ASHA keeps the best 1/reduction_factor at each rung


TUNE_PRESETS: dict[str, TunePreset] = {
    # A whole sweep on a 2-core laptop in minutes: 6 trials of 1 epoch (2 checks) each, 2 at a time.
    "demo": TunePreset(num_samples=6, max_epochs=1.0, space=search_space.DEMO_GRID, grace_period=1,
                       reduction_factor=2.0),
    "cbt-ne": TunePreset(num_samples=24, max_epochs=4.0, space=search_space.PAPER_GRID, grace_period=2,
                         reduction_factor=3.0),
    "cbt-cn": TunePreset(num_samples=24, max_epochs=4.0, space=search_space.PAPER_GRID, grace_period=2,
                         reduction_factor=3.0),
    "cnn": TunePreset(num_samples=16, max_epochs=3.0, space=search_space.PAPER_GRID, grace_period=2,
                      reduction_factor=3.0),
}


@dataclass(frozen=True)
class TuneRequest:
    """What ``iaa-cli tune`` asks for; ``None`` means the dataset's :data:`TUNE_PRESETS` value."""

    dataset: str
    data: Path | None = None
    model_kind: str = "iaa"
    num_samples: int | None = None
    max_concurrent: int | None = None
    max_epochs: float | None = None
    search_space: Path | None = None
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    name: str | None = None
    seed: int = 0
    config_file: Path | None = None
    sets: tuple[str, ...] = ()
    workdir: Path = Path("iaa-work")
    tracking_uri: str | None = None
    address: str | None = None
    storage_path: str | None = None
    resume: bool = False
    show_progress: bool = True


# --- MLflow, from the driver -----------------------------------------------------------------------

_TRACKERS: dict[str, "MlflowTrials"] = {}   # sweep name -> its callback (also the one --resume unpickles)


class MlflowTrials(tune.Callback):
    """Gives every trial its MLflow child run, from the driver; remembers each trial's best checkpoint.

    Tune pickles its callbacks into the run (``tuner.pkl``) and brings them back on ``--resume``;
    so this holds plain data, and a resumed trial finds its child run again by its tags.
    """

    def __init__(self, *, uri: str, experiment: str, parent_run_id: str | None, sweep: str, dataset: str,
                 spec: TrialSpec) -> None:
        self.uri, self.experiment, self.parent_run_id = uri, experiment, parent_run_id
        self.sweep, self.dataset, self.spec = sweep, dataset, spec
        self.run_ids: dict[str, str] = {}
        self.best: dict[str, tuple[float, str]] = {}     # trial id -> (valid_acc, checkpoint dir)
        self.trials: list[Any] = []
        self.done_before: set[str] = set()   # trials whose run had finished when a resumed sweep met them
        self.reported: set[str] = set()      # trials that reported in this process
        _TRACKERS[sweep] = self

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "trials": [], "done_before": set(), "reported": set()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _TRACKERS[self.sweep] = self

    def run_for(self, trial: Any) -> tracking.Run:
        """The trial's child run: remembered, found by its tags, or created with the trial's config."""
        run_id = self.run_ids.get(trial.trial_id) or self.find(trial.trial_id)
        if run_id is None:
            cfg = job_config(self.spec, trial.config)
            run = tracking.Run.start(self.uri, self.experiment, f"{self.sweep}-{trial.trial_id}",
                                     tags={"trial_id": trial.trial_id, "dataset": self.dataset, "sweep": self.sweep,
                                           "model": cfg.model.kind},
                                     parent_run_id=self.parent_run_id)
            run.log_params(to_dict(cfg))
            run_id = run.run_id
        self.run_ids[trial.trial_id] = run_id
        return tracking.Run(self.uri, run_id)

    def find(self, trial_id: str) -> str | None:
        client = tracking.open_client(self.uri)
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            return None
        runs = client.search_runs([found.experiment_id],
                                  filter_string=f"tags.sweep = '{self.sweep}' and tags.trial_id = '{trial_id}'")
        runs = [r for r in runs if r.data.tags.get(tracking.PARENT_TAG) == self.parent_run_id]
        return runs[0].info.run_id if runs else None

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.trials = trials

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        run = self.run_for(trial)
        if run.client.get_run(run.run_id).info.status == "FINISHED":
            # A sweep killed between a trial's last report and Tune's next saved state resumes that
            # trial from its final checkpoint: it stops at once without training. Leave its run be.
            self.done_before.add(trial.trial_id)
            return
        run.client.update_run(run.run_id, status="RUNNING")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        self.reported.add(trial.trial_id)
        metrics = {k: result[k] for k in TRIAL_METRICS if k in result}
        self.run_for(trial).log_metrics(metrics, step=int(result.get("step", 0)))
        path = result.get("checkpoint_path")      # multi-worker trials: the Train run's checkpoint
        if path and result.get("is_best"):
            self.best[trial.trial_id] = (float(result.get(METRIC, 0.0)), str(path))

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get("is_best") and checkpoint is not None:
            self.best[trial.trial_id] = (float(last.get(METRIC, 0.0)), str(checkpoint.path))

    def _end(self, trial: Any, status: str) -> None:
        if trial.trial_id in self.done_before and trial.trial_id not in self.reported:
            return
        run = self.run_for(trial)
        if trial.trial_id in self.best:
            run.set_tags({"checkpoint": checkpoint_file(self.best[trial.trial_id][1])})
        run.end(status)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED")

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.trials = trials


def checkpoint_file(checkpoint_dir: str) -> str:
    """The state file inside a Ray checkpoint directory."""
    return f"{str(checkpoint_dir).rstrip('/')}/{CHECKPOINT_FILE}"


# --- running trials ---------------------------------------------------------------------------------


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


@dataclass
class _Launch:
    """Everything a Tune run of the trial function needs, for a sweep or for ``train_many``."""

    name: str
    prepared: Path
    workdir: Path
    uri: str
    experiment: str
    dataset: str
    address: str | None
    storage_path: str | None
    workers_per_trial: int
    gpus_per_worker: float
    threads: int | None
    max_concurrent: int | None
    num_trials: int
    show_progress: bool
    info: Any = None
    plan: Any = None
    storage: str = ""
    train_rows: int = 0

    @property
    def experiment_path(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"

    def connect(self) -> None:
        self.info, self.plan = cluster.fit_trials(cluster.connect(self.address, self.storage_path),
                                                  self.workers_per_trial, threads=self.threads,
                                                  gpus_per_worker=self.gpus_per_worker,
                                                  max_concurrent=self.max_concurrent, num_trials=self.num_trials)
        self.storage = self.storage_path or str((Path(self.workdir) / "ray").resolve())
        if self.show_progress:
            print(cluster.describe(self.info, self.plan), file=sys.stderr)

    def spec(self, *, base: JobConfig | None = None, fixed: Mapping[str, Any] | None = None,
             members: Sequence[JobConfig] = ()) -> TrialSpec:
        from iaa.data.manifest import read

        manifest = read(Path(self.prepared)) or {}
        return TrialSpec(name=self.name, storage_path=self.storage, workers=self.plan.workers,
                         threads=self.plan.threads, gpus_per_worker=self.plan.gpus_per_worker,
                         worker_resources=dict(self.plan.worker_resources),
                         base=to_dict(base) if base is not None else None, fixed=dict(fixed or {}),
                         members=tuple(to_dict(m) for m in members), vocab_hash=manifest.get("vocab_hash", ""),
                         prepared=str(Path(self.prepared).resolve()))

    def trainable(self, spec: TrialSpec) -> Any:
        from iaa.data.loader import PreparedData

        data = PreparedData.open(Path(self.prepared))
        self.train_rows = int(data.manifest["splits"]["train"]["count"])
        # one-worker trials share tables put once into the object store; Train workers read their own rows
        train, valid = (data.table("train"), data.table("valid")) if self.plan.in_actor else (None, None)
        fn = tune.with_parameters(run_trial, spec=spec, train=train, valid=valid)
        return tune.with_resources(fn, dict(self.plan.trial_resources))

    def run_config(self, callbacks: Sequence[Any]) -> Any:
        return tune.RunConfig(
            name=self.name, storage_path=self.storage,
            failure_config=tune.FailureConfig(max_failures=MAX_TRIAL_FAILURES if self.plan.in_actor else 1),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_SCORE,
                                                    checkpoint_score_order="max"),
            callbacks=list(callbacks), verbose=1 if self.show_progress else 0,
        )


def _best_checkpoint(result: Any, spec: TrialSpec, trial_id: str, tracked: Mapping[str, tuple[float, str]]) -> str | None:
    """The best checkpoint directory of one trial (the last check that improved ``valid_acc``)."""
    if spec.workers > 1:  # the trial's Train run holds them
        try:
            import ray.train

            train_run = ray.train.Result.from_path(f"{spec.storage_path.rstrip('/')}/{spec.train_run_name(trial_id)}")
            best = train_run.get_best_checkpoint(CHECKPOINT_SCORE, "max")
            if best is not None:
                return best.path
        except Exception:  # noqa: BLE001 - no Train run yet (the trial never started)
            pass
    scored = [(float(m.get(CHECKPOINT_SCORE, -1.0)), c.path) for c, m in (result.best_checkpoints or [])]
    scored = [s for s in scored if s[0] >= 0]
    if scored:
        return max(scored)[1]
    return tracked[trial_id][1] if trial_id in tracked else None


def _local_checkpoint(ckpt_dir: str | None, storage: str, dest: Path) -> str | None:
    """A checkpoint file readable here: in place on a local/NFS store, downloaded from a bucket."""
    if ckpt_dir is None:
        return None
    if not cluster.is_remote_uri(storage):
        return checkpoint_file(ckpt_dir)
    import pyarrow.fs

    fs, _ = pyarrow.fs.FileSystem.from_uri(storage)
    dest.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(checkpoint_file(ckpt_dir), str(dest), source_filesystem=fs)
    return str(dest)


def _records(results: Any, tracker: Any, spec: TrialSpec, storage: str, downloads: Path) -> list[dict[str, Any]]:
    """One record per trial: config, best accuracy, checkpoint file, MLflow run, status."""
    statuses = {t.trial_id: t.status for t in tracker.trials}
    records = []
    for result in results:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name
        config = result.config or {}
        cfg = job_config(spec, config)
        ckpt = _best_checkpoint(result, spec, trial_id, tracker.best)
        status = statuses.get(trial_id) or ("ERROR" if result.error else "TERMINATED")
        best_acc = metrics.get("best_valid_acc")
        records.append({
            "trial_id": trial_id,
            "config": to_dict(cfg),
            "params": {k: v for k, v in config.items()},
            "best_valid_acc": float(best_acc) if best_acc is not None else None,
            "checkpoint": _local_checkpoint(ckpt, storage, downloads / f"{trial_id}.pt"),
            "mlflow_run_id": tracker.run_ids.get(trial_id) or tracker.find(trial_id),
            "status": status,
            "checks": int(metrics.get("checks", 0) or 0),
            "steps": int(metrics.get("steps", 0) or 0),
            # the loop names why it stopped in its last report; a trial ended with none was stopped by ASHA
            "stop_reason": metrics.get("stop_reason") or ("asha" if status == "TERMINATED" else ""),
            "error": str(result.error)[:2000] if result.error else None,
        })
    return records


def _fit(tuner: Any) -> Any:
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save the experiment state often, for --resume
    # Tune snapshots the experiment at every kept checkpoint (what --resume needs); don't warn about it.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    return tuner.fit()


# --- iaa-cli tune -----------------------------------------------------------------------------------


def _max_checks(cfg: JobConfig, space: search_space.SearchSpace, train_rows: int, workers: int) -> int:
    """An upper bound on a trial's checks: ASHA's ``max_t`` (a trial reaching it is stopped)."""
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


def _wipe(launch: _Launch, sweep_dir: Path) -> None:
    """Forget a previous sweep of this name (a fresh run must not mix with it)."""
    remove_run(launch.storage, launch.name)
    if not cluster.is_remote_uri(launch.storage):
        for stale in Path(launch.storage).glob(f"{launch.name}-train-*"):
            shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(sweep_dir, ignore_errors=True)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)


def _table(records: list[dict[str, Any]], space: search_space.SearchSpace) -> str:
    ranked = sorted(records, key=lambda r: -(r["best_valid_acc"] if r["best_valid_acc"] is not None else -1))
    names = list(space.params)
    short = [n.split(".")[-1] for n in names]
    head = ["rank", "trial", "status", "checks", "valid_acc", *short]
    rows = [head]
    for i, r in enumerate(ranked[:TABLE_ROWS], 1):
        acc = f"{r['best_valid_acc']:.4f}" if r["best_valid_acc"] is not None else "-"
        status = "stopped" if r["stop_reason"] == "asha" else r["status"].lower()
        values = [tracking.flatten(r["config"]).get(n, "") for n in names]
        rows.append([str(i), r["trial_id"], status, str(r["checks"]), acc,
                     *[f"{v:g}" if isinstance(v, float) else str(v) for v in values]])
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def _base_config(req: TuneRequest, prepared: Path, preset: TunePreset) -> JobConfig:
    """Dataset preset, config file, --model and --set; then the epochs of the sweep."""
    from iaa.jobs import resolve
    from iaa.jobs.presets import for_dataset

    cfg = resolve.job_config(req.dataset, prepared, model_kind=req.model_kind, config_file=req.config_file,
                             sets=req.sets)
    epochs = req.max_epochs
    if epochs is None:  # the tune preset's budget, unless the config file or --set chose one
        epochs = preset.max_epochs if cfg.train.max_epochs == for_dataset(req.dataset).train.max_epochs else None
    if epochs is not None:
        if epochs <= 0:
            raise ValueError(f"--max-epochs must be > 0, got {epochs}")
        cfg = replace(cfg, train=replace(cfg.train, max_epochs=float(epochs)))
    return cfg


def _start(req: TuneRequest, launch: _Launch, spec: TrialSpec, trainable: Any, base: JobConfig,
           space: search_space.SearchSpace, preset: TunePreset, num_samples: int, sweep_dir: Path,
           callbacks: Sequence[Any]) -> tuple[Any, dict[str, Any], tracking.Run, MlflowTrials]:
    """A fresh sweep: forget any previous one of this name, open the parent run, build the Tuner."""
    import optuna
    from optuna.samplers import TPESampler
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _wipe(launch, sweep_dir)
    parent = tracking.Run.start(launch.uri, launch.experiment, launch.name,
                                tags={"dataset": req.dataset, "sweep": launch.name, "model": base.model.kind})
    try:
        parent.log_params({**tracking.flatten(to_dict(base)), "tune.num_samples": num_samples,
                           "tune.search_space": space.describe(), "tune.seed": req.seed,
                           "tune.workers_per_trial": req.workers_per_trial,
                           "tune.max_concurrent": launch.plan.max_concurrent})
        sweep = {"name": launch.name, "dataset": req.dataset, "data_dir": str(Path(launch.prepared).resolve()),
                 "tracking_uri": launch.uri, "experiment": launch.experiment, "parent_run_id": parent.run_id,
                 "storage": launch.experiment_path, "search_space": json.loads(space.to_json()),
                 "num_samples": num_samples, "workers_per_trial": req.workers_per_trial,
                 "max_concurrent": launch.plan.max_concurrent, "trials": []}
        _write_json(sweep_dir / "sweep.json", sweep)
        tracker = MlflowTrials(uri=launch.uri, experiment=launch.experiment, parent_run_id=parent.run_id,
                               sweep=launch.name, dataset=req.dataset, spec=spec)
        max_t = _max_checks(base, space, launch.train_rows, req.workers_per_trial)
        searcher = OptunaSearch(space=search_space.to_optuna(space), metric=METRIC, mode=MODE,
                                sampler=TPESampler(seed=req.seed))
        scheduler = ASHAScheduler(time_attr="checks", max_t=max_t, grace_period=min(preset.grace_period, max_t),
                                  reduction_factor=preset.reduction_factor)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, search_alg=searcher, scheduler=scheduler,
                                        num_samples=num_samples, max_concurrent_trials=launch.plan.max_concurrent,
                                        reuse_actors=launch.plan.in_actor, trial_dirname_creator=_trial_dirname),
            run_config=launch.run_config([tracker, *callbacks]),
        )
    except BaseException:
        parent.end("FAILED")
        raise
    if req.show_progress:
        print(f"sweep {launch.name}: {num_samples} trials over {space.describe()}; ASHA on {METRIC} at every "
              f"check (at most {max_t}); MLflow {launch.uri}, experiment {launch.experiment}", file=sys.stderr)
    return tuner, sweep, parent, tracker


def _resume(req: TuneRequest, launch: _Launch, trainable: Any,
            sweep_dir: Path) -> tuple[Any, dict[str, Any], tracking.Run, MlflowTrials]:
    """An interrupted sweep: its Tune run (searcher, scheduler, callbacks) and its parent run."""
    sweep_file = sweep_dir / "sweep.json"
    if not tune.Tuner.can_restore(launch.experiment_path) or not sweep_file.is_file():
        raise FileNotFoundError(f"no sweep {launch.name!r} to resume: {launch.experiment_path} or {sweep_file} "
                                "is missing; run it without --resume first")
    sweep = json.loads(sweep_file.read_text(encoding="utf-8"))
    tuner = tune.Tuner.restore(launch.experiment_path, trainable=trainable, resume_errored=True)
    tracker = _TRACKERS[launch.name]  # the sweep's own callback, unpickled with the Tune run
    parent = tracking.Run(sweep["tracking_uri"], sweep["parent_run_id"])
    parent.client.update_run(parent.run_id, status="RUNNING")
    if req.show_progress:
        done = sum(t.get("status") == "TERMINATED" for t in sweep.get("trials", []))
        print(f"resuming sweep {launch.name} from {launch.experiment_path}"
              + (f" ({done} trials finished when last recorded)" if done else ""), file=sys.stderr)
    return tuner, sweep, parent, tracker


def _close_lost_runs(parent: tracking.Run, experiment: str, records: list[dict[str, Any]]) -> None:
    """End as KILLED the child runs of trials that a killed sweep started but never recorded.

    Tune saves its state every few seconds; a trial started after the last save is forgotten on
    ``--resume`` (and the searcher samples a new one), but its MLflow child run already exists.
    """
    kept = {r["mlflow_run_id"] for r in records}
    found = parent.client.get_experiment_by_name(experiment)
    if found is None:
        return
    runs = parent.client.search_runs([found.experiment_id], filter_string="attributes.status = 'RUNNING'")
    for run in runs:
        if run.data.tags.get(tracking.PARENT_TAG) == parent.run_id and run.info.run_id not in kept:
            lost = tracking.Run(parent.uri, run.info.run_id)
            lost.set_tags({"lost": "started before the sweep was killed, after its last saved state; "
                                   "resumed without it"})
            lost.end("KILLED")


def _finish(records: list[dict[str, Any]], sweep: dict[str, Any], sweep_dir: Path, parent: tracking.Run,
            space: search_space.SearchSpace) -> dict[str, Any]:
    """The best trial: its config as YAML, the table, the parent run's metrics and artifacts."""
    name = sweep["name"]
    unfinished = [r for r in records if r["status"] not in ("TERMINATED", "ERROR")]
    if unfinished:
        parent.end("KILLED")
        print(f"sweep {name} interrupted with {len(unfinished)} unfinished trial(s); run the same command with "
              "--resume to continue it", file=sys.stderr)
        raise KeyboardInterrupt
    scored = [r for r in records if r["best_valid_acc"] is not None and r["status"] != "ERROR"]
    if not scored:
        parent.end("FAILED")
        errors = "; ".join(f"{r['trial_id']}: {r['error']}" for r in records if r["error"])[:2000]
        raise RuntimeError(f"sweep {name}: no trial finished a validation check. {errors}")
    best = max(scored, key=lambda r: r["best_valid_acc"])
    best_config = sweep_dir / "best_config.yaml"
    dump_yaml(from_dict(best["config"]), best_config)
    print(_table(records, space), file=sys.stderr)
    parent.log_metrics({"best_valid_acc": best["best_valid_acc"], "trials": len(records),
                        "trials_stopped_early": sum(r["stop_reason"] == "asha" for r in records),
                        "trials_failed": sum(r["status"] == "ERROR" for r in records)}, step=0)
    parent.set_tags({"best_trial_id": best["trial_id"], "best_checkpoint": best["checkpoint"] or "",
                     "best_mlflow_run_id": best["mlflow_run_id"] or ""})
    parent.log_artifact(best_config)
    parent.log_artifact(sweep_dir / "sweep.json")
    parent.end("FINISHED")
    return {"sweep": name, "tracking_uri": sweep["tracking_uri"], "experiment": sweep["experiment"],
            "best_config": str(best_config), "best_valid_acc": best["best_valid_acc"],
            "best_trial": best["trial_id"], "best_checkpoint": best["checkpoint"], "trials": len(records),
            "sweep_json": str(sweep_dir / "sweep.json"), "parent_run_id": parent.run_id}


def run(req: TuneRequest, *, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Run (or with ``req.resume`` continue) a sweep.

    Returns ``{"sweep", "tracking_uri", "experiment", "best_config", "best_valid_acc"}`` plus the
    best trial, its checkpoint, the number of trials and the ``sweep.json`` path. Raises
    ``KeyboardInterrupt`` when the sweep was interrupted (after recording where it stopped).
    ``callbacks`` are extra Tune callbacks (the overhead benchmark uses one).
    """
    from iaa.jobs import resolve

    if req.dataset not in TUNE_PRESETS:
        raise ValueError(f"no tune preset for {req.dataset!r}; choose from {sorted(TUNE_PRESETS)}")
    if req.num_samples is not None and req.num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {req.num_samples}")
    preset = TUNE_PRESETS[req.dataset]
    workdir = Path(req.workdir)
    _, prepared = resolve.data_dir(req.dataset if req.data is None else None, req.data, workdir)
    base = _base_config(req, prepared, preset)
    space = (search_space.load(req.search_space, base) if req.search_space is not None
             else search_space.parse(preset.space, base))
    num_samples = req.num_samples or preset.num_samples
    name = req.name or f"{req.dataset}-{req.model_kind}"
    sweep_dir = workdir / "sweeps" / name
    if req.resume and not (sweep_dir / "sweep.json").is_file():   # fail before starting Ray
        raise FileNotFoundError(f"no sweep {name!r} to resume: {sweep_dir / 'sweep.json'} is missing; "
                                "run it without --resume first")
    launch = _Launch(name=name, prepared=prepared, workdir=workdir, uri=tracking.resolve_uri(req.tracking_uri, workdir),
                     experiment=f"tune-{req.dataset}", dataset=req.dataset, address=req.address,
                     storage_path=req.storage_path, workers_per_trial=req.workers_per_trial,
                     gpus_per_worker=req.gpus_per_worker, threads=base.train.threads or None,
                     max_concurrent=req.max_concurrent, num_trials=num_samples, show_progress=req.show_progress)
    launch.connect()
    spec = launch.spec(base=base, fixed=space.fixed)
    trainable = launch.trainable(spec)
    if req.resume:
        tuner, sweep, parent, tracker = _resume(req, launch, trainable, sweep_dir)
    else:
        tuner, sweep, parent, tracker = _start(req, launch, spec, trainable, base, space, preset, num_samples,
                                               sweep_dir, callbacks)
    started = time.time()
    try:
        results = _fit(tuner)
        sweep["trials"] = _records(results, tracker, spec, launch.storage, sweep_dir / "checkpoints")
    except BaseException:
        parent.end("FAILED")
        raise
    sweep["wall_s"] = round(sweep.get("wall_s", 0.0) + time.time() - started, 1)
    _write_json(sweep_dir / "sweep.json", sweep)
    if req.resume:
        _close_lost_runs(parent, sweep["experiment"], sweep["trials"])
    return _finish(sweep["trials"], sweep, sweep_dir, parent, space)


# --- ensembles: several configs as parallel trials --------------------------------------------------


def train_many(
    configs: list[JobConfig],
    prepared: Path,
    *,
    name: str,
    workdir: Path,
    tracking_uri: str | None,
    parent_run_id: str | None,
    experiment: str,
    address: str | None = None,
    storage_path: str | None = None,
    workers_per_trial: int = 1,
    show_progress: bool = True,
) -> list[dict[str, Any]]:
    """Train every config as a parallel Ray Tune trial (no search, no early stopping).

    Each trial gets an MLflow child run under ``parent_run_id``. Returns, in input order,
    ``{"config", "checkpoint", "best_valid_acc", "mlflow_run_id", "status"}`` per config;
    ``checkpoint`` is the best checkpoint file (``None`` when the trial failed before a check).
    """
    if not configs:
        return []
    workdir = Path(workdir)
    uri = tracking.resolve_uri(tracking_uri, workdir)
    threads = {c.train.threads for c in configs}
    launch = _Launch(name=name, prepared=Path(prepared), workdir=workdir, uri=uri, experiment=experiment,
                     dataset=configs[0].dataset, address=address, storage_path=storage_path,
                     workers_per_trial=workers_per_trial, gpus_per_worker=0.0,
                     threads=(threads.pop() or None) if len(threads) == 1 else None, max_concurrent=None,
                     num_trials=len(configs), show_progress=show_progress)
    launch.connect()
    spec = launch.spec(members=configs)
    tracker = MlflowTrials(uri=uri, experiment=experiment, parent_run_id=parent_run_id, sweep=name,
                            dataset=configs[0].dataset, spec=spec)
    tuner = tune.Tuner(
        launch.trainable(spec),
        param_space={MEMBER_KEY: tune.grid_search(list(range(len(configs))))},
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, max_concurrent_trials=launch.plan.max_concurrent,
                                    reuse_actors=launch.plan.in_actor, trial_dirname_creator=_trial_dirname),
        run_config=launch.run_config([tracker]),
    )
    results = _fit(tuner)
    records = _records(results, tracker, spec, launch.storage, workdir / "sweeps" / name / "checkpoints")
    by_member = {int(r["params"][MEMBER_KEY]): r for r in records}
    out = []
    for i, cfg in enumerate(configs):
        r = by_member.get(i, {})
        out.append({"config": cfg, "checkpoint": r.get("checkpoint"), "best_valid_acc": r.get("best_valid_acc"),
                    "mlflow_run_id": r.get("mlflow_run_id"), "status": r.get("status", "ERROR"),
                    "trial_id": r.get("trial_id")})
    return out
