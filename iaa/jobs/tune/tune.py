"""``iaa-cli tune``: a hyperparameter sweep with early stopping, tracked run by run.

A sweep is one run of the :class:`~iaa.jobs.ports.Launcher` named ``NAME`` (``--name``; default
``DATASET-MODEL-<id>`` with a short random id, so sweeps never share a folder). With the Ray
adapter (:class:`iaa.platform.sweeps.launch.RayLauncher`):

- **search** (:data:`~iaa.jobs.config.presets.TUNE_PRESETS`, :mod:`~iaa.platform.sweeps.search_algorithm`): an
  Optuna sampler (:data:`~iaa.jobs.config.presets.SAMPLERS`; TPE by default) over the paper's
  grid, a per-dataset preset, or ``--search-space FILE.yaml``, learning from each trial's best
  check; ASHA stops trials;
- **resources and start**: trials sized to the cluster, checkpoints under ``STORAGE/NAME``;
- **tracking** (the :class:`~iaa.jobs.ports.Tracker`): one parent run per sweep and one child
  run per trial, all from the driver;
- **outputs**: ``WORKDIR/sweeps/NAME/sweep.json`` (:mod:`iaa.jobs.sweeps.record`: every trial's config,
  best accuracy, checkpoint file, MLflow run, status), ``best_config.yaml`` (for
  ``iaa-cli train --config``), and a table of the best trials on stderr;
- **resume**: ``--resume NAME`` (or ``--resume`` with ``--name``; alone, the latest sweep of
  the dataset and model) restores the Tune run: finished trials are kept, unfinished ones
  continue from their last checkpoint, and the Optuna study comes back with the searcher.

A name that exists already is refused, never overwritten.

:func:`run` goes through the phases, one module each: :mod:`~iaa.jobs.tune.settle` (the request,
data, config, space, name and store, before any cluster), :mod:`~iaa.jobs.tune.estimate` (the
cost probe the console shows), :mod:`~iaa.jobs.tune.parent_run` (the sweep's parent run and
``sweep.json``), :mod:`~iaa.jobs.tune.best` (every trial's model, the best one's config and
explain page) and :mod:`~iaa.jobs.tune.next_steps` (the commands to run next).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

from iaa.errors import IaaError
from iaa.files import DiskFullError
from iaa.jobs.config.presets import TUNE_PRESETS, max_checks
from iaa.jobs import interrupt
from iaa.jobs.ports import (ConnectRequest, Launcher, Placement, SearchPlan, SweepRequest, TrackedRun, Tracker,
                            TrialRun, TrialTracking)
from iaa.jobs.tune import stops
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.sweeps.console import SweepConsole
from iaa.jobs.tune.best import EXPLAIN_EXAMPLES, best_outputs, finish, finished_result, write_best_config
from iaa.jobs.tune.estimate import estimate_cost
from iaa.jobs.tune.next_steps import next_commands
from iaa.jobs.tune.parent_run import close_lost_runs, start_sweep, run_columns, sweep_params
from iaa.jobs.tune.request import SweepInterrupted, TuneRequest
from iaa.jobs.tune.settle import (settle, Settled, asha_notes, asha_preset, base_config,
                                  searched_overrides, study_storage, sweep_name, training_epochs, with_dataset)

_log = logging.getLogger(__name__)

# The phases live in their own modules; their names stay importable from here.
__all__ = ["EXPLAIN_EXAMPLES", "TUNE_PRESETS", "SweepInterrupted", "TuneRequest", "asha_notes", "asha_preset",
           "base_config", "next_commands", "run", "run_columns", "searched_overrides", "study_storage", "sweep_name",
           "sweep_params", "training_epochs", "with_dataset", "write_best_config", "best_outputs", "close_lost_runs",
           "estimate_cost", "finish", "settle", "start_sweep", "Settled"]


def run(req: TuneRequest, open_tracker: Callable[[str], Tracker], launcher: Launcher) -> dict[str, Any]:
    """Run (or with ``req.resume`` continue) a sweep, tracked in ``open_tracker(uri)``.

    Returns ``{"sweep", "tracking_uri", "experiment", "best_config", "best_valid_acc"}`` plus the
    best trial, its checkpoint, the number of trials and the ``sweep.json`` path. A resumed sweep
    with nothing left to run (:func:`iaa.jobs.sweeps.record.finished`) returns its recorded
    result (``nothing_left``) at once: no cluster starts and its folder is not written. Raises
    :class:`SweepInterrupted` when the sweep stopped with unfinished trials (after recording
    them), and :class:`iaa.jobs.interrupt.Interrupted` on SIGINT or SIGTERM (its runs KILLED, its
    unfinished Optuna trials FAIL: :mod:`iaa.jobs.tune.stops`).
    """
    req = with_dataset(req)
    s = settle(req, open_tracker, launcher)
    if s.recorded is not None and s.recorded.finished:
        _log.info(stops.nothing_left_line(s.recorded, s.folder))
        return finished_result(s.recorded, s.folder, s.prepared, s.tracker.ui_command)
    with interrupt.stoppable(stops.resume_command(req, s.name)) as stop:
        return _run(req, s, launcher, stop)


def _run(req: TuneRequest, s: Settled, launcher: Launcher, stop: interrupt.Stop) -> dict[str, Any]:
    tracker = s.tracker
    launch = launcher.connect(ConnectRequest(
        name=s.name, prepared=s.prepared, storage=s.storage, num_trials=s.num_samples,
        workers_per_trial=req.workers_per_trial, gpus_per_worker=req.gpus_per_worker,
        threads=s.base.train.threads or None, max_concurrent=req.max_concurrent, show_progress=req.show_progress))
    interrupt.rearm()                       # the cluster's start may have taken SIGTERM
    plan = _search_plan(req, s, launch)
    for note in asha_notes(plan.checks, s.preset):
        _log.warning(note)
    sweep, parent, console = _open_sweep(req, s, launcher, launch, plan)
    experiment = sweep.experiment or f"tune-{req.dataset}"
    stop.on_stop(stops.on_stop(tracker, launcher, experiment, s.name, plan))
    stop.kept = lambda: stops.kept(tracker, experiment, s.name, parent.run_id, s.folder)
    trials = TrialTracking(tracker=tracker, experiment=experiment, parent_run_id=parent.run_id,
                           sweep=s.name, dataset=req.dataset, data_dir=s.prepared)
    started = time.time()
    from iaa.jobs.training.loop import fit_on_worker

    try:
        run_trials = TrialRun(fit=fit_on_worker, tracking=trials, downloads=s.folder / "checkpoints", console=console,
                              verbose=req.verbose)
        records = launcher.sweep(SweepRequest(placement=launch, plan=plan, trials=run_trials,
                                              resume=s.recorded is not None, show_progress=req.show_progress))
    except KeyboardInterrupt:
        raise                                # the stop marks every run of the sweep (stops.on_stop)
    except DiskFullError as err:             # the trials are stopped: mark the runs and trials
        raise stops.stopped_by_full_disk(tracker, launcher, experiment, s.name, plan, err,
                                         stops.resume_command(req, s.name)) from None
    except BaseException:
        parent.end("FAILED")
        raise
    sweep = sweep.with_run(records, time.time() - started)
    if console is not None:
        _log.info(console.summary(time.time() - started))
    sweep_file.write(s.folder / "sweep.json", sweep)
    if s.recorded is not None:
        close_lost_runs(tracker, parent, experiment, {r.mlflow_run_id for r in sweep.trials})
    return finish(sweep, s.folder, parent, s.space, s.prepared, tracker, req.register, req,
                   training_epochs(req, s.prepared))


def _search_plan(req: TuneRequest, s: Settled, launch: Placement) -> SearchPlan:
    """What the launcher searches: the space, the checks per trial (``max_t``), the Optuna study
    and its sampler.

    A resumed sweep keeps the study storage and name it recorded (and its sampler:
    :func:`~iaa.jobs.tune.settle.settle`); a fresh one gets the request's storage and the sweep's name.
    """
    study = s.recorded.optuna if s.recorded is not None else None
    return SearchPlan(base=s.base, space=s.space, preset=s.preset, seed=req.seed, num_samples=s.num_samples,
                      max_t=max_checks(s.base, s.space, launch.train_rows, req.workers_per_trial),
                      study_storage=study.storage if study else study_storage(req),
                      study_name=study.study if study else s.name, sampler=s.sampler)


def _open_sweep(req: TuneRequest, s: Settled, launcher: Launcher, launch: Placement,
                plan: SearchPlan) -> tuple[SweepRecord, TrackedRun, SweepConsole | None]:
    """The sweep's record, its parent run and its console (None without ``req.show_progress``).

    A resumed sweep reopens its recorded parent run after closing what its last process left
    (:class:`IaaError` when the launcher has no Tune run to resume); a fresh one claims its
    storage and folder and starts a parent run.
    """
    console = None
    if s.recorded is not None:
        if not launcher.can_resume(launch):
            raise IaaError(f"no Tune run to resume at {launch.experiment_path}; run the sweep without `resume`")
        sweep = replace(s.recorded, sampler=s.sampler)     # a record older than samplers names its own
        stops.close_leftovers(s.tracker, launcher, sweep, plan)
        assert sweep.parent_run_id is not None            # read_resumable: required
        parent = s.tracker.reopen_run(sweep.parent_run_id)
        if req.show_progress:
            console = _resumed_console(launch, s, plan, sweep)
    else:
        launcher.claim(s.storage, s.name, s.folder)
        if req.show_progress:
            console = SweepConsole(estimate_cost(launch, s, plan.checks), list(s.space.params))
        sweep, parent = start_sweep(req, launch, plan, s.tracker)
    return sweep, parent, console


def _resumed_console(launch: Placement, s: Settled, plan: SearchPlan, sweep: SweepRecord) -> SweepConsole:
    """A resumed sweep's console, as a fresh one's: what is kept and left, the cost of what is left."""
    _log.info(stops.resumed_line(s.tracker, sweep, s.num_samples) + f" ({launch.experiment_path})")
    finished, _ = stops.standing(s.tracker, sweep.experiment or "", s.name, sweep.parent_run_id)
    left = replace(s, num_samples=max(s.num_samples - finished, 1))
    return SweepConsole(estimate_cost(launch, left, plan.checks), list(s.space.params))
