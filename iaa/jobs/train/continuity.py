"""Which tracked run a run folder's run goes on in, and what links it to the runs before it.

- A resume continues the tracked run that the folder's ``tracking.json`` names, from any working
  folder and after the folder moved (:func:`continued`).
- A copy of a run folder that shares the original's store goes on under a tracked run of its own,
  so the original's run never gets the copy's checks. That run is tagged with the original's run
  and folder, and begins with the checks the copy holds (:func:`replay_checks`), so its curve is
  whole.
- A run started again in a folder where an attempt was stopped before its first check replaces
  that attempt's run, which holds no check (:func:`drop_stopped_attempts`): the folder has one
  run, not an empty KILLED one beside it. The store keeps it deleted, where MLflow can restore it.
- A resume that changes what :data:`~iaa.jobs.modeling.checkpoint.RESUMABLE_CHANGES` allows (the
  budget, how the run computes) says so in tags (:func:`resumed_tags`): a run's params keep their
  first values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from iaa.errors import IaaError, printable
from iaa.files import spellings
from iaa.jobs.ports import INTERRUPTED_TAG, Tracker
from iaa.jobs.workdir.paths import RunFolder, Tracking

_log = logging.getLogger(__name__)

COPY_OF_TAG = "copy_of"                # the run folder that a copy's own tracked run was copied from
COPY_OF_RUN_TAG = "copy_of_run"        # the original's tracked run
RESUMED_PREFIX = "resumed."            # resumed.train.max_epochs: a setting a resume changed, as it is now
CHECK_METRIC = "valid_acc"             # logged at every check: a run without it never made one


@dataclass(frozen=True)
class Continuation:
    """The tracked run a run goes on in (``run_id``; None: a new one) and, for a copy that starts
    its own, the original's tracked run (``copy_of``)."""

    run_id: str | None = None
    copy_of: Tracking | None = None

    def tags(self) -> dict[str, str]:
        """What a new run is tagged with: the original of a copy."""
        if self.copy_of is None:
            return {}
        return {COPY_OF_TAG: self.copy_of.folder, COPY_OF_RUN_TAG: self.copy_of.run_id}


def continued(tracker: Tracker, experiment: str, folder: RunFolder) -> Continuation:
    """The tracked run that a resumed run in ``folder`` continues: the one its ``tracking.json``
    names, from whatever working folder, after the folder moved, and in a copied work folder's
    own copy of the store; an error where ``tracker`` does not hold that run (another work folder's
    store: the resume would split the run's history). A new tracked run, linked to the original's,
    for a copy of a run folder that shares the original's store while the original is still there.
    A folder whose runs began before the file is found by its ``run_dir`` tag, in any of its
    :func:`~iaa.files.spellings`."""
    tracking = folder.tracking()
    if tracking is None:
        for spelling in spellings(folder.path):
            runs = tracker.find_runs(experiment, {"run_dir": spelling})
            if runs:
                return Continuation(runs[0].run_id)
        return Continuation()
    if not any(r.run_id == tracking.run_id for r in tracker.find_runs(experiment, {"run_dir": tracking.folder})):
        raise IaaError(f"{folder.path}: its tracked run {tracking.run_id} (in {tracking.uri}) is not in {tracker.uri}; "
                       f"give the `workdir` or `tracking_uri` of the store that holds it, or remove "
                       f"{folder.tracking_file} to resume under a new tracked run in {tracker.uri}")
    original = folder.copied_from(tracker.uri)
    if original is not None:
        _log.warning(printable(f"{folder.path} is a copy of {original}, whose tracked run {tracking.run_id} "
                               f"stays its own; the copy goes on under a tracked run of its own, tagged "
                               f"{COPY_OF_RUN_TAG}={tracking.run_id}, which begins with the copy's checks"))
        return Continuation(copy_of=tracking)
    return Continuation(tracking.run_id)


def replay_checks(folder: RunFolder, log: Callable[[Mapping[str, Any]], None]) -> int:
    """Log the checks that ``folder``'s ``metrics.jsonl`` holds, as they were logged when made (the
    wall-clock stamp aside); returns how many."""
    rows = folder.read_metrics()
    for row in rows:
        log({key: value for key, value in row.items() if key != "time"})
    return len(rows)


def drop_stopped_attempts(tracker: Tracker, experiment: str, folder: RunFolder) -> list[str]:
    """Delete the tracked runs of ``experiment`` that began in ``folder`` and were stopped by a
    signal before their first check (KILLED, with no check logged); returns their ids. Called when
    a run starts afresh in ``folder``: it replaces them."""
    place = str(folder.path.resolve())
    dropped = []
    for record in tracker.find_runs(experiment, {"run_dir": place}, status="KILLED"):
        if INTERRUPTED_TAG in record.tags and not tracker.metric_history(record.run_id, CHECK_METRIC):
            tracker.delete_run(record.run_id)
            dropped.append(record.run_id)
    if dropped:
        _log.info(printable(f"{folder.path}: replacing the tracked run {', '.join(dropped)} of the attempt stopped "
                            f"before its first check (deleted from {tracker.uri}, where it can be restored)"))
    return dropped


def resumed_tags(changes: Mapping[str, Any]) -> dict[str, str]:
    """The tags that hold the settings a resume changed (``{"train.max_epochs": 8}`` ->
    ``resumed.train.max_epochs = 8``)."""
    return {f"{RESUMED_PREFIX}{key}": str(value) for key, value in changes.items()}
