"""A sweep's time budget: the clock of its trials, which ends the Tune run once they have run
for the budget.

Ray Tune saves its stopper with the experiment state every few seconds and brings it back on
``--resume``, so :class:`SweepClock` counts the time of every process that ran the sweep (less
the seconds since the last save when a process is killed). The total comes from the process
that runs the sweep now (:class:`~iaa.platform.sweeps.driver_side.TimeBudget`), so a resumed
sweep may be given another. When the clock reaches it, Tune stops every trial where it stands
(each keeps its checks and its last checkpoint) and starts no other; Tune tells neither its
searcher nor its callbacks of those stops, so :class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns`
ends their runs and the launcher their Optuna trials.
"""

from __future__ import annotations

import time
from typing import Any

import ray.tune as tune

from iaa.platform.sweeps import driver_side


class SweepClock(tune.Stopper):
    """The time the Tune run ``sweep`` has run its trials; ends the run at the sweep's budget."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self.spent_s = 0.0
        self._last: float | None = None      # this process's last reading; a restored clock starts afresh

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "spent_s": self.spent_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sweep"])
        self.spent_s = float(state.get("spent_s") or 0.0)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        """Called by Tune at every step of its loop: count the time since the last step, and stop
        every trial once the budget is spent."""
        now = time.monotonic()
        if self._last is not None:
            self.spent_s += now - self._last
        self._last = now
        if not driver_side.is_bound(self.sweep):
            return False
        budget = driver_side.of(self.sweep).budget
        if budget.total_s is None or self.spent_s < budget.total_s:
            return False
        budget.ended = True
        return True
