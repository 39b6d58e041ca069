"""The jobs' Launcher on Ray: Tune runs of the trial function, and Train runs of one job.

:class:`RayLauncher` implements :class:`iaa.jobs.ports.Launcher`. :func:`connect` builds one
frozen :class:`~iaa.platform.sweeps.tune_run.Launch`: the Ray cluster it joined, what each trial holds there
(:func:`iaa.platform.cluster.connect.plan`, so that trial drivers never hold the CPUs their workers
need) and where checkpoints go (``STORAGE/NAME``; ``STORAGE`` from
:meth:`iaa.jobs.workdir.paths.Workdir.storage`). A sweep (:mod:`iaa.jobs.tune.tune`) and an ensemble's
members (:meth:`RayLauncher.train_many`) both start from it, and both run as one Tune run
(:mod:`~iaa.platform.sweeps.tune_run`).

Run names are never reused: a folder that exists under the storage path belongs to another run
and is refused (:func:`claim`), never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray.tune as tune
from ray.tune.search import ConcurrencyLimiter, SearchGenerator

from iaa.errors import IaaError, printable
from iaa.files import DiskFullError, is_remote_uri
from iaa.data.prepared.manifest import vocab_card
from iaa.jobs.config.job_config import JobConfig, to_dict
from iaa.jobs.config.presets import MODE, SEARCH_METRIC
from iaa.jobs.ports import (Carried, ConnectRequest, MembersRequest, Metrics, Placement, SearchPlan,
                            SweepRequest, TIME_BUDGET, TrialRecord, WorkerFit, WorkersRequest)
from iaa.platform.cluster import connect as cluster
from iaa.platform.cluster.ray_internals import relocate_experiment
from iaa.platform.sweeps import driver_side
from iaa.platform.sweeps.budget import SweepClock
from iaa.platform.sweeps.search import search_algorithm as search
from iaa.platform.sweeps.trials.trial import MEMBER_KEY, TrialSpec, records, run_trial
from iaa.platform.sweeps.trials.standing import StandingCallback
from iaa.platform.sweeps.trials.trial_events import ConsoleCallback
from iaa.platform.sweeps.trials.trial_runs import TrialRuns, child_runs
from iaa.platform.sweeps.tune_run import Launch, analysis, restore, run_tuner, tuner

_log = logging.getLogger(__name__)


def taken(storage: str, name: str) -> bool:
    """Whether ``STORAGE/NAME`` (a Tune run) or any ``STORAGE/NAME-train-*`` (its Train runs) exists."""
    if is_remote_uri(storage):
        import pyarrow.fs

        fs, root = pyarrow.fs.FileSystem.from_uri(storage)
        return fs.get_file_info(f"{root.rstrip('/')}/{name}").type != pyarrow.fs.FileType.NotFound
    return (Path(storage) / name).exists() or any(Path(storage).glob(f"{name}-train-*"))


def check_free(storage: str, name: str, folder: Path | None = None) -> None:
    """Refuse ``name`` when a run of that name exists under ``storage`` or ``folder`` exists."""
    if taken(storage, name) or (folder is not None and folder.exists()):
        where = storage if taken(storage, name) else folder
        raise IaaError(f"a run named {name!r} already exists ({where}): continue it with `resume` {name}, "
                       "or choose another `name` (nothing was deleted)")


def claim(storage: str, name: str, folder: Path) -> None:
    """Take ``name`` for a new run by creating ``folder``; refused when anything of that name exists."""
    check_free(storage, name, folder)
    try:
        folder.mkdir(parents=True, exist_ok=False)
    except FileExistsError as err:   # another process claimed it a moment ago
        raise IaaError(f"{folder} already exists: continue that run with `resume` {name}, or choose another "
                       "`name` (nothing was deleted)") from err


def connect(request: ConnectRequest, address: str | None, storage_path: str | None) -> Launch:
    """Join (or start) Ray and size the trials; see :func:`iaa.platform.cluster.connect.fit_trials`.

    ``storage_path`` is what the user gave (a multi-node cluster needs one); ``request.storage``
    where checkpoints go.
    """
    info, plan = cluster.fit_trials(cluster.connect(address, storage_path), request.workers_per_trial,
                                    threads=request.threads, gpus_per_worker=request.gpus_per_worker,
                                    max_concurrent=request.max_concurrent, num_trials=request.num_trials)
    if request.show_progress:
        _log.info(cluster.describe(info, plan))
    return Launch(name=request.name, storage=request.storage, prepared=Path(request.prepared), info=info, plan=plan)


def trial_spec(launch: Launch, fit: WorkerFit, *, base: JobConfig | None = None, fixed: Mapping[str, Any] | None = None,
               members: Sequence[JobConfig] = ()) -> TrialSpec:
    from iaa.data.prepared.manifest import read

    manifest = read(launch.prepared)
    return TrialSpec(name=launch.name, fit=fit, storage_path=launch.storage, workers=launch.plan.workers,
                     threads=launch.plan.threads, gpus_per_worker=launch.plan.gpus_per_worker,
                     worker_resources=dict(launch.plan.worker_resources),
                     base=to_dict(base) if base is not None else None, fixed=dict(fixed or {}),
                     members=tuple(to_dict(m) for m in members), vocab_hash=manifest.vocab_hash if manifest is not None else "",
                     vocab=vocab_card(launch.prepared), prepared=str(launch.prepared.resolve()))


def trainable(launch: Launch, spec: TrialSpec) -> tuple[Any, int]:
    """The trial function with its data and resources, and the number of training rows."""
    from iaa.data.loading.loader import PreparedData

    data = PreparedData.open(launch.prepared)
    train_rows = data.manifest.count("train")
    # one-worker trials share tables put once into the object store; Train workers read their own rows
    train, valid = (data.table("train"), data.table("valid")) if launch.plan.in_actor else (None, None)
    fn = tune.with_parameters(run_trial, spec=spec, train=train, valid=valid)
    return tune.with_resources(fn, dict(launch.plan.trial_resources)), train_rows


class ResumableSearch(SearchGenerator):
    """Tune's ``SearchGenerator`` over a sweep's searcher, whose restored run creates its new
    trials in the storage the sweep ``sweep`` runs with now (its ``DriverSide``), not in the one
    it was started with (:func:`iaa.platform.cluster.ray_internals.relocate_experiment`), up to
    the number of trials the resume asks for (``DriverSide.num_samples``: its record's, or a new
    ``num_samples``), not the number the run was saved with."""

    def __init__(self, searcher: Any, max_concurrent: int, sweep: str) -> None:
        super().__init__(ConcurrencyLimiter(searcher, max_concurrent=max_concurrent))
        self.sweep = sweep

    def set_state(self, state: dict[str, Any]) -> None:
        side = driver_side.of(self.sweep) if driver_side.is_bound(self.sweep) else None
        if side is not None and side.num_samples is not None:
            state = {**state, "total_samples": side.num_samples}   # get_state's count of the trials to create
        super().set_state(state)
        if side is not None:
            relocate_experiment(state.get("experiment"), side.spec.storage_path)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """The end of a trial reaches the sweep's searcher also when the concurrency limiter no
        longer counts it: a trial that failed (its worker lost) and that the resumed run ran again."""
        limiter = self.searcher
        if trial_id in limiter.live_trials:
            super().on_trial_complete(trial_id, result=result, error=error)
        else:
            limiter.searcher.on_trial_complete(trial_id, result=result, error=error)


def _saved_trials(request: SweepRequest, spec: TrialSpec, side: driver_side.DriverSide | None = None,
                  statuses: Mapping[str, str] | None = None) -> list[TrialRecord]:
    """The trials of ``request``'s Tune run as it last saved them, with ``statuses`` (Tune's live
    ones) over its saved ones. With the ``side`` of the running process, a checkpoint kept in a
    bucket is not fetched, and the trials' names and cuts are that process's."""
    run, trials = request.trials, request.trials.tracking
    launch = _launch_of(request.placement)
    if not tune.Tuner.can_restore(launch.experiment_path):
        return []
    analysis_ = analysis(launch.experiment_path)
    children = child_runs(trials.tracker, trials.experiment, trials.sweep, trials.parent_run_id)
    return records(tune.ResultGrid(analysis_), spec,
                   statuses={**{t.trial_id: t.status for t in analysis_.trials}, **(statuses or {})},
                   run_ids=children.run_ids, tagged=children.checkpoints,
                   downloads=run.downloads if side is None else None,
                   names={**children.names, **(side.names if side is not None else {})},
                   cut=side.budget.cut if side is not None else ())


def _tell_standing(request: SweepRequest, spec: TrialSpec, side: driver_side.DriverSide, live: Sequence[Any]) -> None:
    """Tell ``request.standing`` the running sweep's trials (:func:`_saved_trials`, with Tune's
    ``live`` trials' statuses). A full disk stops the run, as any of its writes does; any other
    failure is a warning, once, and the sweep goes on: its record is written when it ends."""
    assert request.standing is not None
    try:
        request.standing(_saved_trials(request, spec, side, statuses={t.trial_id: t.status for t in live}))
    except DiskFullError as err:
        side.note_full(err)
    except Exception as err:  # noqa: BLE001 - the trials run on; the record is whole at the end
        if spec.name not in _UNTOLD:
            _UNTOLD.add(spec.name)
            _log.warning(printable(f"sweep {request.trials.tracking.sweep}: its record is not kept up to date as "
                                   f"its trials run ({err}); it is written when the sweep ends"))


_UNTOLD: set[str] = set()        # the Tune runs whose standing could not be told (said once)


def _end_untold_trials(plan: SearchPlan, side: driver_side.DriverSide) -> None:
    """The Optuna trials of the trials that Tune stopped at the time budget without telling its
    searcher: one stopped where it stood is PRUNED at its last check, as ASHA's stops are (FAIL
    without one); one that had just reported its own end is COMPLETE with its best check, as the
    searcher would have told it."""
    if not plan.study_storage or not plan.study_name:
        return
    from iaa.platform.sweeps.studies.endings import end_untold

    ends = {t: (last.get(SEARCH_METRIC) if last.get("stop_reason") else None) for t, last in side.budget.untold.items()}
    end_untold(plan.study_storage, plan.study_name, ends, {"stopped_by": TIME_BUDGET})


@dataclass(frozen=True)
class RayPlacement(Placement):
    """A placement as :meth:`RayLauncher.connect` makes it: the job reads the placement and hands
    it back untouched; the launcher reads the cluster and trial plan it carries."""

    launch: Launch | None = None


def _launch_of(placement: Placement) -> Launch:
    if not isinstance(placement, RayPlacement) or placement.launch is None:
        raise TypeError(f"a placement made by RayLauncher.connect is needed, got {type(placement).__name__}")
    return placement.launch


class RayLauncher:
    """:class:`iaa.jobs.ports.Launcher` on the Ray cluster at ``address`` (default: a local one).

    ``storage_path`` is the user's ``--storage-path`` (checked against the cluster: several nodes
    need shared storage); ``callbacks`` are extra Tune callbacks for every sweep.
    """

    def __init__(self, address: str | None = None, storage_path: str | None = None,
                 callbacks: Sequence[Any] = ()) -> None:
        self.address, self.storage_path, self.callbacks = address, storage_path, list(callbacks)

    check_free = staticmethod(check_free)
    claim = staticmethod(claim)

    def connect(self, request: ConnectRequest) -> Placement:
        from iaa.data.prepared.manifest import counted

        launch = connect(request, self.address, self.storage_path)
        rows = counted(launch.prepared, "train")
        return RayPlacement(name=request.name, storage=request.storage, prepared=launch.prepared,
                            max_concurrent=launch.plan.max_concurrent, threads=launch.plan.threads,
                            gpus_per_worker=launch.plan.gpus_per_worker, train_rows=rows,
                            fits_now=launch.plan.fits_now, launch=launch)

    def can_resume(self, placement: Placement) -> bool:
        return bool(tune.Tuner.can_restore(placement.experiment_path))

    def sweep(self, request: SweepRequest) -> list[TrialRecord]:
        """Search ``request.plan`` (or continue the saved run); one record per trial, checkpoints
        fetched to ``request.trials.downloads``."""
        plan, run, trials = request.plan, request.trials, request.trials.tracking
        launch = _launch_of(request.placement)
        spec = trial_spec(launch, run.fit, base=plan.base, fixed=plan.space.fixed)
        fn, _ = trainable(launch, spec)
        side = driver_side.DriverSide(tracker=trials.tracker, experiment=trials.experiment,
                                      parent_run_id=trials.parent_run_id, dataset=trials.dataset, spec=spec,
                                      data_dir=trials.data_dir, console=run.console,
                                      study_storage=plan.study_storage, study_name=plan.study_name,
                                      num_samples=plan.num_samples,
                                      budget=driver_side.TimeBudget(total_s=plan.time_budget_s),
                                      standing=(lambda live: _tell_standing(request, spec, side, live))
                                      if request.standing is not None else None)
        with driver_side.bound(launch.name, side):
            if request.resume:
                tuner_ = restore(launch, fn)
            else:
                callbacks = [TrialRuns(launch.name), *self.callbacks, ConsoleCallback(launch.name),
                             StandingCallback(launch.name)]
                tuner_ = tuner(launch, fn, callbacks, show_progress=run.verbose,
                               search_alg=ResumableSearch(
                                   search.searcher(plan.space, plan.seed, launch.name, sampler=plan.sampler,
                                                   try_first=plan.try_first),
                                   launch.plan.max_concurrent, launch.name),
                               scheduler=search.scheduler(plan.preset, plan.max_t, launch.name), num_samples=plan.num_samples,
                               stop=SweepClock(launch.name))
            results, statuses = run_tuner(launch, tuner_, quiet=not run.verbose)
        if side.budget.ended:
            _end_untold_trials(plan, side)
        children = child_runs(trials.tracker, trials.experiment, trials.sweep, trials.parent_run_id)
        return records(results, spec, statuses=statuses, run_ids=children.run_ids, tagged=children.checkpoints,
                       downloads=run.downloads, names={**children.names, **side.names}, cut=side.budget.cut)

    def saved_trials(self, request: SweepRequest) -> list[TrialRecord]:
        """The trials of ``request``'s Tune run as it last saved its state (every few seconds), one
        record each: what a sweep stopped by a signal records. An unfinished trial keeps Tune's
        status (RUNNING, PENDING) and its best check so far; none for a run that saved nothing."""
        plan = request.plan
        spec = trial_spec(_launch_of(request.placement), request.trials.fit, base=plan.base, fixed=plan.space.fixed)
        return _saved_trials(request, spec)

    def fail_unfinished_trials(self, plan: SearchPlan, attrs: Mapping[str, str]) -> int:
        """The plan's study: every unfinished trial ends FAIL with ``attrs`` as user attributes."""
        if not plan.study_storage or not plan.study_name:
            return 0
        from iaa.platform.sweeps.studies.endings import fail_unfinished

        return fail_unfinished(plan.study_storage, plan.study_name, attrs)

    def has_study(self, storage: str, name: str) -> bool:
        """Whether study ``name`` is in the Optuna storage ``storage``; Ray is not started."""
        from iaa.platform.sweeps.studies.study_store import study_exists

        return study_exists(storage, name)

    def carry_trials(self, plan: SearchPlan) -> Carried:
        """The scored trials of ``plan.warm_start`` that lie in the plan's space, carried into the
        plan's study, made here; Ray is not started."""
        if plan.warm_start is None or not plan.study_storage or not plan.study_name:
            raise IaaError("a warm start needs an earlier sweep and the new sweep's study in a storage")
        from iaa.platform.sweeps.search.distinct_search import OBJECTIVE_NAME
        from iaa.platform.sweeps.studies.carried_trials import carry_into

        return carry_into(plan.warm_start, plan.study_storage, plan.study_name, search.to_optuna(plan.space),
                          "maximize" if MODE == "max" else "minimize", OBJECTIVE_NAME)

    def train_many(self, request: MembersRequest) -> list[TrialRecord]:
        """Train every config as a parallel Tune trial (no search, no early stopping).

        Each trial gets a child run under ``request.trials.tracking.parent_run_id``. Trials are placed
        as ``request.connection`` asks (its workers per trial, GPUs per worker and threads).
        ``request.trials.console`` hears every trial event; Ray Tune's own tables reach the terminal
        only when ``request.trials.verbose``. Returns one record per config, in input order;
        ``checkpoint`` is ``None`` (status ``ERROR``) when a trial failed before its first check.
        """
        configs, placing, run = request.configs, request.connection, request.trials
        trials = run.tracking
        if not configs:
            return []
        check_free(placing.storage, placing.name)
        launch = connect(placing, self.address, self.storage_path)
        if run.console is not None:
            run.console.placed(launch.plan.fits_now or launch.plan.max_concurrent)   # what runs at once today
        spec = trial_spec(launch, run.fit, members=configs)
        side = driver_side.DriverSide(tracker=trials.tracker, experiment=trials.experiment,
                                      parent_run_id=trials.parent_run_id, dataset=configs[0].dataset, spec=spec,
                                      data_dir=trials.data_dir or placing.prepared,
                                      member_names=tuple(trials.member_names), console=run.console,
                                      sweep=trials.sweep)
        fn, _ = trainable(launch, spec)
        grid = {MEMBER_KEY: tune.grid_search(list(range(len(configs))))}
        callbacks = [TrialRuns(launch.name), ConsoleCallback(launch.name)]
        with driver_side.bound(launch.name, side):
            results, statuses = run_tuner(launch, tuner(launch, fn, callbacks, show_progress=run.verbose,
                                                        param_space=grid), quiet=not run.verbose)
        children = child_runs(trials.tracker, trials.experiment, trials.sweep, trials.parent_run_id)
        found = records(results, spec, statuses=statuses, run_ids=children.run_ids, tagged=children.checkpoints,
                        downloads=run.downloads, names=side.names)
        by_member = {int(r.params[MEMBER_KEY]): r for r in found}
        return [by_member.get(i) or TrialRecord(trial_id="", config=cfg, status="ERROR")
                for i, cfg in enumerate(configs)]

    def train_workers(self, request: WorkersRequest) -> Metrics:
        from iaa.platform.train_workers import fit_workers

        return fit_workers(request, address=self.address, storage_path=self.storage_path)
