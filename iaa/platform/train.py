"""``iaa-cli train``: one run, in this process or on Ray Train workers, logged to MLflow.

A run resumed with ``--resume`` continues the MLflow run that its run directory had (found by
the ``run_dir`` tag), so one directory has one run whose metrics go on where they stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iaa.jobs import train as train_job
from iaa.jobs.config import JobConfig, to_dict
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
) -> dict[str, Any]:
    """Train ``cfg`` on ``prepared``; ``workers > 0`` runs a Ray TorchTrainer with that many workers."""
    uri = tracking.open_store(tracking_uri, workdir)
    experiment = f"train-{cfg.dataset}"
    tags = {"dataset": cfg.dataset, "model": cfg.model.kind, "run_dir": str(run_dir), "workers": str(workers)}
    resume_id = previous_run(uri, experiment, Path(run_dir)) if resume else None
    with tracking.run_context(uri, experiment, Path(run_dir).name, tags=tags, resume_id=resume_id) as mlrun:
        if resume_id is None:
            mlrun.log_params(to_dict(cfg))
            mlrun.log_dataset(prepared)
        log = lambda metrics: mlrun.log_metrics(metrics, step=int(metrics.get("step", 0)))  # noqa: E731
        if workers <= 0:
            device = "cuda" if gpus_per_worker > 0 else "cpu"  # in process: --gpus-per-worker > 0 means this GPU
            result = train_job.run(cfg, prepared, Path(run_dir), resume=resume, on_metrics=log,
                                   show_progress=show_progress, device=device)
        else:
            from iaa.platform import ray_train

            result = ray_train.fit(cfg, prepared, Path(run_dir), workers=workers, gpus_per_worker=gpus_per_worker,
                                   resume=resume, address=address, storage_path=storage_path, on_metrics=log,
                                   show_progress=show_progress)
        mlrun.set_tags({"checkpoint": result.get("checkpoint", "")})
        if result.get("checkpoint"):
            from iaa.platform import mlflow_model

            result["model_uri"] = mlflow_model.try_log(uri, mlrun.run_id, [Path(result["checkpoint"])], prepared, register)
        mlrun.log_metrics({"final_best_valid_acc": result.get("best_valid_acc", 0.0)}, step=int(result.get("steps", 0)))
    return {**result, "valid_acc": result.get("best_valid_acc"), "tracking_uri": uri, "mlflow_run_id": mlrun.run_id}


def previous_run(uri: str, experiment: str, run_dir: Path) -> str | None:
    """The newest MLflow run of ``run_dir`` (tagged with it as given or as an absolute path)."""
    for spelling in dict.fromkeys([str(run_dir), str(run_dir.resolve())]):
        runs = tracking.find_runs(uri, experiment, {"run_dir": spelling})
        if runs:
            return runs[0].run_id
    return None
