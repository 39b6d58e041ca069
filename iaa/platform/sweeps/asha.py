"""ASHA as a sweep runs it: Ray Tune's ``ASHAScheduler``, with the configurations given to try
first set aside.

A trial that runs a configuration given to try first (``tune --try-first``; its Tune trial id is
in the sweep's ``DriverSide.given``) runs to its own end, and its checks set no rung's bar. A good
guess leads the other trials at the first check: counted by ASHA, it would stop more of them there
than in a sweep given nothing, and the sweep would reach less far (measured in docs/search.md).
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from iaa.platform.sweeps import driver_side


class GivenAside(ASHAScheduler):
    """``ASHAScheduler`` of the Tune run ``sweep``, which leaves its given trials alone."""

    def __init__(self, *args: Any, sweep: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sweep = sweep

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
