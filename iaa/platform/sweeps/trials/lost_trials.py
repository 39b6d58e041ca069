"""A trial that lost its worker (its process or its node died): its error as Tune keeps it, and
Tune's own records of it kept off the console.

The sweep's console says such a trial in one line as it ends
(:class:`~iaa.platform.sweeps.trials.trial_events.ConsoleCallback`), and the closing summary names it once
more with the resume that runs it again. Tune says it twice on its own, by its internal id: the
failure with Ray's whole traceback ("Trial task failed for trial run_trial_ID", which the launcher
has Tune make for every failure), and, once the run ends, the trials that did not finish ("Trials
did not complete: [...]"). Where Tune's log reaches the console (``verbose``, or a bucket as the
storage, where its errors are shown), :func:`keep_tune_records_off_the_console` sends those two
records to the sweep's log file only (``tune.log``, where the run keeps one); the trial's folder
in the run keeps the error in any case (``error.pkl``, ``error.txt``). Tune's records of any other
failure pass as before.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from iaa.platform.cluster.lost import worker_lost
from iaa.platform.sweeps.trials.full_disk import TRIAL_LOGGER

END_LOGGER = "ray.tune.tune"   # logs "Trials did not complete: [T, ...]" with the trials as its argument
LOG_FILE_LOGGER = "ray.tune"   # where the launcher attaches the sweep's log file


def last_error(trial: Any) -> BaseException | str | None:
    """The trial's last error as Tune keeps it: the exception, else its text. Tune writes both
    beside the trial at once, and copies them to the storage (where its getters read) later."""
    try:
        if trial.pickled_error_file:
            return pickle.loads(Path(trial.pickled_error_file).read_bytes())
        if trial.error_file:
            return Path(trial.error_file).read_text(encoding="utf-8", errors="replace")
    except (OSError, pickle.UnpicklingError, AttributeError, ImportError, EOFError):
        pass
    return trial.get_pickled_error() or trial.get_error()


def of_lost_workers(record: logging.LogRecord) -> bool:
    """Whether ``record`` is Tune's record of a trial that lost its worker: its failure (the error
    attached), or the trials that did not complete when each of them lost its worker."""
    if record.name == TRIAL_LOGGER:
        return bool(record.exc_info) and worker_lost(record.exc_info[1])   # type: ignore[index]
    if record.name == END_LOGGER and isinstance(record.args, tuple) and len(record.args) == 1:
        trials = record.args[0]
        return (isinstance(trials, list) and bool(trials) and all(hasattr(t, "trial_id") for t in trials)
                and all(worker_lost(last_error(t)) for t in trials))
    return False


class _LostWorkerRecords(logging.Filter):
    """Tune's records of trials that lost their worker go to the file handlers of ``ray.tune``
    (the sweep's log file, when the run keeps one) and to no other handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            lost = of_lost_workers(record)
        except Exception:  # noqa: BLE001 - a record that cannot be read is left as it is
            return True
        if not lost:
            return True
        for handler in logging.getLogger(LOG_FILE_LOGGER).handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)
        return False


_RECORDS = _LostWorkerRecords()


def keep_tune_records_off_the_console() -> None:
    """From now on in this process, Tune's records of a trial that lost its worker reach only the
    sweep's log file. Kept once set: Tune logs the trials that did not complete after its last
    callback."""
    for name in (TRIAL_LOGGER, END_LOGGER):
        logger = logging.getLogger(name)
        if _RECORDS not in logger.filters:
            logger.addFilter(_RECORDS)
