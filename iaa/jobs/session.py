"""Where a training loop runs: the seam between the plain loop and Ray.

The loop in :mod:`iaa.jobs.train` talks only to a :class:`Session`. :class:`SessionBase` holds
what every session shares: batches from in-memory Arrow tables, the device, and ``report``, the
one "report with a checkpoint" helper. It writes the checkpoint into a folder and hands the
folder to ``publish``, the one method a session must write. :class:`LocalSession` publishes to
``run_dir``; ``iaa.platform`` supplies the Tune and Ray Train sessions (both built on
``iaa.platform.ray_train.RaySession``), which publish through ``ray.tune.report`` /
``ray.train.report``; the Ray Train one adds the worker's rows and the all-reduce.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import pyarrow as pa
import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.jobs import checkpoint
from iaa.jobs.ports import MetricsCallback
from iaa.jobs.workdir import RunFolder

CHECKPOINT_FILE = "checkpoint.pt"  # the state file inside every reported checkpoint folder


class Session(Protocol):
    """What the training loop needs from where it runs."""

    rank: int
    world_size: int
    device: torch.device

    def num_train_batches(self) -> int: ...
    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]: ...
    def valid_batches(self) -> Iterator[Batch]: ...
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]: ...
    def prepare_model(self, model: nn.Module) -> nn.Module: ...
    def latest_state(self) -> dict[str, Any] | None: ...
    def report(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> None: ...


class SessionBase:
    """One process's view of the data (Arrow tables) and device; the defaults of a Session.

    Subclasses write ``publish`` and, to resume, ``latest_state``; distributed ones override
    ``all_reduce_sum``, ``prepare_model`` and the batch counts. ``prepare_model`` is called with
    the model already on ``device`` (the loop moves it there before building the optimiser).
    """

    rank = 0
    world_size = 1
    resumed_from = ""          # the checkpoint latest_state() loaded, named in messages (optional)
    vocab: dict[str, Any] = {}  # checkpoint.vocab_card of the data, saved in every checkpoint

    def __init__(self, train: pa.Table, valid: pa.Table, *, batch_size: int, seed: int,
                 device: torch.device | str = "cpu") -> None:
        self.train, self.valid = train, valid
        self.batch_size, self.seed = batch_size, seed
        self.device = torch.device(device)

    def num_train_batches(self) -> int:
        from iaa.data.loader import num_batches

        return num_batches(self.train.num_rows, self.batch_size)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        from iaa.data.loader import iter_batches

        batches = iter_batches(self.train, self.batch_size, seed=self.seed, epoch=epoch, shuffle=True)
        return islice(batches, skip, self.num_train_batches())

    def valid_batches(self) -> Iterator[Batch]:
        from iaa.data.loader import iter_batches

        return iter_batches(self.valid, self.batch_size, seed=self.seed, epoch=0, shuffle=False,
                            rank=self.rank, world_size=self.world_size)   # each rank scores its own share

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def latest_state(self) -> dict[str, Any] | None:
        return None

    def report_metrics(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> dict[str, Any]:
        """What every report sends: the loop's metrics plus its progress."""
        progress = state.get("progress", {})
        return {**metrics, "checks": int(progress.get("checks", 0)), "steps": int(progress.get("step", 0)),
                "best_step": int(progress.get("best_step", 0)), "stop_reason": progress.get("stop_reason", ""),
                "is_best": bool(is_best)}

    def report(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> None:
        """Report a check: rank 0 writes ``state`` to ``CHECKPOINT_FILE`` in a fresh folder, then
        every rank calls ``publish`` (with None for the folder on the other ranks)."""
        with self.checkpoint_folder() as folder:
            if self.rank == 0:
                checkpoint.save(folder / CHECKPOINT_FILE, {**state, "vocab": self.vocab} if self.vocab else state)
            self.publish(self.report_metrics(metrics, state, is_best), folder if self.rank == 0 else None,
                         is_best)

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[Path]:
        """A fresh folder for one checkpoint, removed after ``publish`` (a temporary one here)."""
        with tempfile.TemporaryDirectory(prefix="iaa-ckpt-") as folder:
            yield Path(folder)

    def publish(self, metrics: dict[str, Any], folder: Path | None, is_best: bool) -> None:
        """Make one check's metrics and checkpoint (``folder / CHECKPOINT_FILE``) durable."""
        raise NotImplementedError


class LocalSession(SessionBase):
    """One process, reading the prepared shards directly (or given training rows); checkpoints under ``run_dir``:
    ``checkpoints/last.pt``, ``checkpoints/best.pt`` and one JSON line per check in
    ``metrics.jsonl``."""

    def __init__(self, data_dir: Path, run_dir: Path, *, batch_size: int, seed: int, resume: bool = False,
                 on_metrics: MetricsCallback | None = None, device: str = "cpu",
                 train_rows: pa.Table | None = None) -> None:
        from iaa.data.loader import PreparedData

        self.data = PreparedData.open(Path(data_dir))
        train = self.data.table("train") if train_rows is None else train_rows
        super().__init__(train, self.data.table("valid"), batch_size=batch_size, seed=seed, device=device)
        self.vocab = checkpoint.vocab_card(Path(data_dir))
        self.run_dir = Path(run_dir)
        self.folder = RunFolder(self.run_dir)
        self.resume = resume
        self.on_metrics = on_metrics
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.folder.clear()

    @property
    def ckpt_dir(self) -> Path:
        return self.folder.checkpoints

    @property
    def best_checkpoint(self) -> Path:
        return self.folder.best

    def latest_state(self) -> dict[str, Any] | None:
        found = checkpoint.load_latest(self.ckpt_dir) if self.resume else None
        if found is None:
            return None
        state, path = found
        self.resumed_from = str(path)
        return state

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[Path]:
        """A staging folder inside ``checkpoints/``: publishing is then a rename, not a copy."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.ckpt_dir))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def publish(self, metrics: dict[str, Any], folder: Path | None, is_best: bool) -> None:
        assert folder is not None
        staged = folder / CHECKPOINT_FILE
        if is_best:                                    # a copy: best.pt never shares a file with last.pt
            shutil.copyfile(staged, folder / checkpoint.BEST)
            os.replace(folder / checkpoint.BEST, self.folder.best)
        os.replace(staged, self.folder.last)
        self.folder.append_metrics(metrics)
        if self.on_metrics is not None:
            self.on_metrics(metrics)

