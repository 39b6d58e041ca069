"""``iaa-cli train --workers N``: one run on N Ray Train workers, driven from this process.

:func:`fit_workers` trains on the workers (:mod:`iaa.platform.ray_train`); this process drives
it: it names the Ray run, forwards every check to ``metrics.jsonl`` and the tracker, and copies
the best and last checkpoints into the run folder, so the run folder looks as it does after a
local run (:func:`iaa.jobs.train.train.run`).
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

from iaa.errors import printable
from iaa.jobs.ports import CHECKPOINT_FILE, CHECKPOINT_SCORE, MetricsCallback, RestoresSpent, WorkersRequest
from iaa.jobs.workdir.paths import RunFolder
from iaa.platform.cluster.driver_lines import cluster_lines_to
from iaa.platform.ray_train import (FAILURE_KEY, MAX_FAILURES, build_trainer, max_failures, queue_callback,
                                    raise_failure)

DRIVER_LOG = "ray-driver.log"   # what the cluster tells the driver (a lost node's raylet log), not the console

_log = logging.getLogger(__name__)


def ray_run_name(run_dir: Path, *, resume: bool) -> tuple[str, str | None]:
    """The Ray Train run name of ``run_dir``, and the name of its own previous run to delete.

    A fresh run gets a new unique name (``<run folder>-<8 hex>``), recorded in the run folder, so
    two run folders that share a name and a ``--storage-path`` never touch each other's Ray runs;
    ``--resume`` reads the recorded name back (runs recorded before had the bare folder name).
    """
    import uuid

    from iaa.files import atomic_write_text

    marker = RunFolder(run_dir).ray_run_file
    previous = marker.read_text(encoding="utf-8").strip() if marker.exists() else None
    if resume:
        return previous or run_dir.name, None
    name = f"{run_dir.name}-{uuid.uuid4().hex[:8]}"
    atomic_write_text(marker, name)
    return name, previous


def remove_run(storage_path: str, name: str) -> None:
    """Delete this run folder's own previous Ray run (a fresh run under ``--overwrite``)."""
    if "://" not in storage_path:
        shutil.rmtree(Path(storage_path) / name, ignore_errors=True)
        return
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(storage_path)
    target = f"{root.rstrip('/')}/{name}"
    if fs.get_file_info(target).type != pyarrow.fs.FileType.NotFound:
        fs.delete_dir(target)


def _fetch(ckpt: Any, dest: Path) -> Path:
    """Copy the state file of a Ray checkpoint (local or in a bucket) to ``dest``."""
    from iaa.files import atomic_path

    with ckpt.as_directory() as folder, atomic_path(dest) as tmp:
        shutil.copyfile(Path(folder) / CHECKPOINT_FILE, tmp)
    return dest


class WorkerChecks:
    """While a Train run trains: each check that rank 0 reports, taken from the driver's queue
    (:func:`iaa.platform.ray_train.queue_callback`), goes to ``metrics.jsonl``, the progress line
    and ``on_metrics``, as the local trainer's checks do; each failure of the worker group that
    Train restores from the last checkpoint is one line (``restores``: how many it may take)."""

    def __init__(self, queue: Any, run_dir: Path, *, on_metrics: MetricsCallback | None, show_progress: bool,
                 restores: int = 0) -> None:
        self.queue, self.run_dir = queue, run_dir
        self.on_metrics, self.show_progress = on_metrics, show_progress
        self.restores, self.failures = restores, 0
        self.history: list[dict[str, Any]] = []
        self._done = threading.Event()
        self._drainer = threading.Thread(target=self._drain, name="iaa-metrics", daemon=True)

    def __enter__(self) -> WorkerChecks:
        self._drainer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._drainer.join(timeout=30)
        self.queue.shutdown()

    def _drain(self) -> None:
        from ray.util.queue import Empty

        while True:
            try:
                if self._done.is_set() and self.queue.empty():
                    return
                metrics = self.queue.get(timeout=0.5)
            except Empty:
                continue
            except Exception as err:  # noqa: BLE001 - the queue's actor lost: said once, not a thread's traceback
                _log.warning(f"the queue that brings the workers' checks here was lost with its node "
                             f"({type(err).__name__}): checks made after this are not in metrics.jsonl or the "
                             "run's tracked metrics")
                return
            self._record(metrics)

    def _record(self, metrics: dict[str, Any]) -> None:
        if FAILURE_KEY in metrics:
            self._failed(metrics[FAILURE_KEY])
            return
        self.history.append(metrics)
        RunFolder(self.run_dir).append_metrics(metrics)
        if self.show_progress:
            _log.info(f"check {metrics.get('checks')}: step {metrics.get('step')} epoch {metrics.get('epoch', 0):.2f} "
                      f"train_loss {metrics.get('train_loss', 0):.4f} valid_acc {metrics.get('valid_acc', 0):.4f} "
                      f"(best {metrics.get('best_valid_acc', 0):.4f})")
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    def _failed(self, failure: dict[str, Any]) -> None:
        """A failure of the worker group: Train restores it from the last checkpoint while restores
        are left (said here), else the run fails (said by the command's error)."""
        self.failures += 1
        if not self.show_progress or self.failures > self.restores:
            return
        what = "lost a worker (its process or node died)" if failure.get("lost") else \
            f"failed: {printable(failure.get('error') or 'a worker raised')}"
        checks = self.history[-1].get("checks") if self.history else None
        since = f"check {checks}" if checks else "the start (no check yet)"
        _log.warning(f"the run {what}; restore {self.failures} of {self.restores}: it continues from {since} once "
                     "the cluster has room for all its workers again (a lost node's share: until one joins)")


def fit_hearing_signals(trainer: Any) -> Any:
    """``trainer.fit()`` in a thread of its own, the main thread waiting on it.

    Train V2's ``fit``, called in the main thread, takes SIGINT for itself: it aborts the run and
    ends the process (status 1, not a word said), so the command's own stop never ran: no line
    that says how to resume, its MLflow run FAILED. Off the main thread ``fit`` leaves the handler
    alone (as under Tune), and Ctrl-C stops the command as SIGTERM does; the worker group ends
    with the process, as it does then."""
    done: dict[str, Any] = {}

    def fit() -> None:
        try:
            done["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 - raised again in the main thread
            done["error"] = error

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)                       # short waits: a signal's handler runs between them
    if "error" in done:
        raise done["error"]
    return done["result"]


def fit_or_fail(trainer: Any, name: str) -> Any:
    """:func:`fit_hearing_signals`, its failures raised as the run's error (:func:`raise_failure`),
    and the loss of the actor that drives the run (its controller, gone with its node or with the
    cluster's head) as :class:`~iaa.jobs.ports.RestoresSpent`: the last checkpoint stands, and
    the command says how to continue, where Ray would print a traceback (or hang, reporting it
    to a dead head)."""
    import ray
    from ray.train import TrainingFailedError

    try:
        return fit_hearing_signals(trainer)
    except TrainingFailedError as err:         # Train V2's fit raises what failed the run
        raise_failure(name, err)
    except ray.exceptions.RayActorError as err:
        raise RestoresSpent(f"Ray Train run {name} lost the actor that drives it ({type(err).__name__}: the node it "
                            "ran on, or the cluster's head node, died)") from err


def fit_workers(request: WorkersRequest, *, address: str | None = None,
                storage_path: str | None = None) -> dict[str, Any]:
    """Train ``request.cfg`` with the job's loop ``request.fit`` on ``request.workers`` Ray Train
    workers; returns the final metrics and checkpoint.

    Checkpoints go to ``STORAGE/<run folder name>-<id>`` (:func:`ray_run_name`; ``storage_path`` is the
    user's ``--storage-path``, checked against the cluster); the best and the last are copied to
    ``RUN_FOLDER/checkpoints/{best,last}.pt``, and every check is appended to
    ``RUN_FOLDER/metrics.jsonl`` as with the local trainer.

    Returns:
        The last check's metrics with ``best_valid_acc``, ``steps``, ``stop_reason``,
        ``checkpoint`` (the best checkpoint file, loadable by ``checkpoint.load_model``) and
        ``run_dir``.
    """
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from iaa.data.loading.loader import PreparedData
    from iaa.platform.cluster import connect as cluster

    cfg, workers, storage = request.cfg, request.workers, request.storage
    run_dir = request.folder.path.resolve()
    info, trial_plan = cluster.fit_trials(cluster.connect(address, storage_path), workers,
                                          threads=cfg.train.threads or None, gpus_per_worker=request.gpus_per_worker,
                                          sweep=False)
    name = _start_run_folder(run_dir, storage, resume=request.resume)
    data = PreparedData.open(Path(request.prepared))
    if request.show_progress:
        _log.info(cluster.describe(info, trial_plan, one_run=True))

    # the queue lives on the driver's node, as Train's controller does: a worker node that dies
    # takes its workers with it (Train restarts them), never the checks on their way here
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)})
    trainer = build_trainer(cfg, Path(request.prepared), fit=request.fit, name=name, storage_path=storage,
                            workers=workers, threads=trial_plan.threads,
                            worker_resources=trial_plan.worker_resources, use_gpu=request.gpus_per_worker > 0,
                            vocab_hash=data.manifest.vocab_hash, callbacks=[queue_callback(queue)],
                            show_progress=request.show_progress)
    with WorkerChecks(queue, run_dir, on_metrics=request.on_metrics, show_progress=request.show_progress,
                 restores=max_failures(MAX_FAILURES)) as checks, \
            cluster_lines_to(run_dir / DRIVER_LOG):     # a dead node's raylet dump: to the run folder's log
        result = fit_or_fail(trainer, name)
    if result.error is not None:
        raise_failure(name, result.error)
    best_file = _copy_checkpoints(result, name, RunFolder(run_dir))
    last = checks.history[-1] if checks.history else dict(result.metrics or {})
    return {**last, "best_valid_acc": last.get("best_valid_acc", -1.0), "steps": last.get("steps", 0),
            "stop_reason": last.get("stop_reason", ""), "checkpoint": str(best_file), "run_dir": str(run_dir),
            "ray_storage": f"{storage.rstrip('/')}/{name}", "workers": workers, "threads": trial_plan.threads}


def _start_run_folder(run_dir: Path, storage: str, *, resume: bool) -> str:
    """Create ``run_dir`` and name its Ray run (:func:`ray_run_name`); returns the name.

    A fresh run deletes the folder's own previous Ray run under ``storage`` and what an earlier run
    left in the folder; a resumed run keeps both.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    name, previous = ray_run_name(run_dir, resume=resume)
    if not resume:
        if previous:
            remove_run(storage, previous)
        RunFolder(run_dir).clear()
    return name


def _copy_checkpoints(result: Any, name: str, folder: RunFolder) -> Path:
    """Copy the best and the last checkpoint of Ray Train run ``name``'s ``result`` into ``folder``.

    Returns the best checkpoint's file; :class:`RuntimeError` when the run reported none.
    """
    best = result.get_best_checkpoint(metric=CHECKPOINT_SCORE, mode="max")
    if best is None:
        raise RuntimeError(f"Ray Train run {name} reported no checkpoint")
    best_file = _fetch(best, folder.best)
    if result.checkpoint is not None:
        _fetch(result.checkpoint, folder.last)
    return best_file
