"""Data-parallel training on Ray Train (V2): the loop of :mod:`iaa.jobs.train` on N workers.

Going distributed changes only what a :class:`~iaa.jobs.session.Session` does:

- **data**: each worker reads its own rows of the training split from the prepared folder's
  Parquet shards (:meth:`iaa.data.loader.PreparedData.rank_rows`: a contiguous share, the same on
  every restart) and cuts them into length-bucketed batches by (seed, epoch) with
  :func:`iaa.data.loader.iter_batches`; nothing goes through the driver or the object store.
  Each worker reads the (small) validation split whole and scores its rank's disjoint share of the
  loader's batch plan, so every example counts exactly once. On a cluster the prepared folder
  must be on storage every node sees;
- **all-reduce**: validation sums and the stop signal go through ``torch.distributed``
  (gloo on CPU, NCCL on GPU), so only rank 0's metrics need reaching Ray;
- **model**: ``ray.train.torch.prepare_model`` (device + DDP);
- **report**: ``ray.train.report`` on every worker (it is a barrier) with a checkpoint that
  rank 0 writes into a temporary directory (:meth:`iaa.jobs.session.SessionBase.report`).

A worker failure is retried from the last checkpoint up to ``MAX_FAILURES`` times. Train V2
restores a run whose ``RunConfig(name, storage_path)`` is unchanged, which is how ``--resume``
and a restored Tune trial continue. The ``train --workers N`` driver is
:func:`iaa.platform.train_workers.fit_workers`; a multi-worker Tune trial runs :func:`build_trainer`
from :func:`iaa.platform.trial.run_trial`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, NoReturn, Sequence

import pyarrow as pa
import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.errors import IaaError
from iaa.jobs import checkpoint
from iaa.jobs.config import JobConfig, from_dict, to_dict
from iaa.jobs.session import CHECKPOINT_FILE, SessionBase
from iaa.platform.resources import forced_device

MAX_FAILURES = 2              # worker-group restarts from the last checkpoint before a run fails
# Ray keeps the checkpoint with the highest score plus the latest. The score is valid_acc at the
# checks that improved it and -1 elsewhere, so a later check that only ties the best never
# displaces the best checkpoint (the loop's best is the first check reaching the maximum).
CHECKPOINT_SCORE = "checkpoint_score"


class TrainRunError(IaaError):
    """A Ray Train run failed for a reason its workers named (an expected failure on a worker)."""


# --- sessions --------------------------------------------------------------------------------------


class RaySession(SessionBase):
    """What the Tune and Ray Train sessions add to :class:`~iaa.jobs.session.SessionBase`.

    ``threads`` torch threads for this worker (0 keeps torch's default); every report also
    carries ``CHECKPOINT_SCORE`` (by which Ray keeps the best checkpoint) and ``first_step_at``,
    when the first training batch was handed out (wall-clock seconds, to measure start-up).
    Subclasses write ``publish`` (``ray.tune.report`` / ``ray.train.report``) and ``latest_state``.
    """

    def __init__(self, train: pa.Table, valid: pa.Table, *, batch_size: int, seed: int, threads: int,
                 device: torch.device | str = "cpu") -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        super().__init__(train, valid, batch_size=batch_size, seed=seed, device=device)
        self.first_step_at: float | None = None

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        for batch in super().train_batches(epoch, skip):
            if self.first_step_at is None:
                self.first_step_at = time.time()
            yield batch

    def report_metrics(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> dict[str, Any]:
        return {**super().report_metrics(metrics, state, is_best),
                CHECKPOINT_SCORE: float(metrics["valid_acc"]) if is_best else -1.0,
                "first_step_at": self.first_step_at or time.time()}


def load_state(ckpt: Any) -> dict[str, Any] | None:
    """The training state inside a Ray checkpoint (``None`` for no checkpoint)."""
    if ckpt is None:
        return None
    with ckpt.as_directory() as folder:
        path = Path(folder) / CHECKPOINT_FILE
        return checkpoint.load(path) if path.exists() else None


class RayTrainSession(RaySession):
    """A Ray Train worker: its rows of the training split, all-reduce over the worker group, DDP,
    ``ray.train.report``."""

    def __init__(self, prepared: str, *, batch_size: int, seed: int, threads: int) -> None:
        import ray.train
        import ray.train.torch

        from iaa.data.loader import PreparedData

        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        if not Path(prepared).is_dir():
            raise IaaError(f"the prepared data folder {prepared} is not visible on node {ray.util.get_node_ip_address()}; "
                           "on a cluster, put it on storage that every node mounts at the same path")
        data = PreparedData.open(Path(prepared))
        self.vocab = checkpoint.vocab_card(Path(prepared))
        train = data.rank_rows("train", self.rank, self.world_size)
        if train.num_rows == 0:
            raise IaaError(f"rank {self.rank} of {self.world_size} has no training rows: use fewer workers")
        valid = data.table("valid")                             # the whole split: ranks score disjoint batches
        # the GPU Ray assigned to this worker, unless IAA_TRAIN_DEVICE=cpu forces the CPU
        device = torch.device("cpu") if forced_device() == "cpu" else ray.train.torch.get_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)      # this rank's context, RNG and kernels on its own GPU
        super().__init__(train, valid, batch_size=batch_size, seed=seed, threads=threads, device=device)
        self._n_batches: int | None = None

    def num_train_batches(self) -> int:
        if self._n_batches is None:  # equal on every rank, or report's barrier would hang
            local = float(super().num_train_batches())
            self._n_batches = int(self._reduce([local], torch.distributed.ReduceOp.MIN)[0])
        return self._n_batches

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        if self.world_size == 1:
            return [float(v) for v in values]
        device = self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(tensor, op=op)
        return tensor.cpu().tolist()

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, torch.distributed.ReduceOp.SUM)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        # Some configs leave parameters unused (T=1 skips the later search steps; the AS reader
        # has no search gates), which plain DDP rejects.
        if self.device.type == "cpu" and forced_device() == "cpu":   # GPU workers forced onto the CPU
            return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        return ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": True})

    def latest_state(self) -> dict[str, Any] | None:
        import ray.train

        return load_state(ray.train.get_checkpoint())

    def publish(self, metrics: dict[str, Any], folder: Path | None, is_best: bool) -> None:
        """``ray.train.report`` on every rank (a barrier); only rank 0 has a checkpoint ``folder``."""
        import ray.train

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder) if folder else None)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """The Ray Train worker entry point: the plain training loop on a :class:`RayTrainSession`."""
    from iaa.jobs.train import fit as train_fit

    cfg = from_dict(config["job"])
    session = RayTrainSession(config["prepared"], batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                              threads=config["threads"])
    train_fit(cfg, session, show_progress=False, vocab_hash=config.get("vocab_hash", ""))


# --- building a trainer ----------------------------------------------------------------------------


def process_group_backend(use_gpu: bool) -> str:
    """NCCL between GPU workers (one GPU per rank), gloo on CPUs and for GPU workers forced onto the CPU."""
    return "nccl" if use_gpu and forced_device() != "cpu" else "gloo"


def job_for_workers(cfg: JobConfig, world_size: int, use_gpu: bool) -> JobConfig:
    """The config the workers build: NCCL cannot all-reduce sparse gradients, so GPUs use dense ones."""
    if world_size > 1 and use_gpu and getattr(cfg.model, "sparse_embedding_grad", False):
        return replace(cfg, model=replace(cfg.model, sparse_embedding_grad=False))
    return cfg


def build_trainer(cfg: JobConfig, prepared: Path, *, name: str, storage_path: str, workers: int, threads: int,
                  worker_resources: dict[str, float], use_gpu: bool, vocab_hash: str = "",
                  callbacks: Sequence[Any] = ()) -> Any:
    """A TorchTrainer running :func:`train_loop_per_worker` on ``workers`` workers.

    The workers read their rows of ``prepared`` themselves. Checkpoints go to
    ``storage_path/name``; the best by ``valid_acc`` and the latest are kept.
    """
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    job = job_for_workers(cfg, workers, use_gpu)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": to_dict(job), "threads": threads, "vocab_hash": vocab_hash, "world_size": workers,
                           "prepared": str(Path(prepared).resolve())},
        torch_config=TorchConfig(backend=process_group_backend(use_gpu)),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu,
                                               resources_per_worker=dict(worker_resources)),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage_path,
            failure_config=ray.train.FailureConfig(max_failures=MAX_FAILURES),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_SCORE,
                                                         checkpoint_score_order="max"),
            callbacks=list(callbacks),
        ),
    )


def queue_callback(queue: Any) -> Any:
    """A Train callback that forwards rank 0's metrics from the controller to the driver's queue."""
    from ray.train import UserCallback

    class QueueCallback(UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if metrics:
                queue.put({**metrics[0], "checkpoint_path": checkpoint.path if checkpoint else None})

    return QueueCallback()


def raise_failure(name: str, error: BaseException) -> NoReturn:
    """Raise the error of the failed Train run ``name``.

    When every failed worker raised an expected error (an :class:`~iaa.errors.IaaError`, such as
    a prepared folder that a node cannot see, which Ray reports in ``worker_failures`` by rank),
    a :class:`TrainRunError` carries the lowest rank's message. Anything else is a bug: a
    RuntimeError chained to Ray's error, with the workers' tracebacks.
    """
    failures: dict[int, BaseException] = dict(getattr(error, "worker_failures", None) or {})
    if failures and all(isinstance(err, IaaError) for err in failures.values()):
        rank = min(failures)
        raise TrainRunError(f"Ray Train run {name} failed on rank {rank} of its workers: {failures[rank]}") from error
    raise RuntimeError(f"Ray Train run {name} failed: {error}") from error
