"""Tune's files of each trial's results (``progress.csv``, ``result.json``, TensorBoard's events),
closed when the run ends.

Tune writes them through logger callbacks that it adds to every run, and closes a trial's files
when it tells those callbacks that the trial ended. A trial that the time budget stops
(:mod:`iaa.platform.sweeps.budget`) is never told so: its files stay open, and TensorBoard's
writer keeps a thread and a process queue alive in the driver for as long as the process lives
(a notebook's, a test session's). :func:`loggers` gives the same three loggers, each of which
also ends, as the run ends, every trial that it still holds.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

log = logging.getLogger(__name__)


class _EndsHeldTrials:
    """Mixed into a Tune logger: the trials it holds open, each ended at the run's end."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[Any] = set()

    def log_trial_start(self, trial: Any) -> None:
        self.held.add(trial)
        super().log_trial_start(trial)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        self.held.add(trial)                      # a restored run's trial opens its files here
        super().log_trial_result(iteration, trial, result)

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        self.held.discard(trial)
        super().log_trial_end(trial, failed=failed)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        for trial in list(self.held):
            self.log_trial_end(trial)
        super().on_experiment_end(trials, **info)


class CsvFiles(_EndsHeldTrials, CSVLoggerCallback):
    """Tune's ``progress.csv`` of each trial."""


class JsonFiles(_EndsHeldTrials, JsonLoggerCallback):
    """Tune's ``result.json`` of each trial."""


class TensorBoardFiles(_EndsHeldTrials, TBXLoggerCallback):
    """TensorBoard's event file of each trial."""


def loggers() -> list[Any]:
    """The result files' loggers of a new run: TensorBoard's only where tensorboardX is installed,
    as Tune itself decides."""
    found: list[Any] = [CsvFiles(), JsonFiles()]
    try:
        found.append(TensorBoardFiles())
    except ImportError:
        log.debug("tensorboardX is not installed: no TensorBoard files")
    return found
