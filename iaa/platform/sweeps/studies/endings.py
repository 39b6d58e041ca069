"""A sweep's unfinished Optuna trials ended where the sweep could not end them itself.

A stop, a process that died or a full disk leaves trials RUNNING: they end FAIL, with user
attributes that say why (:func:`fail_unfinished`, :func:`fail_trials`). The trials that the
sweep's time budget stopped end as each had reported: COMPLETE, PRUNED at its last check, or
FAIL without one (:func:`end_untold`). A write that meets another process's write of the same
trial is made again, and a trial that finished meanwhile keeps its end.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from iaa.platform.sweeps.studies.study_store import existing_study, study_writes

END_TRIES = 3

# how a trial ends: its state, its values (None: none) and the user attributes that say why
_Ending = tuple[Any, "list[float] | None", Mapping[str, str]]


def fail_unfinished(storage_url: str, study_name: str, attrs: Mapping[str, str]) -> int:
    """End FAIL every RUNNING or WAITING trial of study ``study_name``, with ``attrs`` as its user
    attributes (why it ended); returns how many. A study that does not exist has none."""
    found = existing_study(storage_url, study_name)
    if found is None:
        return 0
    with study_writes(storage_url, f"mark the unfinished trials of study {study_name} FAIL"):
        return _fail_trials(*found, attrs)


def end_untold(storage_url: str, study_name: str, ends: Mapping[str, float | None], attrs: Mapping[str, str]) -> int:
    """End each RUNNING trial of study ``study_name`` asked for a Tune trial of ``ends`` (its user
    attribute ``tune_trial_id``, which a trial a resume continues carries too), trials that the
    sweep's time budget stopped: with a value (its best check: it had reported its own end)
    COMPLETE; else, with ``attrs``, PRUNED at its last intermediate value as Optuna ends a pruned
    trial, or FAIL when it has none. Returns how many."""
    from optuna.trial import TrialState

    found = existing_study(storage_url, study_name) if ends else None
    if found is None:
        return 0

    def ending(trial: Any) -> _Ending | None:
        if trial.user_attrs.get("tune_trial_id") not in ends:
            return None
        value = ends[trial.user_attrs["tune_trial_id"]]
        if value is not None:
            return TrialState.COMPLETE, [float(value)], {}
        if not trial.intermediate_values:
            return TrialState.FAIL, None, attrs
        return TrialState.PRUNED, [trial.intermediate_values[max(trial.intermediate_values)]], attrs

    with study_writes(storage_url, f"end the trials of study {study_name} that the time budget stopped"):
        return _end_trials(*found, ending)


def fail_trials(storage_url: str, study_name: str, why: Callable[[Any], str | None]) -> int:
    """End FAIL each RUNNING or WAITING trial of study ``study_name`` for which ``why(trial)`` gives
    a reason, kept as its user attribute ``killed``; returns how many. A study (or a SQLite file)
    that does not exist has none, and none is made."""
    found = existing_study(storage_url, study_name)
    if found is None:
        return 0
    with study_writes(storage_url, f"mark the orphaned trials of study {study_name} FAIL"):
        return _fail_trials(*found, lambda t: {"killed": reason} if (reason := why(t)) else None)


def _fail_trials(storage: Any, study_id: int, attrs: Mapping[str, str] | Callable[[Any], Mapping[str, str] | None]
                 ) -> int:
    """FAIL the study's unfinished trials, each with ``attrs`` (or ``attrs(trial)``; None: left as it is)."""
    from optuna.trial import TrialState

    def ending(trial: Any) -> _Ending | None:
        marks = attrs(trial) if callable(attrs) else attrs
        return None if marks is None else (TrialState.FAIL, None, marks)

    return _end_trials(storage, study_id, ending)


def _end_trials(storage: Any, study_id: int, ending: Callable[[Any], _Ending | None]) -> int:
    """End each unfinished trial of the study as ``ending(trial)`` says (None: left as it is);
    returns how many. A write that meets another process's write of the same trial (SQLite's
    unique constraint, which Optuna reports as a ``StorageInternalError``) is made again, up to
    ``END_TRIES`` times: a trial finished meanwhile by the sweep itself keeps its end."""
    from optuna.trial import TrialState

    ended = 0
    for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        how = ending(trial)
        if how is not None and _end_trial(storage, study_id, trial.number, how):
            ended += 1
    return ended


def _end_trial(storage: Any, study_id: int, number: int, how: _Ending) -> bool:
    """End trial ``number`` as ``how`` says; False where it had finished meanwhile."""
    from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError

    state, values, marks = how
    for attempt in range(END_TRIES):
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            for key, value in marks.items():
                storage.set_trial_user_attr(trial_id, key, value)
            storage.set_trial_state_values(trial_id, state, values=values)
            return True
        except UpdateFinishedTrialError:
            return False
        except StorageInternalError:
            if attempt == END_TRIES - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    return False
