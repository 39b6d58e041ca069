"""ASHA as a sweep runs it: Ray Tune's ``ASHAScheduler``, with the configurations given to try
first set aside, and the rungs a resumed sweep had filled before it stopped.

A trial that runs a configuration given to try first (``tune --try-first``; its Tune trial id is
in the sweep's ``DriverSide.given``) runs to its own end, and its checks set no rung's bar. A good
guess leads the other trials at the first check: counted by ASHA, it would stop more of them there
than in a sweep given nothing, and the sweep would reach less far (measured in docs/search.md).
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from iaa.jobs.config.presets import STOP_METRIC, TIME_ATTR
from iaa.platform.sweeps import driver_side
from iaa.platform.sweeps.studies.given import TRIED_FIRST
from iaa.platform.sweeps.studies.carried_trials import CARRIED_FROM


class GivenAside(ASHAScheduler):
    """``ASHAScheduler`` of the Tune run ``sweep``, which leaves its given trials alone.

    Tune saves a run's searcher and callbacks but not its scheduler: a restored run's ASHA began
    with empty rungs, so the first trials of a resume were measured against nothing and ran on
    where the sweep would have stopped them. Before the first trial of this process, every check
    that the sweep's Optuna study holds (each trial's intermediate values, under its Tune trial id)
    is played through the scheduler again, so its rungs hold what they held when it stopped.
    """

    def __init__(self, *args: Any, sweep: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sweep = sweep
        self._remembered = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_remembered": False}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_remembered": False, **state})   # saved before the rungs were remembered

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._remember(tune_controller)
        super().on_trial_add(tune_controller, trial)

    def _remember(self, tune_controller: Any) -> None:
        """Fill the rungs with the checks of the sweep's trials so far, once per process."""
        if self._remembered or self.sweep is None or not driver_side.is_bound(self.sweep):
            return
        self._remembered = True
        side = driver_side.of(self.sweep)
        if not side.study_storage or not side.study_name:
            return
        for trial_id, checks in past_checks(side.study_storage, side.study_name).items():
            past = _Past(trial_id)
            ASHAScheduler.on_trial_add(self, tune_controller, past)
            for step, value in sorted(checks.items()):
                ASHAScheduler.on_trial_result(self, tune_controller, past, {TIME_ATTR: step, STOP_METRIC: value})
            ASHAScheduler.on_trial_remove(self, tune_controller, past)

    def given(self, trial_id: str) -> bool:
        """Whether Tune trial ``trial_id`` runs a configuration given to try first."""
        return self.sweep is not None and driver_side.is_bound(self.sweep) and \
            trial_id in driver_side.of(self.sweep).given

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if self.given(trial.trial_id):
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        if self.given(trial.trial_id):
            super().on_trial_remove(tune_controller, trial)      # forgotten, its checks unrecorded
            return
        super().on_trial_complete(tune_controller, trial, result)


class _Past:
    """A trial of an earlier process of the sweep, as the scheduler sees one: its id."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def past_checks(storage_url: str, study_name: str) -> dict[str, dict[int, float]]:
    """Each Tune trial's checks (``valid_acc`` by check) as the study holds them, merged over the
    Optuna trials that ran it (a stop's FAIL and its continuation); not the trials a warm start
    carried from another sweep, nor those given to try first (ASHA leaves them out)."""
    import optuna

    from iaa.platform.sweeps.studies.study_store import study_storage

    try:
        study = optuna.load_study(study_name=study_name, storage=study_storage(storage_url))
    except KeyError:                                     # no study yet
        return {}
    checks: dict[str, dict[int, float]] = {}
    for trial in study.get_trials(deepcopy=False):
        trial_id = trial.user_attrs.get("tune_trial_id")
        if trial_id and CARRIED_FROM not in trial.user_attrs and TRIED_FIRST not in trial.user_attrs:
            checks.setdefault(trial_id, {}).update({int(k): float(v) for k, v in trial.intermediate_values.items()})
    return {k: v for k, v in checks.items() if v}
