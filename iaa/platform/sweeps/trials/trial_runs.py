"""Every trial's child run, kept by a Tune callback in the driver through the jobs' Tracker.

Only the driver talks to the tracking store, so the default SQLite store works on multi-node
clusters too. Tune pickles its callbacks into the run (``tuner.pkl``) and brings them back on
``--resume``, also in a copy of the work folder; so :class:`TrialRuns` holds only its Tune run's
name and finds the store through :mod:`~iaa.platform.sweeps.driver_side`, and a resumed trial
finds its child run again by its tags. Nothing reads the callback back after
a run: records come from the results and the store. The trials' events on the console are
:mod:`~iaa.platform.sweeps.trials.trial_events`'s.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import ray.tune as tune

from iaa.errors import brief
from iaa.files import disk_full
from iaa.jobs.config.job_config import config_label, to_dict
from iaa.jobs.config.presets import STOP_METRIC
from iaa.jobs.ports import (CHECKPOINT_FILE, TIME_BUDGET, TUNE_RUN_TAG, WORKER_LOST, RunRecord, TrackedRun, Tracker,
                            trial_name)
from iaa.platform.sweeps import driver_side
from iaa.platform.cluster.lost import worker_lost
from iaa.platform.sweeps.trials.lost_trials import last_error
from iaa.platform.sweeps.trials.trial import MEMBER_KEY, job_config
from iaa.platform.sweeps.trials.trial_events import stop_reason
# A saved Tune run (``tuner.pkl``) names each callback by the module it was found in; a sweep saved
# while this module held the console's callback names it here (see ``saved_state``).
from iaa.platform.sweeps.trials.trial_events import ConsoleCallback  # noqa: F401

_log = logging.getLogger(__name__)

NUMBER_TAG = "trial_number"  # a sweep trial's run: its number in the study when it started (its one name)
RESTORES_TAG = "restores"   # a trial's restores from its last checkpoint after a failure (a lost node)

# What a trial's child run records at every check.
TRIAL_METRICS = ("train_loss", "valid_acc", "valid_loss", "temperature", "best_valid_acc", "lr", "epoch",
                 "train_examples_per_s", "resident_mb")


def checkpoint_file(checkpoint_dir: str) -> str:
    """The state file inside a Ray checkpoint directory."""
    return f"{str(checkpoint_dir).rstrip('/')}/{CHECKPOINT_FILE}"


def trial_tags(sweep: str, trial_id: str) -> dict[str, str]:
    """The tags that find a trial's child run again."""
    return {"sweep": sweep, "trial_id": trial_id}


def run_name(sweep: str, trial_id: str, config: Mapping[str, Any], member_names: Sequence[str] = ()) -> str:
    """A sweep trial's run is named by its searched values (``lr=4e-3 T=2 h=64``); an ensemble
    member (``{"member": i}``) by the seed part of ``member_names[i]`` (``ENSEMBLE-seed-7`` ->
    ``seed-7``, ``ENSEMBLE-config1-seed-7`` -> ``config1-seed-7``): its run nests under the
    ensemble's, which names it, so its own name is short and differs from its siblings' at once."""
    if config and MEMBER_KEY in config and int(config[MEMBER_KEY]) < len(member_names):
        name = member_names[int(config[MEMBER_KEY])]
        seed = re.search(r"(config\d+-)?seed-\d+$", name)
        return seed.group(0) if seed else name
    if not config or MEMBER_KEY in config:
        return f"{sweep}-{trial_id}"
    return config_label(config)


def trial_run_name(name: str, sweep: str, trial_id: str, config: Mapping[str, Any],
                   member_names: Sequence[str] = ()) -> str:
    """A sweep trial's run name begins with its one name (``trial-0003 lr=4e-3 T=2 h=64``); a
    member's is its seed part (see :func:`run_name`)."""
    label = run_name(sweep, trial_id, config, member_names)
    return label if (config and MEMBER_KEY in config) else f"{name} {label}"


def identity_tags(cfg: Any, config: Mapping[str, Any], number: int, member_names: Sequence[str] = ()) -> dict[str, str]:
    """What names a trial's run at a glance: its ``seed`` (a runs-view column beside ``train.seed``);
    for a sweep's trial its ``trial_number`` (``0003``: its number in the sweep's Optuna study, else
    the fourth trial the sweep started; its one name is ``trial-0003``), and
    for an ensemble member its ``member`` name; its logged model is named by these."""
    tags = {"seed": str(cfg.train.seed)}
    if config and MEMBER_KEY in config:
        if int(config[MEMBER_KEY]) < len(member_names):
            tags["member"] = member_names[int(config[MEMBER_KEY])]
    else:
        tags[NUMBER_TAG] = f"{number:04d}"
    return tags


@dataclass(frozen=True)
class ChildRuns:
    """What the child runs of a sweep's trials say, by Tune trial id."""

    run_ids: dict[str, str] = field(default_factory=dict)
    checkpoints: dict[str, str] = field(default_factory=dict)   # the checkpoint directory a run's tag names
    names: dict[str, str] = field(default_factory=dict)         # a sweep trial's one name (``trial-0003``)


def child_runs(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None) -> ChildRuns:
    """The child run of every trial of ``sweep`` (the newest, where a trial has several), with the
    checkpoint directory and the trial number that its tags name."""
    found = ChildRuns()
    for run in reversed(tracker.find_runs(experiment, {"sweep": sweep})):   # oldest first: the newest wins
        trial_id = run.tags.get("trial_id")
        if trial_id and run.parent_run_id == parent_run_id:
            found.run_ids[trial_id] = run.run_id
            if run.tags.get("checkpoint"):
                found.checkpoints[trial_id] = run.tags["checkpoint"].removesuffix(f"/{CHECKPOINT_FILE}")
            if (number := tagged_number(run.tags)) is not None:
                found.names[trial_id] = trial_name(number)
    return found


def asked_number(side: driver_side.DriverSide, trial_id: str) -> int | None:
    """The number of the Optuna trial first asked for Tune trial ``trial_id`` (its user attribute
    ``tune_trial_id``; a trial revived on a resume carries it too), None without a stored study.
    A resumed sweep's trial that the stopped process asked for but never started has no run and
    was not asked in this process: the study still holds its number."""
    import optuna

    from iaa.platform.sweeps.studies.study_store import study_storage

    if not side.study_storage or not side.study_name:
        return None
    try:
        study = optuna.load_study(study_name=side.study_name, storage=study_storage(side.study_storage))
    except KeyError:                                                           # no such study
        return None
    asked = [t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get("tune_trial_id") == trial_id]
    return min(asked, default=None)


def tagged_number(tags: Mapping[str, str]) -> int | None:
    """A sweep trial's number in its study, as its run's tag names it (None: no such tag)."""
    value = tags.get(NUMBER_TAG, "")
    return int(value) if value.isdigit() else None


class TrialRuns(tune.Callback):
    """Gives every trial its MLflow child run and logs its checks; tags its best checkpoint.

    It keeps only the name of its Tune run (``sweep``): the store, the parent run and what the
    trials share come from what the running process bound to that name
    (:mod:`~iaa.platform.sweeps.driver_side`), so a restored callback writes where it runs now.
    """

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self.best: dict[str, str] = {}       # trial id -> best checkpoint directory
        self._runs: dict[str, TrackedRun] = {}
        self._reported: set[str] = set()     # trials that reported in this process
        self._restores: dict[str, int] = {}  # trial id -> restores from its last checkpoint (a node died, ...)
        self._ended: set[str] = set()        # trials whose end this process heard of
        self._live: set[str] = set()         # trials this process saw unfinished, up to the last step
        self._logged: dict[str, set[int]] = {}   # trial id -> the steps whose checks its run holds

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "best": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sweep"])        # older saves held the stores too: they are not used

    @property
    def side(self) -> driver_side.DriverSide:
        return driver_side.of(self.sweep)

    @property
    def tracker(self) -> Tracker:
        return self.side.tracker

    def _run(self, trial: Any) -> TrackedRun:
        """The trial's child run: open here, found by its tags, or created with the trial's config."""
        if trial.trial_id in self._runs:
            return self._runs[trial.trial_id]
        side = self.side
        found = None if trial.trial_id in side.run_ids else self._find(trial.trial_id)
        cut_off = side.again.get(trial.trial_id)
        if found is None and cut_off is not None and trial.trial_id not in side.run_ids:
            found = self._find(cut_off)          # the run of the trial it runs again: its name, one run
        run_id = side.run_ids.get(trial.trial_id) or (found.run_id if found else None)
        number = tagged_number(found.tags) if found is not None else None      # a resumed trial keeps its number
        earlier = found.tags.get(RESTORES_TAG, "") if found is not None else ""
        if earlier.isdigit() and int(earlier):                                 # ... and counts on from its restores
            self._restores[trial.trial_id] = self._restores.get(trial.trial_id, 0) + int(earlier)
        if number is None:                        # the study's: asked here, or by the process a resume continues
            number = side.numbers.get(trial.trial_id)
        if number is None:
            number = asked_number(side, trial.trial_id)
        if number is None:                                                     # no study: the start order
            number = len(side.run_ids)
        if run_id is None:
            cfg = job_config(side.spec, trial.config)
            names = side.member_names
            name = trial_name(number)
            run = side.tracker.start_run(side.experiment,
                                         trial_run_name(name, self.sweep, trial.trial_id, trial.config, names),
                                         tags={**trial_tags(side.sweep or self.sweep, trial.trial_id),
                                               TUNE_RUN_TAG: self.sweep, "dataset": side.dataset,
                                               "model": cfg.model.kind,
                                               **identity_tags(cfg, trial.config, number, names)},
                                         parent_run_id=side.parent_run_id)
            run.log_params(to_dict(cfg))
            if side.data_dir is not None:
                run.log_dataset(side.data_dir)
        else:
            run = side.tracker.attach(run_id)
            if found is not None and found.tags.get("trial_id") != trial.trial_id:
                run.set_tags({"trial_id": trial.trial_id})      # a resume finds it by its new trial
            self._logged[trial.trial_id] = {p.step for p in side.tracker.metric_history(run.run_id, STOP_METRIC)}
        side.run_ids[trial.trial_id] = run.run_id
        side.names[trial.trial_id] = (run_name(self.sweep, trial.trial_id, trial.config, side.member_names)
                                      if trial.config and MEMBER_KEY in trial.config else trial_name(number))
        self._runs[trial.trial_id] = run
        return run

    def _find(self, trial_id: str) -> RunRecord | None:
        """The trial's run that an earlier process of the sweep started (a resumed sweep), if any."""
        side = self.side
        runs = [r for r in side.tracker.find_runs(side.experiment, trial_tags(side.sweep or self.sweep, trial_id))
                if r.parent_run_id == side.parent_run_id]
        return runs[0] if runs else None

    def _track(self, what: str, trial: Any, action: Any) -> None:
        """Run ``action``; a failing store costs the trial its tracking, never its training. A full
        disk under the store is noted for the run instead, which then stops (:meth:`on_step_end`)."""
        try:
            action()
        except self.tracker.transient_errors as err:
            if disk_full(err):
                self.side.note_full(self.tracker.full(f"{what} for trial {trial.trial_id}"))
                return
            _log.warning(f"tracking at {self.tracker.uri}: could not {what} for trial {trial.trial_id} ({brief(err)})")
        run = self._runs.get(trial.trial_id)
        if run is not None and run.full is not None:      # a write the run kept to retry (its metrics)
            self.side.note_full(run.full)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """A full disk was met (a trial's checkpoint, the study, a run): the Tune loop ends here, and
        Tune stops the trials' actors on its way out (:mod:`~iaa.platform.sweeps.trials.full_disk`). Once
        the sweep's time budget is spent, the trials it stopped end their runs here."""
        if not driver_side.is_bound(self.sweep):
            return
        if self.side.full:
            raise self.side.full[0]
        if self.side.budget.ended:
            self._end_cut(trials)
        self._live.update(t.trial_id for t in trials if t.status not in ("TERMINATED", "ERROR"))

    def _end_cut(self, trials: list[Any]) -> None:
        """The trials Tune stopped once the budget was spent, telling no callback: TERMINATED now,
        unheard, and unfinished at the last step, started in this process, or without a check
        (made and stopped within the step). Each is noted with its last result, and its run, if
        it has one, ends FINISHED: with the stop reason ``TIME_BUDGET``, or its own when its last
        result had just named one."""
        for trial in trials:
            if trial.status != "TERMINATED" or trial.trial_id in self._ended:
                continue
            last = dict(trial.last_result or {})
            if trial.trial_id not in self._live and trial.trial_id not in self._runs and "checks" in last:
                continue                       # it ended before this process: Tune told an earlier one
            self.side.budget.untold[trial.trial_id] = last
            if trial.trial_id in self._runs:
                self._end(trial, "FINISHED", last.get("stop_reason") or TIME_BUDGET)
            self._ended.add(trial.trial_id)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        def start() -> None:
            run = self._run(trial)
            if run.status() == "FINISHED":
                # A sweep killed between a trial's last report and Tune's next saved state resumes
                # that trial from its final checkpoint: it stops at once. Leave its run be, and
                # the console silent (``DriverSide.finished_before``).
                self.side.finished_before.add(trial.trial_id)
            else:
                run.mark_running()
        self._track("open the child run", trial, start)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        first = trial.trial_id not in self._reported
        self._reported.add(trial.trial_id)
        metrics = {k: result[k] for k in TRIAL_METRICS if k in result}
        self._track("log metrics", trial, lambda: self._log_check(trial, metrics, int(result.get("step", 0))))
        if first and result.get("precision"):          # what the trial multiplied in, decided where it ran
            self._track("tag its precision", trial,
                        lambda: self._run(trial).set_tags({"precision": str(result["precision"])}))
        path = result.get("checkpoint_path")      # multi-worker trials: the Train run's checkpoint
        if path and result.get("is_best"):
            self.best[trial.trial_id] = str(path)

    def _log_check(self, trial: Any, metrics: Mapping[str, Any], step: int) -> None:
        """Log a check's metrics at ``step``, once: a trial restored from a checkpoint older than its
        last check (a stop just after that check, before Tune saved the sweep; a lost node) makes
        that check again, with the same values, which its run already holds."""
        run = self._run(trial)
        logged = self._logged.setdefault(trial.trial_id, set())
        if step in logged and STOP_METRIC in metrics:
            return
        run.log_metrics(metrics, step=step)
        if STOP_METRIC in metrics:
            logged.add(step)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """The trial failed and Tune restarts it from its last checkpoint: its run counts the restores
        (tag ``restores``; every trial that reported in this process ends with the tag, 0 or more)."""
        self._restores[trial.trial_id] = self._restores.get(trial.trial_id, 0) + 1

        def count() -> None:
            self._run(trial).set_tags({RESTORES_TAG: str(self._restores[trial.trial_id])})
        self._track("count the restore", trial, count)

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        if (trial.last_result or {}).get("is_best") and checkpoint is not None:
            self.best[trial.trial_id] = str(checkpoint.path)

    def _end(self, trial: Any, status: str, reason: str = "") -> None:
        self._ended.add(trial.trial_id)
        if trial.trial_id in self.side.finished_before and trial.trial_id not in self._reported:
            return

        def end() -> None:
            run = self._run(trial)
            tags = {"stop_reason": reason or stop_reason(trial.last_result)} if status == "FINISHED" or reason else {}
            if trial.trial_id in self._restores or trial.trial_id in self._reported:
                tags[RESTORES_TAG] = str(self._restores.get(trial.trial_id, 0))
            if trial.trial_id in self.best:
                tags["checkpoint"] = checkpoint_file(self.best[trial.trial_id])
            run.set_tags(tags)
            run.end(status)
        self._track(f"mark the child run {status}", trial, end)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED", WORKER_LOST if worker_lost(last_error(trial)) else "")
