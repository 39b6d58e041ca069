"""One Tune run: where it goes (:class:`Launch`), built new (:func:`tuner`) or from its saved
state (:func:`restore`), run (:func:`run_tuner`) and read back (:func:`analysis`).

Every run is saved every 2 s, so that ``--resume`` continues it. While the command is quiet,
Tune's own log and the lines the cluster publishes to drivers go to ``STORAGE/NAME/tune.log``,
not to the console. A full disk met by any write of the run ends it in one line
(:mod:`~iaa.platform.sweeps.trials.full_disk`).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import ray.tune as tune

from iaa.errors import IaaError
from iaa.files import is_remote_uri
from iaa.jobs.ports import CHECKPOINT_SCORE
from iaa.platform.cluster import connect as cluster
from iaa.platform.cluster.driver_lines import cluster_lines_to
from iaa.platform.cluster.storage import check_private
from iaa.platform.ray_train import max_failures
from iaa.platform.sweeps import driver_side, saved_state
from iaa.platform.sweeps.trials import full_disk, lost_checkpoints, result_files

_log = logging.getLogger(__name__)

MAX_TRIAL_FAILURES = 2      # a failed trial restarts from its last checkpoint this many times
# (a multi-worker trial once more only: its Train run already restarts failed workers itself)


@dataclass(frozen=True)
class Launch:
    """Where and how the trials of one Tune run train."""

    name: str                    # the Tune run's name: its folder under ``storage``
    storage: str                 # STORAGE: a local path or a bucket URI
    prepared: Path               # the prepared data folder
    info: cluster.ClusterInfo
    plan: cluster.TrialPlan

    @property
    def experiment_path(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"



def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def tuner(launch: Launch, fn: Any, callbacks: Sequence[Any], *, show_progress: bool, search_alg: Any = None,
          scheduler: Any = None, num_samples: int = 1, param_space: Mapping[str, Any] | None = None,
          stop: Any = None) -> Any:
    """A new ``Tuner``; the searcher and scheduler carry their own metrics; ``stop``: its stopper.
    Tune's result files are written by loggers that close them when the run ends
    (:mod:`~iaa.platform.sweeps.trials.result_files`)."""
    in_actor = launch.plan.in_actor
    return tune.Tuner(
        fn, param_space=dict(param_space or {}),
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=None if search_alg is not None else launch.plan.max_concurrent,
                                    reuse_actors=in_actor,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(
            name=launch.name, storage_path=launch.storage,
            failure_config=tune.FailureConfig(max_failures=max_failures(MAX_TRIAL_FAILURES if in_actor else 1)),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_SCORE,
                                                    checkpoint_score_order="max"),
            callbacks=[*callbacks, *result_files.loggers()], verbose=1 if show_progress else 0, stop=stop,
        ),
    )


def restore(launch: Launch, fn: Any) -> Any:
    """The interrupted Tune run of ``launch``: searcher, scheduler and callbacks as they were saved."""
    check_private(launch.experiment_path)
    if not tune.Tuner.can_restore(launch.experiment_path):
        raise IaaError(f"no Tune run to resume at {launch.experiment_path}; run the sweep without `resume`")
    saved_state.keep()
    try:
        for mended in lost_checkpoints.mend(analysis(launch.experiment_path).trials):
            _log.warning(f"Tune trial {mended.trial_id}: its last checkpoint ({mended.lost}) was deleted as the "
                         f"sweep was stopped, before the sweep's state was saved; it continues from "
                         f"{mended.used} and makes its later checks again")
        with _pending_trials_unsaid():               # the restore reads the run's results too
            return tune.Tuner.restore(launch.experiment_path, trainable=fn, resume_errored=True)
    except (ImportError, AttributeError) as err:    # Tune pickled the searcher and callbacks by module path
        raise IaaError(f"{launch.experiment_path}: the sweep's saved Tune state names code that this version of iaa "
                       f"does not have ({err}): another version saved it. Continue it with that version, or begin a "
                       f"new sweep from its trials with `warm_start` {launch.name}") from err


def run_tuner(launch: Launch, tuner_: Any, quiet: bool = False) -> tuple[Any, dict[str, str]]:
    """Run ``tuner_``; returns its ``ResultGrid`` and every trial's Tune status by trial id.

    ``quiet``: not even Tune's banner (its configuration box, results folder and TensorBoard
    hint, which its new output prints at every verbosity; the older one is silent at 0).
    """
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save the experiment state often, for --resume
    # SIGINT stays the command's (iaa.jobs.interrupt): Tune's own handler would spend seconds on a
    # last save and print its Tuner.restore advice, while --resume continues from the saved state
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    # Tune snapshots the experiment at every kept checkpoint (what --resume needs); don't warn about it.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # a trial's error reaches the driver only in Tune's log record of it: a full disk is read there
    # (iaa.platform.sweeps.trials.full_disk), so that record must be made
    os.environ["TUNE_PRINT_ALL_TRIAL_ERRORS"] = "1"
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    if quiet:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    side = driver_side.of(launch.name) if driver_side.is_bound(launch.name) else None
    try:
        with _tune_log_in_file(launch, quiet), full_disk.watching(side, launch.experiment_path):
            results = tuner_.fit()
    except Exception as err:
        full = full_disk.stopped_by(side, err, launch.experiment_path)
        if full is None:
            raise
        raise full from None
    finally:
        if quiet and before is None:
            del os.environ["RAY_AIR_NEW_OUTPUT"]
        elif quiet:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before
    full = full_disk.stopped_by(side, None, launch.experiment_path)
    if full is not None:                    # met as the last trials ended: the run is not whole either
        raise full
    return results, {t.trial_id: t.status for t in analysis(launch.experiment_path).trials}


def analysis(experiment_path: str) -> Any:
    """Tune's ``ExperimentAnalysis`` of the run at ``experiment_path``."""
    with _pending_trials_unsaid():
        return tune.ExperimentAnalysis(experiment_path)


@contextmanager
def _pending_trials_unsaid() -> Iterator[None]:
    """While Tune reads a run's results: a trial that had not reported yet (one a stop left
    pending) has no results file, which Tune logs as a warning naming its internal
    ``run_trial_ID``; the trial's record says it had no check, and a resume starts it."""
    logger = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def _tune_log_in_file(launch: Launch, quiet: bool) -> Iterator[None]:
    """While ``quiet``, Ray Tune's log (its warnings and advice) goes to ``STORAGE/NAME/tune.log``
    (a bucket: only its errors, to the console), not to the console; so do the lines the cluster
    publishes to drivers (a dead node's raylet log tail, ``[state-dump] ...``), which Ray prints on
    stdout from a thread of its own (:func:`~iaa.platform.cluster.driver_lines.cluster_lines_to`; a
    bucket: dropped)."""
    logger = logging.getLogger("ray.tune")
    if not quiet:
        yield
        return
    saved = (list(logger.handlers), logger.propagate, logger.level)
    handler: logging.Handler | None = None
    if is_remote_uri(launch.storage):
        logger.setLevel(logging.ERROR)
    else:
        folder = Path(launch.experiment_path)
        folder.mkdir(parents=True, exist_ok=True)
        handler = _LogFile(folder / "tune.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.handlers, logger.propagate = [handler], False
    try:
        with cluster_lines_to(handler):
            yield
    finally:
        logger.handlers, logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
        if handler is not None:
            handler.close()


class _LogFile(logging.FileHandler):
    """Tune's log file: a line it cannot write (a full disk) is lost, not reported on the console
    with a traceback (logging's own ``handleError``), which the command's one line replaces."""

    def handleError(self, record: logging.LogRecord) -> None:
        return None
