"""A sweep's trials as they stand, told to the process that runs it while Tune runs them.

A sweep's record is written when its run ends or a signal stops it. A process that is killed
(SIGKILL, a lost head node, a machine taken back) writes nothing then, so :class:`StandingCallback`
has the record kept as the run goes: soon after a trial starts or ends, and at least every
``EVERY_S`` while trials run. It hands Tune's live trials to ``DriverSide.standing``, which reads
them as the run last saved them (:meth:`iaa.platform.sweeps.launch.RayLauncher.sweep`). Tune
saves the run every ``TUNE_GLOBAL_CHECKPOINT_S``, so a trial's start or end is told once a save
has had time to hold it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import ray.tune as tune

from iaa.platform.sweeps import driver_side

EVERY_S = 30.0              # the longest the trials go untold while they run


def saved_within() -> float:
    """Seconds within which Tune's saved run holds what happened (its save period, and one more)."""
    try:
        return float(os.environ.get("TUNE_GLOBAL_CHECKPOINT_S", "2")) + 1.0
    except ValueError:                       # "auto": Tune spends at most 5% of its time saving
        return 10.0


class StandingCallback(tune.Callback):
    """Tells ``DriverSide.standing`` of the Tune run ``sweep`` (none: nothing) its trials.

    Like every object Tune pickles into a run, it holds only the run's name
    (:mod:`~iaa.platform.sweeps.driver_side`).
    """

    def __init__(self, sweep: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.sweep = sweep
        self.clock = clock
        self._due = clock() + saved_within()     # the sweep's first trials, once saved

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.get("sweep", ""))

    def _soon(self) -> None:
        """A trial started or ended: tell it once Tune's save holds it."""
        self._due = min(self._due, self.clock() + saved_within())

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._soon()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._soon()

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._soon()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        now = self.clock()
        if now < self._due or not driver_side.is_bound(self.sweep):
            return
        self._due = now + EVERY_S
        standing = driver_side.of(self.sweep).standing
        if standing is not None:
            standing(trials)
