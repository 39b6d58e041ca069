"""A full disk met while a Tune run (a sweep, an ensemble's members) runs: one error, and the run stops.

Wherever it strikes, the first write that meets a full disk is noted in the run's
:class:`~iaa.platform.sweeps.driver_side.DriverSide` (``note_full``), as a
:class:`iaa.files.DiskFullError` naming the file or store and the free space of its own file system:

- **in a trial**: the trial's checkpoint, which Ray Tune copies into ``STORAGE/NAME/TRIAL``
  (:func:`in_trial` names that folder; the loop's own writes name their files). Tune hands a
  trial's error to the driver only in its log record ("Trial task failed"), which :func:`watching`
  reads, notes and drops: the trial's traceback is never printed, and the trial is not retried;
- **in the driver**: the Optuna study (:class:`~iaa.platform.sweeps.search.distinct_search.StudySearch`),
  the trials' MLflow runs (:class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns`), and Tune's own copy
  of the run's state into ``STORAGE/NAME`` (its syncer's warning and its failed save, read by
  :func:`watching` too). Ray's later report of the stopped trials' unfetched errors is dropped.

:class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns` then ends the Tune loop at its next step (Tune
stops the trials' actors on the way out), and the launcher raises :func:`stopped_by`'s error in
place of whatever Tune raised. The job marks the runs and trials it can; the next command that opens
the work folder marks the rest (:func:`iaa.platform.tracking.connection.close_orphans`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from iaa.files import FULL_TEXTS, DiskFullError, disk_full, free_bytes, size_text
from iaa.platform.cluster.ray_internals import SYNC_LOGGER, UNHANDLED_LOGGER

# ``side`` below is the run's DriverSide (typed Any: that module imports the trial's, which imports this one)

TRIAL_LOGGER = "ray.tune.execution.tune_controller"   # logs "Trial task failed for trial T" with the error
STATE_LOGGER = "ray.tune.execution.experiment_state"  # logs a failed save of the run's state with the error
STATE = "Ray Tune could not keep the run's state there"


def free_note(path: str) -> str:
    """`` (N KiB free)``: the free space of ``path``'s own file system (nothing for a bucket)."""
    free = free_bytes(path) if "://" not in path else None
    return f" ({size_text(free)} free)" if free is not None else ""


def full_at(path: str, what: str) -> DiskFullError:
    """``no space left on device writing PATH (N free): what``."""
    return DiskFullError(f"no space left on device writing {path}{free_note(path)}: {what}")


def in_trial(err: BaseException, folder: str) -> BaseException:
    """What a trial raises for ``err``: itself, unless it is a full disk that no DiskFullError
    names (Ray's copy of the checkpoint into ``folder``, the trial's folder in the storage)."""
    if _named(err) is not None or not disk_full(err):
        return err
    return full_at(folder, "Ray Tune could not keep the trial's checkpoint there")


def stopped_by(side: Any, err: BaseException | None, experiment_path: str) -> DiskFullError | None:
    """The error that ends a Tune run which met a full disk: the first one noted, else ``err``'s
    own (a full disk Tune raised itself); None when the run met none."""
    if side is not None and side.full:
        full = side.full[0]
        return full if isinstance(full, DiskFullError) else DiskFullError(str(full))
    if err is None:
        return None
    named = _named(err)
    if named is None and not disk_full(err):
        return None
    return named or full_at(experiment_path, "Ray Tune could not write the run there")


def _says_full(text: str) -> bool:
    """Whether a log line's text tells of a full disk (an OSError's, SQLite's, or a DiskFullError's)."""
    text = text.lower()
    return any(full.lower() in text for full in FULL_TEXTS)


def _named(err: BaseException) -> DiskFullError | None:
    """The DiskFullError in ``err``'s chain; a trial's comes wrapped in Ray's RayTaskError, whose
    ``cause`` is the trial's own exception (the wrapper's text is a traceback)."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        inner = getattr(found, "cause", None)
        if isinstance(inner, BaseException):
            found = inner
            continue
        if isinstance(found, DiskFullError):
            return found
        found = found.__cause__ or found.__context__
    return None


class _FullDiskRecords(logging.Filter):
    """Drops Ray's log records of a full disk (a trial's failure, a failed copy of the run's state),
    noting the first one for the run: the command says it once, in one line."""

    def __init__(self, side: Any, experiment_path: str) -> None:
        super().__init__()
        self.side, self.experiment_path = side, experiment_path

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is not None and (_named(err) is not None or disk_full(err)):
            what = "a trial could not write there" if record.name == TRIAL_LOGGER else STATE
            self.side.note_full(_named(err) or full_at(self.experiment_path, what))
            return False
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not fit its message is left as it is
            return True
        if _says_full(text):
            self.side.note_full(full_at(self.experiment_path, STATE))
            return False
        return True


class _UnhandledFullDisk(logging.Filter):
    """Drops Ray's report of a trial's full disk from a task whose result nobody fetched (Tune
    stopped the trial): Ray makes it whenever it frees the result, also after the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not _says_full(record.getMessage())
        except Exception:  # noqa: BLE001 - a record whose arguments do not fit its message is left as it is
            return True


_UNHANDLED = _UnhandledFullDisk()


@contextlib.contextmanager
def watching(side: Any, experiment_path: str) -> Iterator[None]:
    """While the block runs, Ray's records of a full disk are noted for ``side``'s run and dropped;
    from then on, Ray's reports of unfetched trial errors that tell of a full disk are dropped too."""
    if side is None:
        yield
        return
    records = _FullDiskRecords(side, experiment_path)
    loggers = [logging.getLogger(name) for name in (TRIAL_LOGGER, STATE_LOGGER, SYNC_LOGGER)]
    logging.getLogger(UNHANDLED_LOGGER).addFilter(_UNHANDLED)        # kept: Ray may report after the run
    for logger in loggers:
        logger.addFilter(records)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(records)
