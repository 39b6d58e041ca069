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
  rank 0 writes through :func:`iaa.jobs.checkpoint.save` into a temporary directory.

Checkpoints live under ``STORAGE/NAME`` with ``NAME`` the run directory's name, so running the
same command again with ``--resume`` restores the latest checkpoint (Train V2 restores a run
whose ``RunConfig(name, storage_path)`` is unchanged). A worker failure is retried from the last
checkpoint up to ``MAX_FAILURES`` times.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.jobs import checkpoint
from iaa.jobs.config import JobConfig, from_dict, to_dict
from iaa.errors import IaaError
from iaa.platform.resources import forced_device

MAX_FAILURES = 2              # worker-group restarts from the last checkpoint before a run fails
CHECKPOINT_FILE = "checkpoint.pt"  # the state file inside every Ray checkpoint directory
# Ray keeps the checkpoint with the highest score plus the latest. The score is valid_acc at the
# checks that improved it and -1 elsewhere, so a later check that only ties the best never
# displaces the best checkpoint (the loop's best is the first check reaching the maximum).
CHECKPOINT_SCORE = "checkpoint_score"
MetricsCallback = Callable[[dict[str, Any]], None]


# --- sessions --------------------------------------------------------------------------------------


class TableSession:
    """Batches from in-memory Arrow tables; the Ray sessions add reduce, model and report.

    ``train`` is this worker's own part of the training split; ``valid`` is the validation split
    (a Ray Train worker scores only its rank's share of it). ``first_step_at`` records when the
    first training batch was handed out (wall-clock seconds), to measure start-up overhead.
    """

    rank = 0
    world_size = 1

    def __init__(self, train: pa.Table, valid: pa.Table, *, batch_size: int, seed: int, threads: int,
                 device: torch.device | None = None) -> None:
        from iaa.data.loader import iter_batches

        if threads > 0:
            torch.set_num_threads(threads)
        self._iter_batches = iter_batches
        self.train, self.valid = train, valid
        self.batch_size, self.seed = batch_size, seed
        self.device = device or torch.device("cpu")
        self.first_step_at: float | None = None
        self._n_batches: int | None = None

    def local_train_batches(self) -> int:
        return math.ceil(self.train.num_rows / self.batch_size)

    def num_train_batches(self) -> int:
        if self._n_batches is None:
            self._n_batches = self.local_train_batches()
        return self._n_batches

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        batches = self._iter_batches(self.train, self.batch_size, seed=self.seed, epoch=epoch, shuffle=True)
        for batch in islice(batches, skip, self.num_train_batches()):  # every rank: the same count
            if self.first_step_at is None:
                self.first_step_at = time.time()
            yield batch

    def valid_batches(self) -> Iterator[Batch]:
        return self._iter_batches(self.valid, self.batch_size, seed=self.seed, epoch=0, shuffle=False)

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def report_metrics(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> dict[str, Any]:
        """What every report sends: the loop's metrics plus its progress (for ASHA and the driver)."""
        progress = state.get("progress", {})
        return {**metrics, "checks": int(progress.get("checks", 0)), "steps": int(progress.get("step", 0)),
                "best_step": int(progress.get("best_step", 0)), "stop_reason": progress.get("stop_reason", ""),
                "is_best": bool(is_best), CHECKPOINT_SCORE: float(metrics["valid_acc"]) if is_best else -1.0,
                "first_step_at": self.first_step_at or time.time()}


def load_state(ckpt: Any) -> dict[str, Any] | None:
    """The training state inside a Ray checkpoint (``None`` for no checkpoint)."""
    if ckpt is None:
        return None
    with ckpt.as_directory() as folder:
        path = Path(folder) / CHECKPOINT_FILE
        return checkpoint.load(path) if path.exists() else None


class RayTrainSession(TableSession):
    """A Ray Train worker: its dataset shard, all-reduce over the worker group, DDP, report."""

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
        train = data.rank_rows("train", self.rank, self.world_size)
        if train.num_rows == 0:
            raise IaaError(f"rank {self.rank} of {self.world_size} has no training rows: use fewer workers")
        valid = data.table("valid")                             # the whole split: ranks score disjoint batches
        # the GPU Ray assigned to this worker, unless IAA_TRAIN_DEVICE=cpu forces the CPU
        device = torch.device("cpu") if forced_device() == "cpu" else ray.train.torch.get_device()
        super().__init__(train, valid, batch_size=batch_size, seed=seed, threads=threads, device=device)

    def num_train_batches(self) -> int:
        if self._n_batches is None:  # equal on every rank, or report's barrier would hang
            self._n_batches = int(self._reduce([float(self.local_train_batches())], torch.distributed.ReduceOp.MIN)[0])
        return self._n_batches

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        if self.world_size == 1:
            return [float(v) for v in values]
        device = self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(tensor, op=op)
        return tensor.cpu().tolist()

    def valid_batches(self) -> Iterator[Batch]:
        return self._iter_batches(self.valid, self.batch_size, seed=self.seed, epoch=0, shuffle=False,
                                  rank=self.rank, world_size=self.world_size)

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

    def report(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> None:
        import ray.train

        with tempfile.TemporaryDirectory(prefix="iaa-ckpt-") as folder:
            ckpt = None
            if self.rank == 0:
                checkpoint.save(Path(folder) / CHECKPOINT_FILE, state)
                ckpt = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(self.report_metrics(metrics, state, is_best), checkpoint=ckpt)


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


def _queue_callback(queue: Any) -> Any:
    """A Train callback that forwards rank 0's metrics from the controller to the driver's queue."""
    from ray.train import UserCallback

    class QueueCallback(UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if metrics:
                queue.put({**metrics[0], "checkpoint_path": checkpoint.path if checkpoint else None})

    return QueueCallback()


# --- iaa-cli train --workers N ---------------------------------------------------------------------


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


def fit(
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
    from ray.util.queue import Queue

    from iaa.data.loader import PreparedData
    from iaa.platform import cluster

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
                            vocab_hash=data.manifest.get("vocab_hash", ""), callbacks=[_queue_callback(queue)])
    history: list[dict[str, Any]] = []
    done = threading.Event()

    def drain() -> None:
        while not (done.is_set() and queue.empty()):
            try:
                metrics = queue.get(timeout=0.5)
            except Exception:  # noqa: BLE001 - ray.util.queue.Empty on timeout
                continue
            history.append(metrics)
            with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as out:
                out.write(json.dumps({**metrics, "time": time.time()}, default=str) + "\n")
            if show_progress:
                print(f"check {metrics.get('checks')}: step {metrics.get('step')} epoch {metrics.get('epoch', 0):.2f} "
                      f"train_loss {metrics.get('train_loss', 0):.4f} valid_acc {metrics.get('valid_acc', 0):.4f} "
                      f"(best {metrics.get('best_valid_acc', 0):.4f})", file=sys.stderr)
            if on_metrics is not None:
                on_metrics(metrics)

    drainer = threading.Thread(target=drain, name="iaa-metrics", daemon=True)
    drainer.start()
    try:
        result = trainer.fit()
    finally:
        done.set()
        drainer.join(timeout=30)
        queue.shutdown()
    if result.error is not None:
        raise RuntimeError(f"Ray Train run {name} failed: {result.error}") from result.error
    best = result.get_best_checkpoint(metric=CHECKPOINT_SCORE, mode="max")
    if best is None:
        raise RuntimeError(f"Ray Train run {name} reported no checkpoint")
    best_file = _fetch(best, run_dir / "checkpoints" / checkpoint.BEST)
    if result.checkpoint is not None:
        _fetch(result.checkpoint, run_dir / "checkpoints" / checkpoint.LAST)
    last = history[-1] if history else dict(result.metrics or {})
    return {**last, "best_valid_acc": last.get("best_valid_acc", -1.0), "steps": last.get("steps", 0),
            "stop_reason": last.get("stop_reason", ""), "checkpoint": str(best_file), "run_dir": str(run_dir),
            "ray_storage": f"{storage.rstrip('/')}/{name}", "workers": workers, "threads": trial_plan.threads}
