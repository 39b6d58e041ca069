"""One Ray Tune trial: the function every sweep trial and every ``train_many`` member runs.

Kept free of MLflow and of the driver's code so that a trial actor starts fast: it imports
torch, the model and the loop (the job's ``fit``, carried by :class:`TrialSpec`), nothing more.
All tracking happens in the driver (see :mod:`iaa.platform.sweeps.trials.trial_runs`), which also keeps a
SQLite store usable on multi-node clusters.

- One worker per trial: the loop runs inside the trial actor on a
  :class:`~iaa.platform.ray_train.TuneLink`, which reports through ``ray.tune.report`` with a
  checkpoint (the lowest start-up overhead).
- N > 1 workers: the trial actor is a light driver (0.01 CPU) that runs a TorchTrainer on N
  workers, with ``TuneReportCallback`` forwarding rank 0's metrics and checkpoint path to Tune
  (Ray Train V2's supported Tune pattern). The Train run is named after the trial, so a trial
  resumed by ``Tuner.restore`` resumes its Train run from the last checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping

import pyarrow as pa

from iaa import logs
from iaa.files import is_remote_uri
from iaa.jobs.config.job_config import JobConfig, apply, from_dict
from iaa.jobs.ports import (CHECKPOINT_FILE, CHECKPOINT_SCORE, MEMBER_KEY, TIME_BUDGET, WORKER_LOST, TrialRecord,
                            WorkerData, WorkerFit)
from iaa.platform.ray_train import TuneLink, build_trainer
from iaa.platform.cluster.lost import worker_lost
from iaa.platform.cluster.resources import train_device



@dataclass(frozen=True)
class TrialSpec:
    """What every trial of one Tune run shares (passed once through ``tune.with_parameters``).

    Either ``base`` (a sweep: each trial's config is ``base`` plus ``fixed`` plus its sampled
    values) or ``members`` (``train_many``: trial ``i`` trains ``members[i]``), as ``to_dict`` dicts.
    """

    name: str                                # the Tune run's name
    fit: WorkerFit                           # the job's loop, run in each trial (or its Train workers)
    storage_path: str                        # where Tune (and Train runs) keep checkpoints
    workers: int
    threads: int
    gpus_per_worker: float = 0.0
    worker_resources: dict[str, float] = field(default_factory=dict)
    base: dict[str, Any] | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    members: tuple[dict[str, Any], ...] = ()
    vocab_hash: str = ""
    vocab: Mapping[str, Any] = field(default_factory=dict)   # manifest.vocab_card, read in the driver
    prepared: str = ""                       # the data folder: Train workers read their rows from it

    def train_run_name(self, trial_id: str) -> str:
        """The Ray Train run of a multi-worker trial, under ``storage_path``."""
        return f"{self.name}-train-{trial_id}"


def job_config(spec: TrialSpec, trial_config: Mapping[str, Any]) -> JobConfig:
    """The full job config of a trial from its Tune config (sampled values or member index)."""
    if MEMBER_KEY in trial_config:
        return from_dict(spec.members[int(trial_config[MEMBER_KEY])])
    if spec.base is None:
        raise ValueError("a sweep trial needs TrialSpec.base")
    return apply(from_dict(spec.base), {**spec.fixed, **trial_config})


def run_trial(config: dict[str, Any], *, spec: TrialSpec, train: pa.Table, valid: pa.Table) -> None:
    """The Tune function trainable (wrapped with ``tune.with_parameters(spec=, train=, valid=)``).

    A full disk ends the trial with a DiskFullError naming the file or folder it could not write
    (:func:`iaa.platform.sweeps.trials.full_disk.in_trial`), which ends the sweep without a traceback."""
    logs.in_worker()
    try:
        _run_trial(config, spec, train, valid)
    except Exception as err:
        import ray.tune

        from iaa.platform.sweeps.trials.full_disk import in_trial

        full = in_trial(err, trial_folder(spec, ray.tune.get_context().get_trial_id()))
        if full is err:
            raise
        raise full from None


def trial_folder(spec: TrialSpec, trial_id: str) -> str:
    """Where Ray keeps a trial's checkpoints: its folder of the Tune run, or its own Train run's."""
    name = spec.train_run_name(trial_id) if spec.workers > 1 else f"{spec.name}/{trial_id}"
    return f"{spec.storage_path.rstrip('/')}/{name}"


def _run_trial(config: dict[str, Any], spec: TrialSpec, train: pa.Table, valid: pa.Table) -> None:
    cfg = job_config(spec, config)
    if spec.workers == 1:
        spec.fit(cfg, TuneLink(train_device(spec.gpus_per_worker)),
                 WorkerData(vocab_hash=spec.vocab_hash, train=train, valid=valid, vocab=spec.vocab), threads=spec.threads)
        return
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(cfg, Path(spec.prepared), fit=spec.fit, name=spec.train_run_name(trial_id),
                            storage_path=spec.storage_path, workers=spec.workers, threads=spec.threads, worker_resources=spec.worker_resources,
                            use_gpu=spec.gpus_per_worker > 0, vocab_hash=spec.vocab_hash,
                            callbacks=[TuneReportCallback()])
    result = trainer.fit()
    if result.error is not None:
        raise result.error


# --- from Tune's results to typed records (in the driver) -------------------------------------------


def _best_checkpoint(result: Any, spec: TrialSpec, trial_id: str) -> str | None:
    """The best checkpoint directory of one trial (the last check that improved ``valid_acc``)."""
    if spec.workers > 1:  # the trial's Train run holds them
        import ray.train

        path = f"{spec.storage_path.rstrip('/')}/{spec.train_run_name(trial_id)}"
        try:
            train_run = ray.train.Result.from_path(path)
        except (FileNotFoundError, RuntimeError, ValueError):   # the trial never started its Train run
            train_run = None
        best = train_run.get_best_checkpoint(CHECKPOINT_SCORE, "max") if train_run is not None else None
        if best is not None:
            return best.path
    scored = [(float(m.get(CHECKPOINT_SCORE, -1.0)), c.path) for c, m in (result.best_checkpoints or [])]
    scored = [s for s in scored if s[0] >= 0]
    return max(scored)[1] if scored else None


def local_checkpoint(ckpt_dir: str | None, storage: str, dest: Path | None) -> str | None:
    """A checkpoint file readable here: in place on a local/NFS store, downloaded from a bucket to
    ``dest`` (None: not fetched, and none is named)."""
    if ckpt_dir is None:
        return None
    source = f"{str(ckpt_dir).rstrip('/')}/{CHECKPOINT_FILE}"
    if not is_remote_uri(storage):
        return source
    if dest is None:
        return None
    import pyarrow.fs

    fs, _ = pyarrow.fs.FileSystem.from_uri(storage)
    dest.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(source, str(dest), source_filesystem=fs)
    return str(dest)


def records(results: Any, spec: TrialSpec, *, statuses: Mapping[str, str], run_ids: Mapping[str, str],
            tagged: Mapping[str, str], downloads: Path | None, names: Mapping[str, str] | None = None,
            cut: Collection[str] = ()) -> list[TrialRecord]:
    """One record per trial of a Tune ``ResultGrid``.

    Args:
        statuses: Tune's last saved status by trial id, for trials without an error (one a run left
            unfinished is not TERMINATED); a trial with an error is ERROR, and one that lost its
            worker with no restores left has the stop reason ``WORKER_LOST``. Tune saves a
            running trial as PENDING (to start it again on a restore): one that had reported a
            check is RUNNING.
        run_ids: the trials' MLflow child runs by trial id.
        tagged: the checkpoint directories that the child runs' tags name (a fallback).
        downloads: where checkpoints kept in a bucket are copied (None: they are not, and a
            trial's record names none).
        names: each trial's one name by trial id.
        cut: the trials that the sweep's time budget stopped (stop reason ``TIME_BUDGET``).
    """
    out = []
    for result in results:
        metrics = result.metrics or {}
        # a trial that never reported holds the default result of the actor Tune gave it, which a
        # reused actor fills with the trial it ran before: its folder (named by its id) names it
        trial_id = (metrics.get("trial_id") if "checks" in metrics else None) or Path(result.path).name
        # fit returned, so a trial with an error ended ERROR, whatever Tune's last saved state says
        status = "ERROR" if result.error else statuses.get(trial_id) or "TERMINATED"
        if status == "PENDING" and "checks" in metrics:
            status = "RUNNING"
        best_acc = metrics.get("best_valid_acc")
        ckpt = _best_checkpoint(result, spec, trial_id) or tagged.get(trial_id)
        out.append(TrialRecord(
            trial_id=trial_id,
            config=job_config(spec, result.config or {}),
            params=dict(result.config or {}),
            best_valid_acc=float(best_acc) if best_acc is not None else None,
            checkpoint=local_checkpoint(ckpt, spec.storage_path, downloads / f"{trial_id}.pt" if downloads else None),
            mlflow_run_id=run_ids.get(trial_id),
            status=status,
            checks=int(metrics.get("checks", 0) or 0),
            steps=int(metrics.get("steps", 0) or 0),
            stop_reason=_stop_reason(metrics, status, result.error, trial_id in cut),
            error=str(result.error)[:2000] if result.error else None,
            name=(names or {}).get(trial_id, ""),
            seconds=round(float(metrics["time_total_s"]), 1) if metrics.get("time_total_s") is not None else None,
        ))
    return out


def _stop_reason(metrics: Mapping[str, Any], status: str, error: Any, cut: bool) -> str:
    """Why a trial ended: the loop names its own reason in its last report; a trial that ended
    with none was stopped by the time budget (``cut``) or else by ASHA."""
    if metrics.get("stop_reason"):
        return str(metrics["stop_reason"])
    if status == "TERMINATED":
        return TIME_BUDGET if cut else "asha"
    return WORKER_LOST if worker_lost(error) else ""
