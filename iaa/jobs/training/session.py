"""Where a training loop runs: the seam between the plain loop and Ray.

The loop in :mod:`iaa.jobs.training.loop` talks only to a :class:`Session`. :class:`SessionBase` holds
what every session shares: batches from in-memory Arrow tables, the device, and ``report``, the
one "report with a checkpoint" helper. It writes the checkpoint into a folder and hands the
folder to ``publish``, the one method a session must write. :class:`LocalSession` publishes to
``run_dir``; :class:`ClusterSession` runs on a Tune trial or a Ray Train worker, where
``iaa.platform`` supplies the :class:`~iaa.jobs.ports.WorkerLink`: ``ray.tune.report`` /
``ray.train.report``, the worker group's all-reduce and DDP.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from iaa.data.loading.batch import Batch
from iaa.data.prepared.manifest import vocab_card
from iaa.files import remove_dead_leftovers, writing
from iaa.jobs.modeling import checkpoint
from iaa.jobs.ports import CHECKPOINT_FILE, CHECKPOINT_SCORE, MetricsCallback, WorkerLink
from iaa.jobs.workdir.paths import RunFolder


class Session(Protocol):
    """What the training loop needs from where it runs."""

    rank: int
    world_size: int
    device: torch.device

    def num_train_batches(self) -> int: ...
    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]: ...
    def train_examples(self, epoch: int, batches: int) -> int: ...
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
    vocab: dict[str, Any] = {}  # manifest.vocab_card of the data, saved in every checkpoint
    checkpoint_shown_as: Path | None = None   # the file a failed checkpoint write is named as

    def __init__(self, train: pa.Table, valid: pa.Table, *, batch_size: int, seed: int,
                 device: torch.device | str = "cpu") -> None:
        self.train, self.valid = train, valid
        self.batch_size, self.seed = batch_size, seed
        self.device = torch.device(device)

    def num_train_batches(self) -> int:
        from iaa.data.loading.loader import num_batches

        return num_batches(self.train.num_rows, self.batch_size)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        from iaa.data.loading.loader import iter_batches

        batches = iter_batches(self.train, self.batch_size, seed=self.seed, epoch=epoch, shuffle=True)
        return islice(batches, skip, self.num_train_batches())

    def train_examples(self, epoch: int, batches: int) -> int:
        """The examples in the first ``batches`` of ``train_batches(epoch)``: every row for a whole
        epoch, else the sizes of those batches (an epoch spreads its rows over its batches, so
        some hold fewer than ``batch_size``)."""
        from iaa.data.loading.loader import batch_plan, num_batches

        if batches >= num_batches(self.train.num_rows, self.batch_size):
            return self.train.num_rows
        lengths = pc.list_value_length(self.train.column("doc")).to_numpy(zero_copy_only=False)
        plan = batch_plan(lengths, self.batch_size, seed=self.seed, epoch=epoch, shuffle=True)
        return sum(len(rows) for rows in plan[:max(batches, 0)])

    def valid_batches(self) -> Iterator[Batch]:
        from iaa.data.loading.loader import iter_batches

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
                checkpoint.save(folder / CHECKPOINT_FILE, {**state, "vocab": self.vocab} if self.vocab else state,
                                shown_as=self.checkpoint_shown_as)
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
        from iaa.data.loading.loader import PreparedData

        self.data = PreparedData.open(Path(data_dir))
        train = self.data.table("train") if train_rows is None else train_rows
        super().__init__(train, self.data.table("valid"), batch_size=batch_size, seed=seed, device=device)
        self.vocab = vocab_card(Path(data_dir))
        self.run_dir = Path(run_dir)
        self.folder = RunFolder(self.run_dir)
        self.resume = resume
        self.on_metrics = on_metrics
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.folder.clear()

    @property
    def checkpoint_shown_as(self) -> Path:      # type: ignore[override]
        return self.folder.last

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
        """A staging folder inside ``checkpoints/``: publishing is then a rename, not a copy.
        Staging folders of killed runs (``.staging-PID-*`` of a dead PID) are removed first."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(self.ckpt_dir, r"\.staging-(?P<pid>\d+)-.+")
        folder = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=self.ckpt_dir))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def publish(self, metrics: dict[str, Any], folder: Path | None, is_best: bool) -> None:
        assert folder is not None
        staged = folder / CHECKPOINT_FILE
        if is_best:                                    # a copy: best.pt never shares a file with last.pt
            with writing(self.folder.best, needs=staged.stat().st_size):
                shutil.copyfile(staged, folder / checkpoint.BEST)
            os.replace(folder / checkpoint.BEST, self.folder.best)
        os.replace(staged, self.folder.last)
        self.folder.append_metrics(metrics)
        if self.on_metrics is not None:
            self.on_metrics(metrics)


RANK_RNG = "rank_rng"   # in a multi-worker checkpoint: {"rng": [rank 0's, rank 1's, ...], "cuda_rng": [...]}


class ClusterSession(SessionBase):
    """A Tune trial or a Ray Train worker: its rows in memory, the rest through ``link``.

    ``threads`` torch threads for this worker (0 keeps torch's default); every report also
    carries ``CHECKPOINT_SCORE`` (by which Ray keeps the best checkpoint) and ``first_step_at``,
    when the first training batch was handed out (wall-clock seconds, to measure start-up).
    """

    def __init__(self, link: WorkerLink, train: pa.Table, valid: pa.Table, *, batch_size: int, seed: int,
                 threads: int, vocab: Mapping[str, Any] | None = None) -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        self.link, self.rank, self.world_size = link, link.rank, link.world_size
        super().__init__(train, valid, batch_size=batch_size, seed=seed, device=link.device)
        self.vocab = dict(vocab or {})
        self.first_step_at: float | None = None
        self._n_batches: int | None = None

    def num_train_batches(self) -> int:
        if self._n_batches is None:  # equal on every rank, or report's barrier would hang
            local = float(super().num_train_batches())
            self._n_batches = int(self.link.all_reduce([local], "min")[0])
        return self._n_batches

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        for batch in super().train_batches(epoch, skip):
            if self.first_step_at is None:
                self.first_step_at = time.time()
            yield batch

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return self.link.all_reduce(values, "sum")

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return self.link.prepare_model(model)

    def latest_state(self) -> dict[str, Any] | None:
        with self.link.last_checkpoint() as folder:
            path = folder / CHECKPOINT_FILE if folder is not None else None
            saved = checkpoint.load(path) if path is not None and path.exists() else None
        if saved is not None:          # this rank's own random state, when the checkpoint holds every rank's
            for key, states in (saved.get(RANK_RNG) or {}).items():
                if len(states) == self.world_size:
                    saved[key] = states[self.rank]
        return saved

    def report(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> None:
        """As every session reports; with several ranks, the checkpoint (rank 0's) also holds every
        rank's random state (dropout), so that a group restored from it draws what it would have
        drawn: each rank's stream depends on its own batches' shapes."""
        if self.world_size > 1:
            state = {**state, RANK_RNG: self._rank_states(state)}
        super().report(metrics, state, is_best)

    def _rank_states(self, state: dict[str, Any]) -> dict[str, list[torch.Tensor]]:
        """Every rank's ``rng`` (and ``cuda_rng``) of ``state``, gathered with one all-reduce of bytes
        (each rank fills its own slot; the sum is every slot)."""
        out: dict[str, list[torch.Tensor]] = {}
        for key in ("rng", "cuda_rng"):
            own = state.get(key)
            if own is None:
                continue
            size = int(own.numel())
            values = [0.0] * (size * self.world_size)
            values[self.rank * size:(self.rank + 1) * size] = own.to(torch.float64).tolist()
            summed = self.link.all_reduce(values, "sum")
            out[key] = [torch.tensor(summed[r * size:(r + 1) * size], dtype=torch.uint8)
                        for r in range(self.world_size)]
        return out

    def report_metrics(self, metrics: dict[str, Any], state: dict[str, Any], is_best: bool) -> dict[str, Any]:
        return {**super().report_metrics(metrics, state, is_best),
                CHECKPOINT_SCORE: float(metrics["valid_acc"]) if is_best else -1.0,
                "first_step_at": self.first_step_at or time.time()}

    def publish(self, metrics: dict[str, Any], folder: Path | None, is_best: bool) -> None:
        self.link.publish(metrics, folder)
