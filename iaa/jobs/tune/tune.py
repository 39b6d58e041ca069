"""``iaa-cli tune``: a hyperparameter sweep with early stopping, tracked run by run.

A sweep is one run of the :class:`~iaa.jobs.ports.Launcher` named ``NAME`` (``--name``; default
``DATASET-MODEL-<id>`` with a short random id, so sweeps never share a folder). With the Ray
adapter (:class:`iaa.platform.sweeps.launch.RayLauncher`):

- **search** (:data:`~iaa.jobs.config.presets.TUNE_PRESETS`, :mod:`~iaa.platform.sweeps.search.search_algorithm`): an
  Optuna sampler (:data:`~iaa.jobs.config.presets.SAMPLERS`; TPE by default) over the paper's
  grid, a per-dataset preset, or ``--search-space FILE.yaml``, learning from each trial's best
  check; ASHA stops trials;
- **resources and start**: trials sized to the cluster, checkpoints under ``STORAGE/NAME``;
- **tracking** (the :class:`~iaa.jobs.ports.Tracker`): one parent run per sweep and one child
  run per trial, all from the driver;
- **outputs**: ``WORKDIR/sweeps/NAME/sweep.json`` (:mod:`iaa.jobs.sweeps.record`: every trial's config,
  best accuracy, checkpoint file, MLflow run, status; kept as the trials run, so that a killed
  process leaves them and its time so far), ``best_config.yaml`` (for
  ``iaa-cli train --config``), and a table of the best trials on stderr;
- **resume**: ``--resume NAME`` (or ``--resume`` with ``--name``; alone, the latest sweep of
  the dataset and model) restores the Tune run: finished trials are kept, unfinished ones
  continue from their last checkpoint, and the Optuna study comes back with the searcher.

A name that exists already is refused, never overwritten.

:func:`run` goes through the phases, one module each: :mod:`~iaa.jobs.tune.settle` (the request
settled once into a :class:`~iaa.jobs.tune.settle.SweepPlan`: data, config, space, name and
stores, before any store or cluster; every later phase reads only the plan),
:mod:`~iaa.jobs.tune.estimate` (the cost probe the console shows), :mod:`~iaa.jobs.tune.parent_run` (the sweep's parent run and
``sweep.json``), :mod:`~iaa.jobs.tune.best` (every trial's model, the best one's config and
explain page) and :mod:`~iaa.jobs.tune.next_steps` (the commands to run next).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable, Sequence

from iaa.errors import IaaError, printable
from iaa.files import DiskFullError
from iaa.jobs import interrupt
from iaa.jobs.config.presets import TUNE_PRESETS, examples_per_check, max_checks
from iaa.jobs.ports import (ConnectRequest, Launcher, Placement, SearchPlan, SweepRequest, TrackedRun, Tracker,
                            TrialRecord, TrialRun, TrialTracking)
from iaa.jobs.sweeps import comparison
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.sweeps.console import SweepConsole
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.tune import stops, warm_start
from iaa.jobs.tune.best import TuneResult, best_outputs, finish, finished_result, write_best_config
from iaa.jobs.tune.estimate import estimate_cost
from iaa.jobs.tune.next_steps import next_commands
from iaa.jobs.tune.parent_run import close_lost_runs, resumed_tags, start_sweep, sweep_params
from iaa.jobs.tune.request import SweepInterrupted, TuneRequest
from iaa.jobs.tune.settle import (SweepPlan, asha_notes, asha_preset, early_comparison_notes, searched_overrides, settle,
                                  sweep_name)
from iaa.jobs.workdir import lock

_log = logging.getLogger(__name__)

# The phases live in their own modules; their names stay importable from here.
__all__ = ["TUNE_PRESETS", "SweepInterrupted", "SweepPlan", "TuneRequest", "TuneResult", "asha_notes", "asha_preset",
           "best_outputs", "next_commands", "run", "searched_overrides", "settle", "sweep_name", "sweep_params",
           "write_best_config"]


def run(plan: SweepPlan | TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> TuneResult:
    """Run (or with a resume continue) the sweep ``plan`` (a request is settled first), tracked in
    ``open_tracker(uri)``.

    Returns a :class:`~iaa.jobs.tune.best.TuneResult`: the sweep, its best trial, config,
    checkpoint and model, the number of trials and the ``sweep.json`` path. A resumed sweep with
    nothing left to run (:attr:`SweepPlan.nothing_left`) returns its recorded result
    (``nothing_left``) at once: no cluster starts and its folder is not written, and a
    ``num_samples`` or ``time_budget_s`` other than its record's is not used (a warning says so); one whose record was
    given more trials after it ran to its end is refused (:func:`stops.refuse_more_after_the_end`).
    Any other resume runs ``num_samples`` trials in all (its record's, unless the request gives
    another), which its record keeps. One process at a
    time runs a sweep: it holds the sweep's lock (``WORKDIR/sweeps/.NAME.lock``) throughout, and
    another is refused in one line naming its pid. Raises
    :class:`SweepInterrupted` when the sweep stopped with unfinished trials (after recording
    them), and :class:`iaa.jobs.interrupt.Interrupted` on SIGINT or SIGTERM (its runs KILLED, its
    unfinished Optuna trials FAIL: :mod:`iaa.jobs.tune.stops`).
    """
    if isinstance(plan, TuneRequest):
        plan = settle(plan)
    if plan.recorded is not None:               # the record first: a resume needs its study
        sweep_file.check_study(plan.recorded, plan.record_file, launcher.has_study)
    tracker = open_tracker(plan.tracking_uri)
    search_on = plan.command("tune", dataset=plan.dataset, warm_start=plan.name)   # a finished sweep's next
    if plan.recorded is not None and plan.nothing_left:
        if plan.num_samples != plan.recorded.num_samples:
            _log.warning(stops.more_refused(plan.recorded, f"`num_samples` {plan.num_samples}", search_on))
        if plan.time_budget_s is not None and plan.time_budget_s != plan.recorded.time_budget_s:
            _log.warning(stops.more_refused(plan.recorded, f"`time_budget_s` {duration(plan.time_budget_s)}",
                                            search_on))
        _log.info(stops.nothing_left_line(plan.recorded, plan.folder, search_on))
        with lock.held(lock.beside(plan.folder), busy=lambda pid: _running(plan, pid)):   # it may make what is missing
            return finished_result(plan, tracker)
    if plan.recorded is not None:
        stops.refuse_more_after_the_end(tracker, plan.recorded, plan.record_file, search_on)
    with lock.held(lock.beside(plan.folder), busy=lambda pid: _running(plan, pid)):
        if plan.recorded is None:
            launcher.check_free(plan.storage, plan.name, plan.folder)
        if plan.warm_start is not None and not launcher.has_study(plan.warm_start.study_storage,
                                                                  plan.warm_start.study_name):
            raise warm_start.no_study(plan.warm_start)
        with interrupt.stoppable(plan.resume_command) as stop:
            return _run(plan, tracker, launcher, stop)


def _running(plan: SweepPlan, pid: str) -> IaaError:
    """The error of a sweep that another process runs now (it holds the sweep's lock)."""
    if plan.recorded is None:
        return IaaError(f"a sweep named {plan.name} is running in another process (pid {pid}); give another "
                        "`sweep_name`")
    return IaaError(f"sweep {plan.name} is running in another process (pid {pid}); let it end, or stop it there, "
                    f"then continue it with: {plan.resume_command}")


def _run(plan: SweepPlan, tracker: Tracker, launcher: Launcher, stop: interrupt.Stop) -> TuneResult:
    launch = launcher.connect(ConnectRequest(
        name=plan.name, prepared=plan.prepared, storage=plan.storage, num_trials=plan.num_samples,
        workers_per_trial=plan.workers_per_trial, gpus_per_worker=plan.gpus_per_worker,
        threads=plan.base.train.threads or None, max_concurrent=plan.max_concurrent, show_progress=plan.show_progress))
    interrupt.rearm()                       # the cluster's start may have taken SIGTERM
    search = _search_plan(plan, launch)
    per_check = examples_per_check(search.base, plan.space, launch.train_rows, plan.workers_per_trial)
    for note in asha_notes(search.checks, plan.preset) or early_comparison_notes(
            plan.dataset, plan.preset.grace_period, per_check, search.base.train.max_epochs * launch.train_rows):
        _log.warning(note)
    sweep, parent, console = _open_sweep(plan, tracker, launcher, launch, search, per_check)
    stop.on_stop(stops.on_stop(tracker, launcher, plan.experiment, plan.name, search),
                 kept=lambda: stops.kept(tracker, plan.experiment, plan.name, parent.run_id, plan.folder,
                                         plan.num_samples))
    trials = TrialTracking(tracker=tracker, experiment=plan.experiment, parent_run_id=parent.run_id,
                           sweep=plan.name, dataset=plan.dataset, data_dir=plan.prepared)
    started = time.time()
    from iaa.jobs.training.loop import fit_on_worker

    run_trials = TrialRun(fit=fit_on_worker, tracking=trials, downloads=plan.folder / "checkpoints",
                          console=console, verbose=plan.verbose)
    request = SweepRequest(placement=launch, plan=search, trials=run_trials, resume=plan.recorded is not None,
                           show_progress=plan.show_progress, standing=_keep_record(plan, sweep, started))
    try:
        records = launcher.sweep(request)
    except KeyboardInterrupt:                # the stop marks every run of the sweep (stops.on_stop)
        _record_stop(plan, sweep, launcher, request, started)
        raise
    except DiskFullError as err:             # the trials are stopped: mark the runs and trials
        raise stops.stopped_by_full_disk(tracker, launcher, plan.experiment, plan.name, search, err,
                                         plan.resume_command) from None
    except BaseException:
        parent.end("FAILED")
        raise
    sweep = sweep.with_run(records, started, time.time() - started)
    if console is not None:
        _log.info(console.summary(time.time() - started))
        for note in comparison.ranked_poorly(console.first_comparison(search.preset.grace_period)):
            _log.warning(note)
    sweep_file.write(plan.record_file, sweep)
    if plan.recorded is not None:
        close_lost_runs(tracker, parent, plan.experiment, {r.mlflow_run_id for r in sweep.trials})
    return finish(plan, sweep, parent, tracker)


def _keep_record(plan: SweepPlan, sweep: SweepRecord, started: float) -> Callable[[Sequence[TrialRecord]], None]:
    """What keeps the record of the sweep, run from ``started``, as its trials stand: a process
    that is killed leaves its trials and its time so far, where a resume and ``report`` find them."""
    def keep(trials: Sequence[TrialRecord]) -> None:
        sweep_file.write(plan.record_file, sweep.with_run(trials, started, time.time() - started))
    return keep


def _record_stop(plan: SweepPlan, sweep: SweepRecord, launcher: Launcher, request: SweepRequest,
                 started: float) -> None:
    """The record of a sweep that a signal stopped: its trials as its run last saved them and the
    time it ran since ``started``, so that it is listed as interrupted with its trials and its
    time adds up over its resumes. A record that cannot be made is a warning: the resume needs
    only the one the sweep began with."""
    try:
        trials = launcher.saved_trials(request) or sweep.trials
        sweep_file.write(plan.record_file, sweep.with_run(trials, started, time.time() - started))
    except Exception as err:  # noqa: BLE001 - the stop goes on: its line and the marks matter more
        _log.warning(printable(f"sweep {plan.name}: its trials were not recorded at the stop ({err}); "
                               f"its resume continues it all the same"))


def _search_plan(plan: SweepPlan, launch: Placement) -> SearchPlan:
    """What the launcher searches: the space, the checks per trial (``max_t``), the Optuna study
    and its sampler. The base config's ``auto`` precision is decided here, once for the sweep,
    where this process can decide it for the trials' device
    (:func:`~iaa.jobs.modeling.precision_policy.resolved_once`)."""
    from iaa.jobs.modeling import precision_policy as precision

    base = precision.resolved_once(plan.base, gpus=plan.gpus_per_worker > 0)
    return SearchPlan(base=base, space=plan.space, preset=plan.preset, seed=plan.seed, num_samples=plan.num_samples,
                      max_t=max_checks(base, plan.space, launch.train_rows, plan.workers_per_trial),
                      study_storage=plan.study.storage, study_name=plan.study.study, sampler=plan.sampler,
                      time_budget_s=plan.time_budget_s, warm_start=plan.warm_start, try_first=plan.try_first)


def _open_sweep(plan: SweepPlan, tracker: Tracker, launcher: Launcher, launch: Placement, search: SearchPlan,
                per_check: int) -> tuple[SweepRecord, TrackedRun, SweepConsole | None]:
    """The sweep's record, its parent run and its console (None without ``plan.show_progress``).

    A resumed sweep reopens its recorded parent run after closing what its last process left
    (:class:`IaaError` when the launcher has no Tune run to resume); a fresh one claims its
    storage and folder, begins its study with the trials of ``plan.warm_start``, if any, and
    starts a parent run.
    """
    console = None
    if plan.recorded is not None:
        if not launcher.can_resume(launch):
            raise IaaError(f"no Tune run to resume at {launch.experiment_path}; run the sweep without `resume`")
        sweep = replace(plan.recorded, sampler=plan.sampler,   # a record older than samplers names its own
                        time_budget_s=plan.time_budget_s, num_samples=plan.num_samples, address=plan.address,
                        workers_per_trial=plan.workers_per_trial, gpus_per_worker=plan.gpus_per_worker,
                        register=plan.register)
        stops.close_leftovers(tracker, launcher, sweep, search)
        assert sweep.parent_run_id is not None               # read_resumable: required
        parent = tracker.reopen_run(sweep.parent_run_id)
        parent.set_tags(resumed_tags(plan.num_samples, plan.time_budget_s))
        if plan.show_progress:
            console = _resumed_console(plan, tracker, launch, search, sweep)
    else:
        launcher.claim(plan.storage, plan.name, plan.folder)
        carried = launcher.carry_trials(search) if search.warm_start is not None else None
        if plan.show_progress:
            console = SweepConsole(estimate_cost(launch, search, plan.prepared, per_check), list(plan.space.params))
        sweep, parent = start_sweep(plan, launch, search, tracker, carried)
    return sweep, parent, console


def _resumed_console(plan: SweepPlan, tracker: Tracker, launch: Placement, search: SearchPlan,
                     sweep: SweepRecord) -> SweepConsole:
    """A resumed sweep's console, as a fresh one's: what is kept and left, the cost of what is left."""
    _log.info(stops.resumed_line(tracker, sweep, plan.num_samples, plan.time_budget_s) + f" ({launch.experiment_path})")
    finished = stops.standing(tracker, plan.experiment, plan.name, sweep.parent_run_id, stops.lost_trials(sweep)).finished
    # what the earlier runs spent of the time budget is known once the launcher restores the sweep's
    # clock: the cost says nothing of the budget (the line above does)
    left = replace(search, num_samples=max(plan.num_samples - finished, 1), time_budget_s=None)
    return SweepConsole(estimate_cost(launch, left, plan.prepared), list(plan.space.params))
