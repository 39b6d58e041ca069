"""In-process fakes of the jobs' ports: a :class:`FakeTracker` that keeps runs in memory and a
:class:`FakeLauncher` that runs every trial, member and worker in this process, one after another.

With them a job's whole use case (train, tune, ensemble, train on workers) runs without Ray or
MLflow in seconds; the end-to-end tests run the same jobs on the real adapters.
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ContextManager, Iterator, Mapping, Sequence

import torch

from iaa.errors import IaaError
from iaa.files import DiskFullError
from iaa.jobs.ports import (CHECKPOINT_FILE, TUNE_RUN_TAG, Carried, ConnectRequest, MembersRequest, MetricPoint, Metrics,
                            ModelCard, ModelCode, ModelFiles, Placement, RunRecord, SearchPlan, SweepRequest, TrackedRun, TrialRecord, TrialRun,
                            WorkerData, WorkerFit, WorkersRequest)
from iaa.jobs.ports import TrainRun
from iaa.jobs.config.search_space import Param, SearchSpace
from iaa.jobs.config.job_config import JobConfig, apply


class StoreDown(ConnectionError):
    """What a :class:`FakeTracker` raises while ``down`` is set."""


def _flatten(data: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


@dataclass
class FakeRun:
    """One run of a :class:`FakeTracker`: everything it was given, as given."""

    tracker: "FakeTracker"
    run_id: str
    experiment: str
    name: str
    tags: dict[str, str]
    parent_run_id: str | None
    start_ms: int
    state: str = "RUNNING"
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, list[MetricPoint]] = field(default_factory=dict)
    inputs: list[tuple[str, str]] = field(default_factory=list)      # (context, path)
    artifacts: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    full: Exception | None = None

    def status(self) -> str:
        self.tracker.check()
        return self.state

    def mark_running(self) -> None:
        """As the store: RUNNING again, without the tags of how it stopped."""
        self.tracker.check()
        self.state = "RUNNING"
        for key in ("interrupted", "iaa.killed"):
            self.tags.pop(key, None)

    def log_params(self, params: Mapping[str, object]) -> None:
        """As MLflow: a param keeps its first value (a change is refused, kept in ``lost``)."""
        self.tracker.check()
        flat = _flatten(params)
        changed = sorted(k for k, v in flat.items() if k in self.params and self.params[k] != v)
        if changed:
            self.lost.append(f"log {len(flat)} params (changing param values is not allowed: {', '.join(changed)})")
            return
        self.params.update(flat)

    def log_metrics(self, metrics: Mapping[str, object], step: int | None = None) -> None:
        self.tracker.check()
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.metrics.setdefault(key, []).append(MetricPoint(step or 0, float(value), int(time.time() * 1000)))

    def set_tags(self, tags: Mapping[str, object]) -> None:
        self.tracker.check()
        self.tags.update({k: str(v) for k, v in tags.items()})

    def log_dataset(self, prepared: Path, context: str = "train") -> None:
        self.inputs.append((context, str(prepared)))

    def log_file_input(self, path: Path, context: str) -> None:
        self.inputs.append((context, str(path)))

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        self.artifacts.append(f"{folder}/{Path(path).name}" if folder else Path(path).name)

    def end(self, status: str = "FINISHED") -> None:
        self.state = status

    def last(self, key: str) -> float:
        return self.metrics[key][-1].value

    def record(self) -> RunRecord:
        return RunRecord(self.run_id, self.name, self.state, self.start_ms, dict(self.params), dict(self.tags),
                         self.parent_run_id)


class FakeTracker:
    """:class:`iaa.jobs.ports.Tracker` in memory. Set ``down`` to make every call fail as a lost store would."""

    uri = "memory:"
    ui_command = "fake-ui memory:"
    transient_errors = (StoreDown,)

    def __init__(self) -> None:
        self.runs: dict[str, FakeRun] = {}
        self.deleted: dict[str, FakeRun] = {}
        self.models: list[dict[str, object]] = []
        self.down = False
        self._ids = itertools.count(1)

    def check(self) -> None:
        if self.down:
            raise StoreDown("the fake store is down")

    def full(self, failed: str) -> DiskFullError:
        return DiskFullError(f"no space left on device for the fake store {self.uri}: it could not {failed}")

    def start_run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> FakeRun:
        self.check()
        run = FakeRun(self, f"run-{next(self._ids)}", experiment, name, dict(tags or {}), parent_run_id,
                      start_ms=len(self.runs))
        self.runs[run.run_id] = run
        return run

    def reopen_run(self, run_id: str) -> FakeRun:
        run = self.attach(run_id)
        run.mark_running()
        return run

    def attach(self, run_id: str) -> FakeRun:
        self.check()
        if run_id not in self.runs:
            raise IaaError(f"{self.uri}: no run {run_id}")
        return self.runs[run_id]

    def run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
            resume_id: str | None = None, parent_run_id: str | None = None) -> ContextManager[TrackedRun]:
        @contextmanager
        def context() -> Iterator[FakeRun]:
            run = (self.reopen_run(resume_id) if resume_id
                   else self.start_run(experiment, name, tags=tags, parent_run_id=parent_run_id))
            status = "FAILED"
            try:
                yield run
                status = "FINISHED"
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                run.end(status)
        return context()

    def find_runs(self, experiment: str, tags: Mapping[str, str] | None = None,
                  status: str | None = None) -> list[RunRecord]:
        self.check()
        found = [r.record() for r in self.runs.values() if r.experiment == experiment
                 and all(r.tags.get(k) == v for k, v in (tags or {}).items()) and status in (None, r.state)]
        return sorted(found, key=lambda r: r.start_ms, reverse=True)

    def find_by_tag(self, key: str, values: Sequence[str]) -> str | None:
        found = [r for r in self.runs.values() if r.tags.get(key) in values]
        return max(found, key=lambda r: r.start_ms).run_id if found else None

    def delete_run(self, run_id: str) -> None:
        """As MLflow: the run leaves the store's lists, and is kept in ``deleted``."""
        self.check()
        self.deleted[run_id] = self.runs.pop(run_id)

    def log_model(self, run: TrackedRun, files: ModelFiles, register: str | None = None, *,
                  code: ModelCode, card: ModelCard | None = None) -> str | None:
        self.check()
        self.models.append({"run_id": run.run_id, "checkpoints": [str(c) for c in files.checkpoints],
                            "prepared": str(files.prepared), "register": register, "code": code,
                            "temperature": files.temperature, "card": card})
        return f"models:/{register}/{len(self.models)}" if register else f"runs:/{run.run_id}/model"

    def model_uri(self, run_id: str) -> str | None:
        return f"runs:/{run_id}/model" if any(m["run_id"] == run_id for m in self.models) else None

    def experiment_records(self, experiment: str) -> list[RunRecord] | None:
        found = self.find_runs(experiment)
        return list(reversed(found)) if found else None

    def experiment_names(self) -> list[str]:
        return sorted({r.experiment for r in self.runs.values()})

    def show_columns(self, experiment: str, columns: Sequence[str]) -> str | None:
        return None

    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]:
        return list(self.attach(run_id).metrics.get(key, []))

    def children(self, parent_run_id: str) -> list[FakeRun]:
        return [r for r in self.runs.values() if r.parent_run_id == parent_run_id]


class FakeLink:
    """:class:`iaa.jobs.ports.WorkerLink` of a lone worker: publishing keeps the metrics and copies
    each best checkpoint to ``best`` (and each checkpoint to ``last``)."""

    rank, world_size = 0, 1
    device = torch.device("cpu")

    def __init__(self, best: Path, last: Path | None = None, on_metrics=None) -> None:
        self.best, self.last, self.on_metrics = best, last, on_metrics
        self.history: list[Metrics] = []

    def all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        return list(values)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def last_checkpoint(self) -> ContextManager[Path | None]:
        return nullcontext(None)

    def publish(self, metrics: Metrics, folder: Path | None) -> None:
        self.history.append(dict(metrics))
        if self.on_metrics is not None:
            self.on_metrics(dict(metrics))
        if folder is None:
            return
        targets = ([self.best] if metrics.get("is_best") else []) + ([self.last] if self.last else [])
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / CHECKPOINT_FILE, target)


def sample(space: SearchSpace, count: int, seed: int) -> list[dict[str, object]]:
    """``count`` configurations of ``space``: choices in turn (every value early), ranges at random."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        values: dict[str, object] = {}
        for name, p in space.params.items():
            values[name] = p.choices[i % len(p.choices)] if p.choices is not None else _draw(p, rng)
        out.append(values)
    return out


def _draw(p: Param, rng: random.Random) -> float | int:
    low, high = float(p.low), float(p.high)
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if p.log else rng.uniform(low, high)
    if p.step:
        value = low + round((value - low) / p.step) * p.step
    return int(round(value)) if p.integer else value


class FakeLauncher:
    """:class:`iaa.jobs.ports.Launcher` in this process: one trial at a time, no search algorithm
    (:func:`sample`), no early stopping; ``requests`` keeps what it was asked."""

    def __init__(self) -> None:
        self.requests: list[object] = []
        self.saved: list[TrialRecord] = []          # the trials a stopped sweep's run saved (saved_trials)
        self.failed_trials: list[dict[str, str]] = []   # the attrs of each fail_unfinished_trials call
        self.carried = Carried(sweep="", trials=0)       # what carry_trials returns

    def check_free(self, storage: str, name: str, folder: Path | None = None) -> None:
        if (Path(storage) / name).exists() or (folder is not None and folder.exists()):
            raise IaaError(f"a run named {name!r} already exists")

    def claim(self, storage: str, name: str, folder: Path) -> None:
        self.check_free(storage, name, folder)
        folder.mkdir(parents=True)

    def connect(self, request: ConnectRequest) -> Placement:
        from iaa.data.prepared.manifest import counted

        self.requests.append(request)
        rows = counted(Path(request.prepared), "train")
        return Placement(name=request.name, storage=request.storage, prepared=Path(request.prepared),
                         max_concurrent=1, threads=1, gpus_per_worker=0.0, train_rows=rows)

    def can_resume(self, placement: Placement) -> bool:
        return False

    def sweep(self, request: SweepRequest) -> list[TrialRecord]:
        self.requests.append(request)
        plan = request.plan
        out = []
        ran = [params for params, _ in self.carried.ran] if plan.warm_start is not None else []
        given = [c for c in plan.try_first if c not in ran]     # the configurations given to try first, in order
        for i, values in enumerate(sample(plan.space, plan.num_samples, plan.seed)):
            if i < len(given):
                values = {**values, **given[i]}
            cfg = apply(plan.base, {**plan.space.fixed, **values})
            out.append(self._trial(f"trial{i:05d}", cfg, values, request.placement.prepared, request.trials,
                                   request.placement.name))
        return out

    def saved_trials(self, request: SweepRequest) -> list[TrialRecord]:
        """What :attr:`saved` holds (default: nothing saved)."""
        return list(self.saved)

    def fail_unfinished_trials(self, plan: SearchPlan, attrs: Mapping[str, str]) -> int:
        self.failed_trials.append(dict(attrs))
        return 0

    def has_study(self, storage: str, name: str) -> bool:
        return True

    def carry_trials(self, plan: SearchPlan) -> Carried:
        """What :attr:`carried` says (default: nothing carried), the plan kept in ``requests``."""
        self.requests.append(plan)
        assert plan.warm_start is not None
        return replace(self.carried, sweep=plan.warm_start.sweep)

    def train_many(self, request: MembersRequest) -> list[TrialRecord]:
        self.requests.append(request)
        members = replace(request.trials, console=None)    # this fake leaves the members' console silent
        return [self._trial(f"member{i:05d}", cfg, {"member": i}, request.connection.prepared, members,
                            request.connection.name) for i, cfg in enumerate(request.configs)]

    def train_workers(self, request: WorkersRequest) -> Metrics:
        self.requests.append(request)
        folder = request.folder
        link = FakeLink(folder.best, folder.last, request.on_metrics)
        result = _fit(request.fit, request.cfg, link, request.prepared)
        return {**result, "checkpoint": str(folder.best), "run_dir": str(folder.path), "workers": request.workers}

    def _trial(self, trial_id: str, cfg: JobConfig, params: Mapping[str, object], prepared: Path,
               trials: TrialRun, tune_run: str) -> TrialRecord:
        tracking, fit, downloads, console = trials.tracking, trials.fit, trials.downloads, trials.console
        tracker = tracking.tracker
        tags = {"sweep": tracking.sweep, "trial_id": trial_id, TUNE_RUN_TAG: tune_run}
        if "member" in params and int(params["member"]) < len(tracking.member_names):   # as the platform tags it
            tags["member"] = tracking.member_names[int(params["member"])]
        run = tracker.start_run(tracking.experiment, f"{tracking.sweep}-{trial_id}", tags=tags,
                                parent_run_id=tracking.parent_run_id)
        if console is not None:
            console.trial_started(trial_id, params)
        best = downloads / f"{trial_id}.pt"

        def checked(metrics: Metrics) -> None:
            run.log_metrics(metrics, step=int(metrics.get("step", 0)))
            if console is not None:
                console.trial_checked(trial_id, metrics)

        started = time.monotonic()
        try:
            result = _fit(fit, cfg, FakeLink(best, on_metrics=checked), prepared)
        except Exception as err:  # noqa: BLE001 - a failed trial is a record, as on the cluster
            run.end("FAILED")
            if console is not None:
                console.trial_ended(trial_id, "error", str(err))
            return TrialRecord(trial_id=trial_id, config=cfg, params=dict(params), mlflow_run_id=run.run_id,
                               status="ERROR", error=str(err))
        run.set_tags({"checkpoint": str(best)})
        run.end("FINISHED")
        if console is not None:
            console.trial_ended(trial_id, str(result.get("stop_reason", "")))
        return TrialRecord(trial_id=trial_id, config=cfg, params=dict(params),
                           best_valid_acc=float(result["best_valid_acc"]),
                           checkpoint=str(best) if best.exists() else None, mlflow_run_id=run.run_id,
                           checks=int(result.get("checks", 0)), steps=int(result.get("steps", 0)),
                           stop_reason=str(result.get("stop_reason", "")),
                           seconds=round(time.monotonic() - started, 1))


def _fit(fit: WorkerFit, cfg: JobConfig, link: FakeLink, prepared: Path) -> Metrics:
    """The job's loop on ``link`` over the whole prepared folder, as a one-worker trial runs it."""
    from iaa.data.loading.loader import PreparedData
    from iaa.data.prepared.manifest import vocab_card

    data = PreparedData.open(Path(prepared))
    return fit(cfg, link, WorkerData(vocab_hash=data.manifest.vocab_hash, train=data.table("train"),
                                     valid=data.table("valid"), vocab=vocab_card(Path(prepared))), threads=1)


def sweep_plan(workdir: Path, name: str = "demo-iaa-abc123", **changes: object):
    """A settled sweep of the demo preset's space, made without data or stores (``changes``: any
    of its fields)."""
    from iaa.jobs.config import search_space
    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.jobs.sweeps.record import Study
    from iaa.jobs.tune.settle import SweepPlan

    base, preset = JobConfig(), TUNE_PRESETS["demo"]
    plan = SweepPlan(name=name, dataset="demo", prepared=workdir / "data" / "demo", data=None, workdir=workdir,
                     folder=workdir / "sweeps" / name, storage=str(workdir / "ray"), storage_path=None, base=base,
                     train_epochs=base.train.max_epochs, space=search_space.parse(preset.space, base), preset=preset,
                     num_samples=preset.num_samples, sampler="tpe", study=Study(f"sqlite:///{workdir}/optuna.db", name),
                     tracking_uri=f"sqlite:///{workdir}/mlflow.db", recorded=None)
    return replace(plan, **changes)


def fake_sweeper(tiny: Path, tmp_path: Path, tracker: FakeTracker, launcher: FakeLauncher, **defaults: object):
    """``sweep(name, **more)``: the sweep job on ``tracker`` and ``launcher`` over the tiny data
    and space (a TuneRequest of ``defaults`` and ``more``), in ``tmp_path / "work"``."""
    from _platform import TINY_SPACE
    from _tiny import TINY_SETS
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")

    def sweep(name: str, **more: object) -> tune.TuneResult:
        req = tune.TuneRequest(**{"dataset": "cbt-ne", "data": tiny, "num_samples": 2, "search_space": space,
                                  "sets": TINY_SETS, "workdir": tmp_path / "work", "name": name,
                                  "show_progress": False, **defaults, **more})
        return tune.run(req, lambda uri: tracker, launcher)
    return sweep


def tune_on(monkeypatch, tracker: FakeTracker, launcher: FakeLauncher) -> None:
    """``iaa-cli tune`` in this process runs on ``tracker`` and ``launcher`` (``monkeypatch`` undoes it)."""
    from iaa import cli

    monkeypatch.setattr(cli.tuning, "open_tracker", lambda uri: tracker)
    monkeypatch.setattr(cli.tuning, "ray_launcher", lambda address, storage_path: launcher)


def train_on(monkeypatch, tracker: FakeTracker) -> FakeTracker:
    """``iaa-cli train`` in this process tracks in ``tracker`` (``monkeypatch`` undoes it)."""
    from iaa import cli

    monkeypatch.setattr(cli.training, "open_tracker", lambda uri: tracker)
    return tracker


class FakeTrainWorkflow:
    """A :class:`~iaa.jobs.ports.TrainWorkflow` that trains each run it is given in this process,
    untracked (:func:`iaa.jobs.train.train.run`), and keeps the runs in ``runs``."""

    def __init__(self) -> None:
        self.runs: list[TrainRun] = []

    def __call__(self, run: TrainRun):
        from iaa.jobs.train import train

        self.runs.append(run)
        return train.run(run.cfg, run.prepared, run.run_dir, resume=run.resume, show_progress=False,
                         train_rows=run.train_rows)
