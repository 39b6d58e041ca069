"""A sweep stopped and continued: what a stop marks, what it keeps, and a resume from the record.

- **stopped** (SIGINT, SIGTERM: :mod:`iaa.jobs.interrupt`): every run of the sweep still RUNNING
  (the parent and the trials' child runs) ends KILLED, tagged ``interrupted``; every unfinished
  trial of the Optuna study ends FAIL with the user attribute ``interrupted``;
- **left RUNNING by a process that was killed** (``kill -9``): ``--resume`` marks them the same
  way before it continues, tagged ``killed``;
- **resumed** with ``--resume NAME`` alone: the sweep's record (``sweep.json``) gives its data,
  base config, search space and budget; with or without ``--dataset``, a resume counts and stops
  trials with the number of trials and ASHA settings the sweep recorded, unless flags give them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

from iaa.errors import IaaError
from iaa.files import DiskFullError, UnwritableError
from iaa.jobs.config import search_space
from iaa.jobs.config.job_config import ConfigError, JobConfig, from_dict
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.ports import Launcher, SearchPlan, Tracker
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.tune.request import TuneRequest
from iaa.jobs.workdir.fields import RecordError

KILLED_BEFORE = "left RUNNING by a process that ended without closing it; marked when the sweep was resumed"


def resume_command(req: TuneRequest, name: str) -> Command:
    """The exact command that continues sweep ``name`` (the work folder named when not the default)."""
    return Command.of("tune", resume=name, **where(req.workdir, req.tracking_uri))


def end_running(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str, plan: SearchPlan | None,
                tag: Mapping[str, str]) -> int:
    """End KILLED every RUNNING run of ``sweep`` (tagged ``tag``) and FAIL the study's unfinished
    trials (user attributes ``tag``); returns the runs ended."""
    ended = 0
    for found in tracker.find_runs(experiment, {"sweep": sweep}, status="RUNNING"):
        run = tracker.attach(found.run_id)
        run.set_tags(tag)
        run.end("KILLED")
        ended += 1
    if plan is not None:
        launcher.fail_unfinished_trials(plan, tag)
    return ended


def on_stop(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str,
            plan: SearchPlan) -> Callable[[str], None]:
    """The mark a stopped sweep makes, given the signal's name."""
    return lambda signal_name: end_running(tracker, launcher, experiment, sweep, plan,
                                           {"interrupted": signal_name})


def stopped_by_full_disk(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str, plan: SearchPlan,
                         err: DiskFullError, resume: str) -> DiskFullError:
    """The one error of a sweep that a full disk stopped (its trials' actors are stopped already).

    Its unfinished Optuna trials end FAIL, then its runs still RUNNING end KILLED, each marked
    ``disk_full``, as far as the disk lets. Where the study cannot take it, the runs are left
    RUNNING too: the next command that opens the work folder, its process gone, marks both
    (KILLED and FAIL, ``killed``); the error says which."""
    tag = {"disk_full": str(err)[:500]}
    marked = True
    try:
        launcher.fail_unfinished_trials(plan, tag)
        for found in tracker.find_runs(experiment, {"sweep": sweep}, status="RUNNING"):
            run = tracker.attach(found.run_id)
            run.set_tags(tag)
            run.end("KILLED")
            if run.lost:                      # the store is full too: the rest would fail the same way
                marked = False
                break
    except UnwritableError:
        marked = False
    except tracker.transient_errors:
        marked = False
    done = ("its runs are KILLED and its unfinished Optuna trials FAIL" if marked else
            "what the full disk kept from being marked, the next command in this work folder marks KILLED and FAIL")
    return DiskFullError(f"{err}; sweep {sweep} stopped: {done}; free some space, then resume with: {resume}")


def close_leftovers(tracker: Tracker, launcher: Launcher, record: SweepRecord, plan: SearchPlan) -> int:
    """Before a resume: the runs and trials a killed process left RUNNING end KILLED and FAIL."""
    return end_running(tracker, launcher, record.experiment or "", record.name, plan, {"killed": KILLED_BEFORE})


def standing(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None) -> tuple[int, int]:
    """(finished, unfinished) trials of ``sweep`` by their child runs' status."""
    runs = [r for r in tracker.find_runs(experiment, {"sweep": sweep})
            if r.parent_run_id == parent_run_id and r.tags.get("trial_id")]
    latest: dict[str, str] = {}
    for run in reversed(runs):                              # oldest first: a trial's newest run wins
        latest[run.tags["trial_id"]] = run.status
    finished = sum(s in ("FINISHED", "FAILED") for s in latest.values())
    return finished, len(latest) - finished


def kept(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None, folder: Path) -> str:
    """What a stopped sweep keeps, in words."""
    finished, unfinished = standing(tracker, experiment, sweep, parent_run_id)
    return (f"sweep {sweep} kept {finished} finished trial(s) and the last checkpoints of {unfinished} unfinished "
            f"one(s) ({folder}; runs KILLED, unfinished Optuna trials FAIL)")


def resumed_line(tracker: Tracker, record: SweepRecord, num_samples: int) -> str:
    """What a resumed sweep keeps and what is left."""
    finished, unfinished = standing(tracker, record.experiment or "", record.name, record.parent_run_id)
    left = max(num_samples - finished, 0)
    return (f"resuming sweep {record.name}: {finished} of {num_samples} trials finished and kept; {left} left, "
            f"of which {unfinished} continue from their last checkpoint")


def nothing_left_line(record: SweepRecord, folder: Path) -> str:
    """A resumed sweep that has nothing left to run, in one line."""
    return (f"sweep {record.name}: nothing left to run: {len(record.trials)} of {record.num_samples} trials "
            f"finished; its results stand as recorded ({folder})")


def from_record(req: TuneRequest) -> TuneRequest:
    """``req`` (``--resume NAME`` without ``--dataset`` or ``--data``) with the data and budget its
    ``sweep.json`` records; flags given on the command line win."""
    if not req.name:
        raise IaaError("give `resume` NAME (or `dataset` / `data` to resume the latest sweep of a dataset)")
    path = sweep_file.sweep_file(Path(req.workdir), req.name)
    if not path.is_file():
        raise IaaError(f"no sweep {req.name!r} to resume: {path} is missing; run it without `resume`")
    record = sweep_file.read_resumable(path)
    data = Path(str(record.data_dir))
    if not data.is_absolute():
        data = Path(req.workdir) / data
    storage = str(record.storage).rstrip("/")
    suffix = f"/{req.name}"
    return replace(with_recorded_budget(req, record), dataset=record.dataset, data=data,
                   workers_per_trial=record.workers_per_trial or req.workers_per_trial,
                   storage_path=req.storage_path or (storage[: -len(suffix)] if storage.endswith(suffix) else None))


def with_recorded_budget(req: TuneRequest, record: SweepRecord) -> TuneRequest:
    """``req`` with the number of trials and the ASHA settings its sweep recorded, where the
    command line gives none: a resume counts and stops trials as the sweep did."""
    asha = record.asha
    return replace(req, num_samples=req.num_samples or record.num_samples,
                   grace_period=req.grace_period or (asha.grace_period if asha else None),
                   reduction_factor=req.reduction_factor or (asha.reduction_factor if asha else None))


def recorded_base(req: TuneRequest, record: SweepRecord | None, base: JobConfig,
                  path: Path | None = None) -> JobConfig:
    """The base config the sweep started with (``sweep.json``'s ``base``), unless the command
    line changes it (``--config``, ``--set``, ``--max-epochs``); one that is no longer a valid
    config is refused naming ``path`` (its ``sweep.json``) and the key."""
    if record is None or not record.base or req.config_file or req.sets or req.max_epochs:
        return base
    try:
        return from_dict(dict(record.base))
    except ConfigError as err:
        raise RecordError(f"{path}: base: {err}; write the file again with the command that made it") from None


def recorded_space(req: TuneRequest, record: SweepRecord | None, base: JobConfig,
                   space: search_space.SearchSpace, path: Path | None = None) -> search_space.SearchSpace:
    """The search space the sweep recorded, unless ``--search-space`` gives one; a recorded space
    that no longer parses is refused naming ``path`` (its ``sweep.json``) and ``search_space``."""
    if record is None or req.search_space is not None or not record.search_space:
        return space
    saved = record.search_space
    data: dict[str, Any] = dict(saved.get("fixed") or {})
    for name, p in (saved.get("params") or {}).items():
        data[name] = (list(p["choices"]) if p.get("choices") is not None
                      else {k: p[k] for k in ("low", "high", "log", "step") if p.get(k) is not None})
    try:
        return search_space.parse(data, base)
    except ConfigError as err:
        raise RecordError(f"{path}: search_space: {err}; write the file again with the command that made it") from None
