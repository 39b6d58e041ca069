"""A new sweep that begins with an earlier sweep's trials (``tune --warm-start SWEEP``).

A fresh study knows nothing: the sampler's first trials are a space-filling design and TPE's
random start-up. :func:`carry` copies the earlier sweep's scored trials (COMPLETE with their
best check, and PRUNED with the checks ASHA let them make, as TPE reads them) into the new
sweep's study before its first trial: their parameters, value, checks and times, marked with the
user attributes ``carried_from`` (the sweep they ran in) and ``carried_number`` (their number
there). The sampler models them from its first proposal (TPE's start-up counts them), and
:class:`~iaa.platform.sweeps.search.distinct_search.DistinctSampler` never proposes their
configurations again. The new trials are numbered after them, so optuna-dashboard, the console
and MLflow still name the same trials.

A trial carries where it lies in the new search space (:class:`~iaa.jobs.ports.WarmStart`):
each value inside the new distribution, a parameter the earlier sweep did not search filled with
the value its trials ran with, a parameter the new sweep does not search equal to the value its
trials run with. The others are left out and counted by reason, as are the trials that ended
without a check or FAIL.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Mapping

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState, create_trial

from iaa.errors import IaaError
from iaa.jobs.ports import Carried, WarmStart

CARRIED_FROM = "carried_from"        # user attribute: the sweep a carried trial ran in
CARRIED_NUMBER = "carried_number"    # user attribute: its number in that sweep's study


def carry(source: optuna.Study, target: optuna.Study, space: Mapping[str, BaseDistribution],
          warm: WarmStart) -> Carried:
    """Add the scored trials of ``source`` (sweep ``warm.sweep``'s study) that lie in ``space`` to
    ``target``, each with the distributions of ``space``; what was carried and what was left out."""
    left_out: Counter[str] = Counter()
    carried: list[FrozenTrial] = []
    for trial in source.get_trials(deepcopy=False):
        params, why = _placed(trial, space, warm)
        why = why or _unscored(trial)
        if why is not None:
            left_out[why] += 1
            continue
        assert params is not None
        copy = create_trial(state=trial.state, value=trial.value if trial.state == TrialState.COMPLETE else None,
                            params=params, distributions={name: space[name] for name in params},
                            intermediate_values=trial.intermediate_values,
                            user_attrs={**trial.user_attrs, CARRIED_FROM: trial.user_attrs.get(CARRIED_FROM, warm.sweep),
                                        CARRIED_NUMBER: trial.user_attrs.get(CARRIED_NUMBER, trial.number)})
        copy.datetime_start, copy.datetime_complete = trial.datetime_start, trial.datetime_complete
        carried.append(copy)
    target.add_trials(carried)
    return Carried(sweep=warm.sweep, trials=len(carried), best=max(map(scored_value, carried), default=None),
                   left_out=dict(left_out), ran=tuple((t.params, scored_value(t)) for t in carried))


def carry_into(warm: WarmStart, storage: str, name: str, space: Mapping[str, BaseDistribution],
               direction: str, objective: str) -> Carried:
    """:func:`carry` from ``warm``'s study into a new study ``name`` in ``storage`` (an Optuna
    RDB URL), made here with its ``direction`` and ``objective`` name; IaaError when the earlier
    study is missing or the new one exists."""
    from iaa.platform.sweeps.studies.study_store import study_storage, study_writes

    try:
        source = optuna.load_study(study_name=warm.study_name, storage=study_storage(warm.study_storage))
    except KeyError:
        raise IaaError(f"sweep {warm.sweep}: no Optuna study {warm.study_name!r} in {warm.study_storage}") from None
    with study_writes(storage, f"carry the trials of sweep {warm.sweep} into study {name}"):
        try:
            target = optuna.create_study(storage=study_storage(storage), study_name=name, direction=direction)
        except optuna.exceptions.DuplicatedStudyError:
            raise IaaError(f"a study {name!r} exists already in {storage}; a warm start begins a new one: "
                           "give the sweep another `sweep_name`") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)     # stable in use since Optuna 3.2
            target.set_metric_names([objective])
        return carry(source, target, space, warm)


def scored_value(trial: FrozenTrial) -> float:
    """What the sampler reads of a scored trial: its value, or a PRUNED trial's best check."""
    return trial.value if trial.state == TrialState.COMPLETE else max(trial.intermediate_values.values())


def _placed(trial: FrozenTrial, space: Mapping[str, BaseDistribution],
            warm: WarmStart) -> tuple[dict[str, Any] | None, str | None]:
    """The trial's parameters in ``space``, or None and why it lies outside it."""
    params: dict[str, Any] = {}
    for name, dist in space.items():
        value = trial.params[name] if name in trial.params else warm.filled.get(name)
        if value is None:
            return None, f"it has no value of {name}"
        if not _contains(name, dist, value):
            return None, f"its {name} lies outside this search space"
        params[name] = value
    for name, value in trial.params.items():
        if name not in space and warm.fixed.get(name) != value:
            return None, f"its {name} is not this sweep's {warm.fixed.get(name)}"
    return params, None


def _contains(name: str, dist: BaseDistribution, value: Any) -> bool:
    try:
        create_trial(params={name: value}, distributions={name: dist}, value=0.0)   # Optuna's own check
    except ValueError:
        return False
    return True


def _unscored(trial: FrozenTrial) -> str | None:
    """Why the sampler would not learn from ``trial``; None when it would."""
    if trial.state == TrialState.COMPLETE and trial.value is not None:
        return None
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        return None
    if trial.state == TrialState.FAIL:
        return "it ended FAIL"
    if trial.state.is_finished():
        return "it made no check"
    return "it had not ended"
