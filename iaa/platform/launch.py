"""Starting Tune runs of the trial function: the cluster, resources, names, Tuner, restore.

:func:`connect` builds one frozen :class:`Launch`: the Ray cluster it joined, what each trial
holds there (:func:`iaa.platform.cluster.plan`, so that trial drivers never hold the CPUs
their workers need) and where checkpoints go (``STORAGE/NAME``; ``STORAGE`` is
``--storage-path``, else ``WORKDIR/ray``). A sweep (:mod:`iaa.platform.tune`) and an
ensemble's members (:func:`train_many`) both start from it.

Run names are never reused: a folder that exists under the storage path belongs to another run
and is refused (:func:`claim`), never deleted.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray.tune as tune

from iaa.errors import IaaError
from iaa.files import is_remote_uri
from iaa.jobs.config import JobConfig, to_dict
from iaa.jobs.sweep import TrialRecord
from iaa.platform import cluster
from iaa.platform.ray_train import CHECKPOINT_SCORE
from iaa.platform.storage import check_private
from iaa.platform.trial import MEMBER_KEY, TrialSpec, records, run_trial
from iaa.platform.trial_runs import TrialRuns, child_runs

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


def storage_root(storage_path: str | None, workdir: Path) -> str:
    return storage_path or str((Path(workdir) / "ray").resolve())


def taken(storage: str, name: str) -> bool:
    """Whether ``STORAGE/NAME`` (a Tune run) or any ``STORAGE/NAME-train-*`` (its Train runs) exists."""
    if is_remote_uri(storage):
        import pyarrow.fs

        fs, root = pyarrow.fs.FileSystem.from_uri(storage)
        return fs.get_file_info(f"{root.rstrip('/')}/{name}").type != pyarrow.fs.FileType.NotFound
    return (Path(storage) / name).exists() or any(Path(storage).glob(f"{name}-train-*"))


def check_free(storage: str, name: str, folder: Path | None = None) -> None:
    """Refuse ``name`` when a run of that name exists under ``storage`` or ``folder`` exists."""
    if taken(storage, name) or (folder is not None and folder.exists()):
        where = storage if taken(storage, name) else folder
        raise IaaError(f"a run named {name!r} already exists ({where}): continue it with --resume {name}, "
                       "or choose another --name (nothing was deleted)")


def claim(storage: str, name: str, folder: Path) -> None:
    """Take ``name`` for a new run by creating ``folder``; refused when anything of that name exists."""
    check_free(storage, name, folder)
    try:
        folder.mkdir(parents=True, exist_ok=False)
    except FileExistsError as err:   # another process claimed it a moment ago
        raise IaaError(f"{folder} already exists: continue that run with --resume {name}, or choose another "
                       "--name (nothing was deleted)") from err


def connect(*, name: str, prepared: Path, workdir: Path, address: str | None, storage_path: str | None,
            workers_per_trial: int, gpus_per_worker: float, threads: int | None, max_concurrent: int | None,
            num_trials: int, show_progress: bool) -> Launch:
    """Join (or start) Ray and size the trials; see :func:`iaa.platform.cluster.fit_trials`."""
    info, plan = cluster.fit_trials(cluster.connect(address, storage_path), workers_per_trial, threads=threads,
                                    gpus_per_worker=gpus_per_worker, max_concurrent=max_concurrent,
                                    num_trials=num_trials)
    if show_progress:
        print(cluster.describe(info, plan), file=sys.stderr)
    return Launch(name=name, storage=storage_root(storage_path, workdir), prepared=Path(prepared), info=info,
                  plan=plan)


def trial_spec(launch: Launch, *, base: JobConfig | None = None, fixed: Mapping[str, Any] | None = None,
               members: Sequence[JobConfig] = ()) -> TrialSpec:
    from iaa.data.manifest import read

    manifest = read(launch.prepared) or {}
    return TrialSpec(name=launch.name, storage_path=launch.storage, workers=launch.plan.workers,
                     threads=launch.plan.threads, gpus_per_worker=launch.plan.gpus_per_worker,
                     worker_resources=dict(launch.plan.worker_resources),
                     base=to_dict(base) if base is not None else None, fixed=dict(fixed or {}),
                     members=tuple(to_dict(m) for m in members), vocab_hash=manifest.get("vocab_hash", ""),
                     prepared=str(launch.prepared.resolve()))


def trainable(launch: Launch, spec: TrialSpec) -> tuple[Any, int]:
    """The trial function with its data and resources, and the number of training rows."""
    from iaa.data.loader import PreparedData

    data = PreparedData.open(launch.prepared)
    train_rows = int(data.manifest["splits"]["train"]["count"])
    # one-worker trials share tables put once into the object store; Train workers read their own rows
    train, valid = (data.table("train"), data.table("valid")) if launch.plan.in_actor else (None, None)
    fn = tune.with_parameters(run_trial, spec=spec, train=train, valid=valid)
    return tune.with_resources(fn, dict(launch.plan.trial_resources)), train_rows


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def tuner(launch: Launch, fn: Any, callbacks: Sequence[Any], *, show_progress: bool, search_alg: Any = None,
          scheduler: Any = None, num_samples: int = 1, param_space: Mapping[str, Any] | None = None) -> Any:
    """A new ``Tuner``; the searcher and scheduler carry their own metrics."""
    in_actor = launch.plan.in_actor
    return tune.Tuner(
        fn, param_space=dict(param_space or {}),
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=launch.plan.max_concurrent, reuse_actors=in_actor,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(
            name=launch.name, storage_path=launch.storage,
            failure_config=tune.FailureConfig(max_failures=MAX_TRIAL_FAILURES if in_actor else 1),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_SCORE,
                                                    checkpoint_score_order="max"),
            callbacks=list(callbacks), verbose=1 if show_progress else 0,
        ),
    )


def restore(launch: Launch, fn: Any) -> Any:
    """The interrupted Tune run of ``launch``: searcher, scheduler and callbacks as they were saved."""
    check_private(launch.experiment_path)
    if not tune.Tuner.can_restore(launch.experiment_path):
        raise IaaError(f"no Tune run to resume at {launch.experiment_path}; run the sweep without --resume")
    return tune.Tuner.restore(launch.experiment_path, trainable=fn, resume_errored=True)


def fit(launch: Launch, tuner_: Any) -> tuple[Any, dict[str, str]]:
    """Run ``tuner_``; returns its ``ResultGrid`` and every trial's Tune status by trial id."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save the experiment state often, for --resume
    # Tune snapshots the experiment at every kept checkpoint (what --resume needs); don't warn about it.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    results = tuner_.fit()
    analysis = tune.ExperimentAnalysis(launch.experiment_path)
    return results, {t.trial_id: t.status for t in analysis.trials}


def train_many(configs: Sequence[JobConfig], prepared: Path, *, name: str, workdir: Path, tracking_uri: str,
               parent_run_id: str | None, experiment: str, address: str | None = None,
               storage_path: str | None = None, workers_per_trial: int = 1, gpus_per_worker: float = 0.0,
               show_progress: bool = True) -> list[TrialRecord]:
    """Train every config as a parallel Tune trial (no search, no early stopping).

    Each trial gets an MLflow child run under ``parent_run_id``. Trials use ``workers_per_trial``
    Train workers of ``gpus_per_worker`` GPUs and the configs' ``train.threads`` (the largest).
    Returns one record per config, in input order; ``checkpoint`` is ``None`` (status ``ERROR``)
    when a trial failed before its first check.
    """
    if not configs:
        return []
    storage = storage_root(storage_path, workdir)
    check_free(storage, name)
    threads = max(c.train.threads for c in configs) or None
    launch = connect(name=name, prepared=prepared, workdir=workdir, address=address, storage_path=storage_path,
                     workers_per_trial=workers_per_trial, gpus_per_worker=gpus_per_worker, threads=threads,
                     max_concurrent=None, num_trials=len(configs), show_progress=show_progress)
    spec = trial_spec(launch, members=configs)
    runs = TrialRuns(uri=tracking_uri, experiment=experiment, parent_run_id=parent_run_id, sweep=name,
                     dataset=configs[0].dataset, spec=spec)
    fn, _ = trainable(launch, spec)
    results, statuses = fit(launch, tuner(launch, fn, [runs], show_progress=show_progress,
                                          param_space={MEMBER_KEY: tune.grid_search(list(range(len(configs))))}))
    run_ids, tagged = child_runs(tracking_uri, experiment, name, parent_run_id)
    found = records(results, spec, statuses=statuses, run_ids=run_ids, tagged=tagged,
                    downloads=Path(workdir) / "sweeps" / name / "checkpoints")
    by_member = {int(r.params[MEMBER_KEY]): r for r in found}
    return [by_member.get(i) or TrialRecord(trial_id="", config=cfg, status="ERROR") for i, cfg in enumerate(configs)]
