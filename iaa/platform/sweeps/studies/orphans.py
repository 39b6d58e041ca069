"""Optuna trials left RUNNING by a process that is gone (``kill -9``, a lost machine).

Each trial a sweep asks carries its process as the user attribute ``iaa.owner`` (host, pid and
process start: :mod:`iaa.platform.cluster.owner`), as each MLflow run carries the ``iaa.owner``
tag. When a command opens the tracking store, the runs whose owner is gone end KILLED
(:func:`iaa.platform.tracking.connection.close_orphans`); then, in the studies of those runs'
sweeps, every RUNNING or WAITING trial whose owner is gone ends FAIL with the user attribute
``killed``, as a resume marks them. A trial asked before trials carried an owner is failed when it
belongs to one of the runs just closed (its ``mlflow_run_id``, or its ``tune_trial_id`` and the
run's ``trial_id`` tag). A trial that carries nothing (its process asked it, then could not tag
it: a full disk, a kill between the two writes) is failed when the sweep's parent run is among the
runs just closed: the process that drives the sweep is gone. A trial of a sweep that runs now, in
any process, is left alone.

The study is found in the sweep's record (``WORKDIR/sweeps/NAME/sweep.json`` beside a SQLite
store ``WORKDIR/mlflow.db``, its paths read where the work folder is now), else in the sweep's
parent run (``tune.study``, ``tune.study_storage``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from iaa.errors import IaaError
from iaa.jobs.workdir import recorded
from iaa.jobs.workdir.paths import Workdir, sqlite_file
from iaa.platform.cluster.owner import owner_alive

OWNER_ATTR = "iaa.owner"
PARENT_TAG = "mlflow.parentRunId"


def fail_orphaned_trials(client: Any, uri: str, closed: Iterable[Any]) -> int:
    """FAIL the trials left by processes that are gone, in the studies of the sweeps of ``closed``
    (MLflow runs of the store ``uri`` just ended KILLED, read with ``client``); returns how many."""
    from iaa.platform.sweeps.studies.endings import fail_trials

    by_study: dict[tuple[str, str], _Closed] = {}
    for run in closed:
        sweep = run.data.tags.get("sweep")
        study = _study_of(client, uri, run, sweep) if sweep else None
        if study is None:
            continue
        found = by_study.setdefault(study, _Closed())
        found.run_ids.add(run.info.run_id)
        if run.data.tags.get("trial_id"):
            found.trial_ids.add(run.data.tags["trial_id"])
        elif not run.data.tags.get(PARENT_TAG):
            found.driver_gone = True
    failed = 0
    for (storage, name), found in by_study.items():
        failed += fail_trials(storage, name, lambda trial, found=found: found.why(trial.user_attrs))
    return failed


@dataclass
class _Closed:
    """What the runs just closed tell of one study: their ids, their trials' Tune ids, and whether
    the sweep's parent run (its driving process) is among them."""

    run_ids: set[str] = field(default_factory=set)
    trial_ids: set[str] = field(default_factory=set)
    driver_gone: bool = False

    def why(self, attrs: dict[str, Any]) -> str | None:
        """Why a trial with user attributes ``attrs`` is left by a process that is gone; None when it is not."""
        token = attrs.get(OWNER_ATTR)
        if isinstance(token, str) and token:
            return None if owner_alive(token) else f"process {token} ended without closing this trial"
        if attrs.get("mlflow_run_id") in self.run_ids or attrs.get("tune_trial_id") in self.trial_ids:
            return "its MLflow run was left RUNNING by a process that ended without closing it"
        if self.driver_gone and not attrs.get("tune_trial_id"):
            return "asked by the sweep's process, which ended before it could tag the trial"
        return None


def _study_of(client: Any, uri: str, run: Any, sweep: str) -> tuple[str, str] | None:
    """(storage, name) of sweep ``sweep``'s study: from its record beside the store, else its parent run."""
    found = _recorded_study(uri, sweep)
    if found is not None:
        return found
    parent_id = run.data.tags.get(PARENT_TAG)
    try:
        params = (client.get_run(parent_id) if parent_id else run).data.params
    except Exception:  # noqa: BLE001 - a parent run that is gone leaves nothing to find
        return None
    storage, name = params.get("tune.study_storage"), params.get("tune.study")
    return (storage, name) if storage and name else None


def _recorded_study(uri: str, sweep: str) -> tuple[str, str] | None:
    """The study a sweep's ``sweep.json`` names, when the store is a work folder's ``mlflow.db``."""
    db = sqlite_file(uri)
    if db is None:
        return None
    workdir = db.parent
    try:
        path = Workdir(workdir).sweep_record(sweep)      # IaaError: a name that would leave sweeps/
        optuna = json.loads(path.read_text(encoding="utf-8")).get("optuna") or {}
    except (OSError, ValueError, AttributeError, IaaError):
        return None
    storage, name = optuna.get("storage"), optuna.get("study")
    if not isinstance(storage, str) or not isinstance(name, str):
        return None
    return recorded.located(storage, workdir, path.parent) or storage, name
