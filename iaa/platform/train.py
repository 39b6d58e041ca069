"""``iaa-cli train``: one run, in this process or on Ray Train workers, logged to MLflow.

A run resumed with ``--resume`` continues the MLflow run that its run directory had (found by
the ``run_dir`` tag), so one directory has one run whose metrics go on where they stopped.

With ``--workers N`` (:func:`fit_workers`) the run trains on N Ray Train workers
(:mod:`iaa.platform.ray_train`); this process drives it: it names the Ray run, forwards every
check to ``metrics.jsonl`` and MLflow, and copies the best and last checkpoints into the run
folder, so the run folder looks as it does after a local run.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from iaa.jobs import checkpoint, precision
from iaa.jobs import train as train_job
from iaa.jobs.config import JobConfig, to_dict
from iaa.jobs.session import CHECKPOINT_FILE, MetricsCallback
from iaa.platform import tracking


def run(
    cfg: JobConfig,
    prepared: Path,
    run_dir: Path,
    *,
    resume: bool = False,
    workers: int = 0,
    gpus_per_worker: float = 0.0,
    workdir: Path = Path("iaa-work"),
    tracking_uri: str | None = None,
    address: str | None = None,
    storage_path: str | None = None,
    show_progress: bool = True,
    register: str | None = None,
    train_rows: Any = None,
    teacher: Path | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` on ``prepared``; ``workers > 0`` runs a Ray TorchTrainer with that many workers.

    ``train_rows`` (a pyarrow Table) replaces the prepared training split, in process only: the
    distillation job passes the rows with their teacher distributions, and ``teacher`` (the
    teacher's Parquet file) is then logged as an input of the run.
    """
    if train_rows is not None and workers > 0:
        raise ValueError("training on given rows (distillation) runs in process, not on Ray Train workers")
    uri = tracking.open_store(tracking_uri, workdir)
    experiment = f"train-{cfg.dataset}"
    tags = {"dataset": cfg.dataset, "model": cfg.model.kind, "run_dir": str(run_dir), "workers": str(workers),
            **(tags or {})}
    resume_id = previous_run(uri, experiment, Path(run_dir)) if resume else None
    # auto -> fp32 or bf16 here, once: the MLflow params record it, and every worker uses it
    cfg = precision.resolved(cfg, "cuda" if gpus_per_worker > 0 else "cpu")
    with tracking.run_context(uri, experiment, Path(run_dir).name, tags=tags, resume_id=resume_id) as mlrun:
        if resume_id is None:
            mlrun.log_params(to_dict(cfg))
            mlrun.log_dataset(prepared)
            if teacher is not None:
                mlrun.log_file_input(Path(teacher), context="teacher")
        log = lambda metrics: mlrun.log_metrics(metrics, step=int(metrics.get("step", 0)))  # noqa: E731
        if workers <= 0:
            device = "cuda" if gpus_per_worker > 0 else "cpu"  # in process: --gpus-per-worker > 0 means this GPU
            result = train_job.run(cfg, prepared, Path(run_dir), resume=resume, on_metrics=log,
                                   show_progress=show_progress, device=device, train_rows=train_rows)
        else:
            result = fit_workers(cfg, prepared, Path(run_dir), workers=workers, gpus_per_worker=gpus_per_worker,
                                 resume=resume, address=address, storage_path=storage_path, on_metrics=log,
                                 show_progress=show_progress)
        mlrun.set_tags({"checkpoint": result.get("checkpoint", "")})
        if result.get("checkpoint"):
            from iaa.platform import mlflow_model

            result["model_uri"] = mlflow_model.try_log(uri, mlrun.run_id, [Path(result["checkpoint"])], prepared, register,
                                                       run=mlrun)
        mlrun.log_metrics({"final_best_valid_acc": result.get("best_valid_acc", 0.0)}, step=int(result.get("steps", 0)))
    return {**result, "valid_acc": result.get("best_valid_acc"), "tracking_uri": uri, "mlflow_run_id": mlrun.run_id}


def previous_run(uri: str, experiment: str, run_dir: Path) -> str | None:
    """The newest MLflow run of ``run_dir`` (tagged with it as given or as an absolute path)."""
    for spelling in dict.fromkeys([str(run_dir), str(run_dir.resolve())]):
        runs = tracking.find_runs(uri, experiment, {"run_dir": spelling})
        if runs:
            return runs[0].run_id
    return None


# --- train --workers N ---------------------------------------------------------------------------


RAY_RUN_FILE = "ray_run_name"      # in the run folder: the name of its Ray Train run under the storage path


def ray_run_name(run_dir: Path, *, resume: bool) -> tuple[str, str | None]:
    """The Ray Train run name of ``run_dir``, and the name of its own previous run to delete.

    A fresh run gets a new unique name (``<run folder>-<8 hex>``), recorded in the run folder, so
    two run folders that share a name and a ``--storage-path`` never touch each other's Ray runs;
    ``--resume`` reads the recorded name back (runs recorded before had the bare folder name).
    """
    import uuid

    from iaa.files import atomic_write_text

    marker = run_dir / RAY_RUN_FILE
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


class _Checks:
    """While a Train run trains: each check that rank 0 reports, taken from the driver's queue
    (:func:`iaa.platform.ray_train.queue_callback`), goes to ``metrics.jsonl``, the progress line
    and ``on_metrics``, as the local trainer's checks do."""

    def __init__(self, queue: Any, run_dir: Path, *, on_metrics: MetricsCallback | None, show_progress: bool) -> None:
        self.queue, self.run_dir = queue, run_dir
        self.on_metrics, self.show_progress = on_metrics, show_progress
        self.history: list[dict[str, Any]] = []
        self._done = threading.Event()
        self._drainer = threading.Thread(target=self._drain, name="iaa-metrics", daemon=True)

    def __enter__(self) -> _Checks:
        self._drainer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._drainer.join(timeout=30)
        self.queue.shutdown()

    def _drain(self) -> None:
        while not (self._done.is_set() and self.queue.empty()):
            try:
                metrics = self.queue.get(timeout=0.5)
            except Exception:  # noqa: BLE001 - ray.util.queue.Empty on timeout
                continue
            self._record(metrics)

    def _record(self, metrics: dict[str, Any]) -> None:
        self.history.append(metrics)
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps({**metrics, "time": time.time()}, default=str) + "\n")
        if self.show_progress:
            print(f"check {metrics.get('checks')}: step {metrics.get('step')} epoch {metrics.get('epoch', 0):.2f} "
                  f"train_loss {metrics.get('train_loss', 0):.4f} valid_acc {metrics.get('valid_acc', 0):.4f} "
                  f"(best {metrics.get('best_valid_acc', 0):.4f})", file=sys.stderr)
        if self.on_metrics is not None:
            self.on_metrics(metrics)


def fit_workers(
    cfg: JobConfig,
    prepared: Path,
    run_dir: Path,
    *,
    workers: int,
    gpus_per_worker: float = 0.0,
    resume: bool = False,
    address: str | None = None,
    storage_path: str | None = None,
    on_metrics: MetricsCallback | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Train ``cfg`` on ``workers`` Ray Train workers; returns the final metrics and checkpoint.

    Checkpoints go to ``STORAGE/<run_dir name>-<id>`` (:func:`ray_run_name`; ``STORAGE``: ``storage_path``, else
    ``run_dir/ray``); the best and the last are copied to ``run_dir/checkpoints/{best,last}.pt``,
    and every check is appended to ``run_dir/metrics.jsonl`` as with the local trainer.

    Returns:
        The last check's metrics with ``best_valid_acc``, ``steps``, ``stop_reason``,
        ``checkpoint`` (the best checkpoint file, loadable by ``checkpoint.load_model``) and
        ``run_dir``.
    """
    from ray.train import TrainingFailedError
    from ray.util.queue import Queue

    from iaa.data.loader import PreparedData
    from iaa.platform import cluster
    from iaa.platform.ray_train import CHECKPOINT_SCORE, build_trainer, queue_callback, raise_failure

    run_dir = Path(run_dir).resolve()
    info, trial_plan = cluster.fit_trials(cluster.connect(address, storage_path), workers,
                                          threads=cfg.train.threads or None, gpus_per_worker=gpus_per_worker,
                                          sweep=False)
    storage = storage_path or str(run_dir / "ray")
    run_dir.mkdir(parents=True, exist_ok=True)
    name, previous = ray_run_name(run_dir, resume=resume)
    if not resume:
        if previous:
            remove_run(storage, previous)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    data = PreparedData.open(Path(prepared))
    if show_progress:
        print(cluster.describe(info, trial_plan).replace("each trial trains", "the run trains"), file=sys.stderr)

    queue = Queue(actor_options={"num_cpus": 0})
    trainer = build_trainer(cfg, Path(prepared), name=name, storage_path=storage,
                            workers=workers, threads=trial_plan.threads,
                            worker_resources=trial_plan.worker_resources, use_gpu=gpus_per_worker > 0,
                            vocab_hash=data.manifest.get("vocab_hash", ""), callbacks=[queue_callback(queue)])
    with _Checks(queue, run_dir, on_metrics=on_metrics, show_progress=show_progress) as checks:
        try:
            result = trainer.fit()
        except TrainingFailedError as err:     # Train V2's fit raises what failed the run
            raise_failure(name, err)
    if result.error is not None:
        raise_failure(name, result.error)
    best = result.get_best_checkpoint(metric=CHECKPOINT_SCORE, mode="max")
    if best is None:
        raise RuntimeError(f"Ray Train run {name} reported no checkpoint")
    best_file = _fetch(best, run_dir / "checkpoints" / checkpoint.BEST)
    if result.checkpoint is not None:
        _fetch(result.checkpoint, run_dir / "checkpoints" / checkpoint.LAST)
    last = checks.history[-1] if checks.history else dict(result.metrics or {})
    return {**last, "best_valid_acc": last.get("best_valid_acc", -1.0), "steps": last.get("steps", 0),
            "stop_reason": last.get("stop_reason", ""), "checkpoint": str(best_file), "run_dir": str(run_dir),
            "ray_storage": f"{storage.rstrip('/')}/{name}", "workers": workers, "threads": trial_plan.threads}
