"""Data-parallel training on Ray Train (V2): the loop of :mod:`iaa.jobs.training.loop` on N workers.

Going distributed changes only what the loop's :class:`~iaa.jobs.training.session.ClusterSession` gets from
its :class:`~iaa.jobs.ports.WorkerLink`, and where its rows come from:

- **data**: each worker reads its own rows of the training split from the prepared folder's
  Parquet shards (:meth:`iaa.data.loading.loader.PreparedData.rank_rows`: a contiguous share, the same on
  every restart) and cuts them into length-bucketed batches by (seed, epoch) with
  :func:`iaa.data.loading.loader.iter_batches`; nothing goes through the driver or the object store.
  Each worker reads the (small) validation split whole and scores its rank's disjoint share of the
  loader's batch plan, so every example counts exactly once. On a cluster the prepared folder
  must be on storage every node sees;
- **all-reduce**: validation sums and the stop signal go through ``torch.distributed``
  (gloo on CPU, NCCL on GPU), so only rank 0's metrics need reaching Ray;
- **model**: ``ray.train.torch.prepare_model`` (device + DDP);
- **report**: ``ray.train.report`` on every worker (it is a barrier) with a checkpoint that
  rank 0 writes into a temporary directory (:meth:`iaa.jobs.training.session.SessionBase.report`).

The loop itself is the job's (:func:`iaa.jobs.training.loop.fit_on_worker`), handed in as ``fit``.

A worker failure is retried from the last checkpoint up to ``MAX_FAILURES`` times (``IAA_MAX_FAILURES``). Train V2
restores a run whose ``RunConfig(name, storage_path)`` is unchanged, which is how ``--resume``
and a restored Tune trial continue. The ``train --workers N`` driver is
:func:`iaa.platform.train_workers.fit_workers`; a multi-worker Tune trial runs :func:`build_trainer`
from :func:`iaa.platform.sweeps.trials.trial.run_trial`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, ContextManager, Iterator, NoReturn, Sequence

import torch
from torch import nn

from iaa import logs
from iaa.errors import IaaError, brief
from iaa.jobs.config.job_config import JobConfig, from_dict, to_dict
from iaa.jobs.ports import CHECKPOINT_SCORE, RestoresSpent, WorkerData, WorkerFit
from iaa.platform.cluster.lost import worker_lost
from iaa.platform.cluster.resources import forced_device

MAX_FAILURES = 2              # worker-group restarts from the last checkpoint before a run fails
MAX_FAILURES_ENV = "IAA_MAX_FAILURES"   # overrides it, and a sweep's trial restores: 0 switches restores off


def max_failures(default: int) -> int:
    """Restores from the last checkpoint before a Train run or a sweep's trial fails: ``default``,
    or ``IAA_MAX_FAILURES`` when set (0: none, the first lost node fails the trial or run)."""
    import os

    raw = os.environ.get(MAX_FAILURES_ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise IaaError(f"{MAX_FAILURES_ENV}={raw!r} is not a whole number of restores") from None
    if value < 0:
        raise IaaError(f"{MAX_FAILURES_ENV}={raw!r}: give 0 or more restores")
    return value


class TrainRunError(IaaError):
    """A Ray Train run failed for a reason its workers named (an expected failure on a worker)."""


# --- the cluster side of a worker's session ---------------------------------------------------------


@contextmanager
def _folder(ckpt: Any) -> Iterator[Path | None]:
    """The local folder of a Ray checkpoint, while it is read (None for no checkpoint)."""
    if ckpt is None:
        yield None
        return
    with ckpt.as_directory() as folder:
        yield Path(folder)


class TuneLink:
    """A one-worker Tune trial (:class:`iaa.jobs.ports.WorkerLink`): reports through ``ray.tune.report``."""

    rank, world_size = 0, 1

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        return [float(v) for v in values]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def last_checkpoint(self) -> ContextManager[Path | None]:
        import ray.tune

        return _folder(ray.tune.get_checkpoint())

    def publish(self, metrics: dict[str, Any], folder: Path | None) -> None:
        import ray.tune

        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(folder))


class TrainLink:
    """A Ray Train worker (:class:`iaa.jobs.ports.WorkerLink`): its GPU, all-reduce over the worker
    group, DDP, ``ray.train.report``."""

    def __init__(self) -> None:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        # the GPU Ray assigned to this worker, unless IAA_TRAIN_DEVICE=cpu forces the CPU
        self.device = torch.device("cpu") if forced_device() == "cpu" else ray.train.torch.get_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)      # this rank's context, RNG and kernels on its own GPU

    def all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        if self.world_size == 1:
            return [float(v) for v in values]
        device = self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(tensor, op={"sum": torch.distributed.ReduceOp.SUM,
                                                 "min": torch.distributed.ReduceOp.MIN}[op])
        return tensor.cpu().tolist()

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        # Some configs leave parameters unused (T=1 skips the later search steps; the AS reader
        # has no search gates), which plain DDP rejects.
        if self.device.type == "cpu" and forced_device() == "cpu":   # GPU workers forced onto the CPU
            return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        return ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": True})

    def last_checkpoint(self) -> ContextManager[Path | None]:
        import ray.train

        return _folder(ray.train.get_checkpoint())

    def publish(self, metrics: dict[str, Any], folder: Path | None) -> None:
        """``ray.train.report`` on every rank (a barrier); only rank 0 has a checkpoint ``folder``."""
        import ray.train

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder) if folder else None)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """The Ray Train worker entry point: the job's loop (``config["fit"]``) on a :class:`TrainLink`."""
    import ray.util

    logs.in_worker()
    prepared = config["prepared"]
    if not Path(prepared).is_dir():
        raise IaaError(f"the prepared data folder {prepared} is not visible on node {ray.util.get_node_ip_address()}; "
                       "on a cluster, put it on storage that every node mounts at the same path")
    config["fit"](from_dict(config["job"]), TrainLink(),
                  WorkerData(vocab_hash=config.get("vocab_hash", ""), prepared=prepared,
                             show_progress=config.get("show_progress", False)), threads=config["threads"])


# --- building a trainer ----------------------------------------------------------------------------


def process_group_backend(use_gpu: bool) -> str:
    """NCCL between GPU workers (one GPU per rank), gloo on CPUs and for GPU workers forced onto the CPU."""
    return "nccl" if use_gpu and forced_device() != "cpu" else "gloo"


def job_for_workers(cfg: JobConfig, world_size: int, use_gpu: bool) -> JobConfig:
    """The config the workers build: NCCL cannot all-reduce sparse gradients, so GPUs use dense ones."""
    if world_size > 1 and use_gpu and getattr(cfg.model, "sparse_embedding_grad", False):
        return replace(cfg, model=replace(cfg.model, sparse_embedding_grad=False))
    return cfg


def build_trainer(cfg: JobConfig, prepared: Path, *, fit: WorkerFit, name: str, storage_path: str, workers: int,
                  threads: int, worker_resources: dict[str, float], use_gpu: bool, vocab_hash: str = "",
                  callbacks: Sequence[Any] = (), show_progress: bool = False) -> Any:
    """A TorchTrainer running :func:`train_loop_per_worker` (the job's ``fit``) on ``workers`` workers.

    The workers read their rows of ``prepared`` themselves; with ``show_progress``, rank 0 shows
    its progress bar. Checkpoints go to ``storage_path/name``; the best by ``valid_acc`` and the
    latest are kept.
    """
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    job = job_for_workers(cfg, workers, use_gpu)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": to_dict(job), "fit": fit, "threads": threads, "vocab_hash": vocab_hash, "world_size": workers,
                           "prepared": str(Path(prepared).resolve()), "show_progress": show_progress},
        torch_config=TorchConfig(backend=process_group_backend(use_gpu)),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu,
                                               resources_per_worker=dict(worker_resources)),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage_path,
            failure_config=ray.train.FailureConfig(max_failures=max_failures(MAX_FAILURES)),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_SCORE,
                                                         checkpoint_score_order="max"),
            callbacks=list(callbacks),
        ),
    )


FAILURE_KEY = "worker_failure"   # a queued failure of the worker group, beside rank 0's checks


def queue_callback(queue: Any) -> Any:
    """A Train callback that forwards rank 0's metrics from the controller to the driver's queue,
    and each failure of the worker group (``{FAILURE_KEY: {"lost": ..., "error": ...}}``): Train
    then restores the group from the last checkpoint, or fails the run once its restores are spent."""
    from ray.train import UserCallback

    class QueueCallback(UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if metrics:
                queue.put({**metrics[0], "checkpoint_path": checkpoint.path if checkpoint else None})

        def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
            errors = list(worker_exceptions.values())
            queue.put({FAILURE_KEY: {"lost": any(worker_lost(e) for e in errors),
                                     "error": brief(errors[0]) if errors else ""}})

    return QueueCallback()


def raise_failure(name: str, error: BaseException) -> NoReturn:
    """Raise the error of the failed Train run ``name``.

    When every failed worker raised an expected error (an :class:`~iaa.errors.IaaError`, such as
    a prepared folder that a node cannot see, which Ray reports in ``worker_failures`` by rank),
    a :class:`TrainRunError` carries the lowest rank's message. A worker lost with no restores left
    (its process or node died) is :class:`~iaa.jobs.ports.RestoresSpent`: the last checkpoint
    stands. Anything else is a bug: a RuntimeError chained to Ray's error, with the workers'
    tracebacks.
    """
    failures: dict[int, BaseException] = dict(getattr(error, "worker_failures", None) or {})
    if failures and all(isinstance(err, IaaError) for err in failures.values()):
        rank = min(failures)
        raise TrainRunError(f"Ray Train run {name} failed on rank {rank} of its workers: {failures[rank]}") from error
    if worker_lost(error):
        restores = max_failures(MAX_FAILURES)
        raise RestoresSpent(f"Ray Train run {name} lost a worker (its process or node died) after {restores} "
                            f"restore(s), the most it may take ({MAX_FAILURES_ENV})") from error
    raise RuntimeError(f"Ray Train run {name} failed: {error}") from error
