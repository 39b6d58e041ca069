"""Where a training loop runs: the seam between the plain loop and Ray.

The loop in :mod:`iaa.jobs.train` talks only to a :class:`Session`. :class:`LocalSession`
runs it in this process; ``iaa.platform`` supplies the Ray Train session, which adds just the
dataset shard, the all-reduce and ``ray.train.report``.
"""

from __future__ import annotations

import json
import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.jobs import checkpoint

MetricsCallback = Callable[[dict[str, Any]], None]


class Session(Protocol):
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


class LocalSession:
    """One process, reading the prepared shards directly; checkpoints under ``run_dir``."""

    rank = 0
    world_size = 1

    def __init__(
        self,
        data_dir: Path,
        run_dir: Path,
        *,
        batch_size: int,
        seed: int,
        resume: bool = False,
        on_metrics: MetricsCallback | None = None,
        device: str = "cpu",
    ) -> None:
        from iaa.data.loader import PreparedData

        self.data = PreparedData.open(Path(data_dir))
        self.run_dir = Path(run_dir)
        self.batch_size = batch_size
        self.seed = seed
        self.resume = resume
        self.on_metrics = on_metrics
        self.device = torch.device(device)
        self._train = self.data.table("train")
        self._valid = self.data.table("valid")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            for stale in (self.metrics_path, self.ckpt_dir):
                if stale.is_dir():
                    shutil.rmtree(stale)
                elif stale.exists():
                    stale.unlink()

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def num_train_batches(self) -> int:
        from iaa.data.loader import num_batches

        return num_batches(self._train.num_rows, self.batch_size)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        from iaa.data.loader import iter_batches

        batches = iter_batches(self._train, self.batch_size, seed=self.seed, epoch=epoch, shuffle=True)
        return islice(batches, skip, None)

    def valid_batches(self) -> Iterator[Batch]:
        from iaa.data.loader import iter_batches

        return iter_batches(self._valid, self.batch_size, seed=self.seed, epoch=0, shuffle=False)

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def latest_state(self) -> dict[str, Any] | None:
        path = self.ckpt_dir / checkpoint.LAST
        if self.resume and path.exists():
            return checkpoint.load(path)
        return None

    def report(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> None:
        last = checkpoint.save(self.ckpt_dir / checkpoint.LAST, state)
        if is_best:
            shutil.copyfile(last, self.ckpt_dir / f".{checkpoint.BEST}.tmp")
            (self.ckpt_dir / f".{checkpoint.BEST}.tmp").replace(self.ckpt_dir / checkpoint.BEST)
        with self.metrics_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({**metrics, "time": time.time()}) + "\n")
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    @property
    def best_checkpoint(self) -> Path:
        return self.ckpt_dir / checkpoint.BEST
