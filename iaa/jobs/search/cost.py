"""What a sweep will cost, said before it starts (:mod:`iaa.jobs.search.console` corrects it as it runs).

The estimate multiplies out trials x epochs x training examples and divides by a throughput
probe: a few training steps of the sweep's base config on this machine's CPU, with the torch
threads one trial gets. It is an upper bound: ASHA usually stops part of the trials early.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from iaa.jobs.training.config import JobConfig

PROBE_BATCHES = 4          # timed training steps (after one warm-up step)
MANY_HOURS = 3.0           # above this, on CPUs, say which flags shrink the sweep


@dataclass(frozen=True)
class SweepCost:
    trials: int
    epochs: float
    examples: int              # training examples per epoch
    examples_per_s: float      # per trial; 0 when not probed (GPU trials)
    concurrency: int
    gpus: bool
    gpus_per_trial: float = 0.0    # a fraction: trials sharing each GPU

    @property
    def total_examples(self) -> float:
        return self.trials * self.epochs * self.examples

    @property
    def wall_s(self) -> float | None:
        """Expected wall time if ASHA stops no trial; None when the throughput is unknown."""
        if self.examples_per_s <= 0:
            return None
        waves = math.ceil(self.trials / max(self.concurrency, 1))
        return waves * self.epochs * self.examples / self.examples_per_s

    def describe(self) -> str:
        head = (f"cost: {self.trials} trials x {self.epochs:g} epochs x {self.examples:,} examples, "
                f"{self.concurrency} at a time")
        if self.wall_s is None:
            return f"{head}; throughput on GPU workers not probed from here" + self.sharing()
        text = (f"{head}; ~{self.examples_per_s:,.0f} examples/s per trial (probe) -> at most "
                f"{duration(self.wall_s)} (less where ASHA stops trials)")
        if not self.gpus and self.wall_s > MANY_HOURS * 3600:
            text += ("\n  that is long for CPUs: shrink it with --num-samples N, --max-epochs E, a smaller "
                     "model (--set model.embed_dim=...), or run on a GPU cluster (--address, --gpus-per-worker 1)")
        return text


    def sharing(self) -> str:
        """When trials share a GPU, when that pays (nothing when each has its own)."""
        if not 0 < self.gpus_per_trial < 1:
            return ""
        per_gpu = round(1 / self.gpus_per_trial)
        return (f"\n  {per_gpu} one-worker trials share each GPU: this pays while one trial leaves the card "
                "idle (the paper's model at batch 32 is bound by kernel launches, not arithmetic), and "
                "stops paying once one trial fills it (large batches or models); each trial gets "
                f"1/{per_gpu} of the card's memory")


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def probe(cfg: JobConfig, prepared: Path, threads: int) -> float:
    """Training examples/s of ``cfg``'s model on this CPU with ``threads`` torch threads."""
    import torch

    from iaa.data.loader import PreparedData, iter_batches
    from iaa.jobs.training.step import build_optimizer, train_step
    from iaa.model.reader import build_reader

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        table = PreparedData.open(prepared).table("train")
        batches = iter_batches(table.slice(0, cfg.train.batch_size * (PROBE_BATCHES + 1)), cfg.train.batch_size,
                               seed=0, epoch=0)
        model = build_reader(cfg.model)
        optimizer = build_optimizer(model, cfg.train.lr, cfg.train.embed_l2)
        seen, start = 0, 0.0
        for i, batch in enumerate(batches):
            train_step(model, optimizer, batch, clip=cfg.train.clip)
            if i == 0:
                start = time.perf_counter()
            else:
                seen += len(batch)
        return seen / max(time.perf_counter() - start, 1e-9)
    finally:
        torch.set_num_threads(before)
