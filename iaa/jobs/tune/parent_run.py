"""The sweep's parent run: its params, its start with ``sweep.json``, and the child runs a killed
sweep left open.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.record import Asha, SweepRecord
from iaa.jobs.config.job_config import to_dict
from iaa.jobs.config import search_space
from iaa.jobs.ports import Carried, Placement, SearchPlan, TrackedRun, Tracker
from iaa.jobs.config.presets import SEARCH_METRIC, STOP_METRIC, UNINFORMED_SAMPLERS
from iaa.jobs.tune.settle import SweepPlan
from iaa.jobs.tune import try_first
from iaa.jobs.tune.warm_start import carried_line

_log = logging.getLogger(__name__)


def sweep_params(search: SearchPlan, workers_per_trial: int, launch: Placement) -> dict[str, Any]:
    """The parent run's params: what every trial shares (the config less the searched keys), the
    search space (``search.KEY``) and the sweep's settings (``tune.*``, the sampler among them)."""
    shared = to_dict(search.base)
    for key in search.space.params:
        head, _, leaf = key.rpartition(".")
        node = shared
        for part in head.split(".") if head else []:
            node = node.get(part, {})
        node.pop(leaf, None)
    return {**shared, **{f"search.{k}": p.describe() for k, p in search.space.params.items()},
            "tune.num_samples": search.num_samples, "tune.sampler": search.sampler,
            "tune.seed": search.seed, "tune.workers_per_trial": workers_per_trial,
            "tune.gpus_per_worker": launch.gpus_per_worker,
            "tune.grace_period": search.preset.grace_period, "tune.reduction_factor": search.preset.reduction_factor,
            "tune.max_checks": search.checks, "tune.asha_max_t": search.max_t,
            "tune.max_concurrent": launch.max_concurrent,
            "tune.study": search.study_name, "tune.study_storage": search.study_storage,
            **({"tune.warm_start": search.warm_start.sweep} if search.warm_start is not None else {}),
            **({"tune.try_first": len(search.try_first)} if search.try_first else {})}


def budget_tag(time_budget_s: float | None) -> dict[str, str]:
    """The sweep run's tag of its time budget in seconds (a tag, not a param: a resume may change it)."""
    return {"time_budget_s": f"{time_budget_s:g}"} if time_budget_s is not None else {}


def resumed_tags(num_samples: int, time_budget_s: float | None) -> dict[str, str]:
    """A resumed sweep's run's tags of what a resume may change: its time budget, and the trials
    it asks for (``num_samples``; the param ``tune.num_samples`` keeps the count it began with)."""
    return {"num_samples": str(num_samples), **budget_tag(time_budget_s)}


def run_columns(space: search_space.SearchSpace) -> list[str]:
    """The runs table's columns: the accuracies, the searched params (what each trial tried;
    the parent's best config is its ``best.*`` params and its note) and the seed (an ensemble's
    members, nested under its run, differ by it)."""
    seed = [] if "train.seed" in space.params else ["params.train.seed"]
    return ["metrics.best_valid_acc", "metrics.valid_acc", *[f"params.{k}" for k in space.params], *seed]


def start_sweep(plan: SweepPlan, launch: Placement, search: SearchPlan, tracker: Tracker,
                carried: Carried | None = None) -> tuple[SweepRecord, TrackedRun]:
    """A fresh sweep: its parent run and its sweep.json (with what its warm start ``carried``)."""
    experiment, base, space, preset = plan.experiment, search.base, search.space, search.preset
    warm = {"warm_start": carried.sweep} if carried is not None else {}
    parent = tracker.start_run(experiment, plan.name,
                               tags={"dataset": plan.dataset, "sweep": plan.name, "model": base.model.kind,
                                     **budget_tag(search.time_budget_s), **warm})
    try:
        parent.log_dataset(plan.prepared)
        parent.log_params(sweep_params(search, plan.workers_per_trial, launch))
        if carried is not None:
            parent.log_metrics({"trials_carried": carried.trials})
        tracker.show_columns(experiment, run_columns(space))   # the runs view, while the sweep runs
        sweep = SweepRecord(name=plan.name, dataset=plan.dataset, data_dir=str(plan.prepared.resolve()),
                            tracking_uri=tracker.uri, experiment=experiment, parent_run_id=parent.run_id,
                            storage=launch.experiment_path, address=plan.address,
                            search_space=json.loads(space.to_json()),
                            sampler=search.sampler, seed=search.seed, num_samples=search.num_samples,
                            time_budget_s=search.time_budget_s,
                            asha=Asha(preset.grace_period, preset.reduction_factor),
                            workers_per_trial=plan.workers_per_trial, gpus_per_worker=plan.gpus_per_worker,
                            max_concurrent=launch.max_concurrent, register=plan.register,
                            optuna=plan.study, base=to_dict(base), warm_start=carried,
                            try_first=search.try_first or None)
        sweep_file.write(plan.record_file, sweep)
    except BaseException:
        parent.end("FAILED")
        raise
    if plan.show_progress:
        proposes = (f"the {search.sampler} sampler proposes them" if search.sampler in UNINFORMED_SAMPLERS
                    else f"the {search.sampler} sampler learns from {SEARCH_METRIC}")
        _log.info(f"sweep {plan.name}: {search.num_samples} trials over {space.describe()}; {proposes}, ASHA stops "
                  f"on {STOP_METRIC} at every check (a trial makes at most {search.checks} check{'' if search.checks == 1 else 's'}; grace "
                  f"{preset.grace_period}, keeps 1/{preset.reduction_factor:g} at each rung); "
                  f"MLflow {tracker.uri}, experiment {experiment}")
    if carried is not None:
        _log.log(logging.INFO if carried.trials else logging.WARNING, carried_line(carried))
    ran = try_first.ran_before(search.try_first, carried)
    for line in ran.values():
        _log.warning(line)
    left = tuple(config for i, config in enumerate(search.try_first, 1) if i not in ran)
    if left:
        _log.info(f"the first {len(left)} trial(s) try the configurations given: {try_first.described(left)}")
    return sweep, parent


def close_lost_runs(tracker: Tracker, parent: TrackedRun, experiment: str, kept: set[str]) -> None:
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
