"""What a sweep will cost, said before it starts (:mod:`iaa.jobs.sweeps.console` corrects it as it runs).

The estimate multiplies out trials x epochs x training examples and divides by a throughput
probe: a few training steps on this machine's CPU, with the torch threads one trial gets, of the
costliest trial the search space allows (:meth:`SearchSpace.costliest`: its model sizes and epochs at their
largest, its batch size at its smallest; the base config when the space searches none). To that
it adds what a sweep does besides training, which decides the time of a sweep on a small dataset: each trial's validation checks (timed by a second probe of a
few scoring batches), the start of each wave of trials, and the sweep's own start (the Tune
controller, the trials' actors, the first runs in the store). It is an upper bound: ASHA
usually stops part of the trials early.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from iaa.jobs.config.job_config import JobConfig

PROBE_BATCHES = 4          # timed training steps (after one warm-up step)
MANY_HOURS = 3.0           # above this, on CPUs, say which flags shrink the sweep
# What a sweep spends besides training: its own start (the Tune controller, the trials' actors, the
# first runs in the store) and the start of each wave of trials. Both grow with the machine's load;
# the constants take the lowest figures measured, which fit both kinds of sweep: a long sweep is
# ruled by its training, a short one by these (benchmarks/HISTORY.md, "Measurements cited from the
# code"; the estimate against whole sweeps: docs/sweeps.md).
SWEEP_START_S = 5.0
TRIAL_START_S = 2.0


@dataclass(frozen=True)
class SweepCost:
    trials: int
    epochs: float
    examples: int              # training examples per epoch
    examples_per_s: float      # per trial; 0 when not probed (GPU trials)
    concurrency: int
    gpus: bool
    gpus_per_trial: float = 0.0    # a fraction: trials sharing each GPU
    checks: int = 0                # validation checks per trial, at most
    valid_examples: int = 0        # examples scored at each check
    valid_examples_per_s: float = 0.0   # scoring speed of one trial (probe); 0: not counted
    start_s: float = 0.0           # the sweep's start, before the first trial trains
    trial_start_s: float = 0.0     # each wave of trials' start
    budget_s: float | None = None  # the sweep's time budget; None: none, or unknown (what a resume has left)
    costliest: str = ""            # the probed trial's searched values where it is not the base config
    base_examples_per_s: float = 0.0   # the base config's probe, where the costliest trial was probed
    first_check_examples: int = 0      # training examples before a trial's first check; 0: not known

    @property
    def wall_s(self) -> float | None:
        """Expected wall time if ASHA stops no trial; None when the throughput is unknown."""
        if self.examples_per_s <= 0:
            return None
        return self.start_s + self.waves * (self.trial_start_s + self.train_s + self.valid_s)

    @property
    def waves(self) -> int:
        return math.ceil(self.trials / max(self.concurrency, 1))

    @property
    def train_s(self) -> float:
        """One trial's training steps."""
        return self.epochs * self.examples / self.examples_per_s if self.examples_per_s > 0 else 0.0

    @property
    def valid_s(self) -> float:
        """One trial's validation checks."""
        if self.valid_examples_per_s <= 0:
            return 0.0
        return self.checks * self.valid_examples / self.valid_examples_per_s

    def describe(self) -> str:
        head = (f"cost: {self.trials} trial{'' if self.trials == 1 else 's'} x {self.epochs:g} epochs x "
                f"{self.examples:,} examples, " + (f"{self.concurrency} at a time" if self.concurrency > 1 and self.trials > 1
                                                    else "one at a time"))
        if self.wall_s is None:
            return f"{head}; throughput on GPU workers not probed from here" + self.budget() + self.sharing()
        probed = "probe" if not self.costliest else (
            f"probe of the costliest trial the space allows, {self.costliest}; "
            f"the base config ~{self.base_examples_per_s:,.0f}")
        text = (f"{head}; ~{self.examples_per_s:,.0f} examples/s per trial ({probed}) -> at most "
                f"{duration(self.wall_s)} (less where ASHA stops trials)")
        overhead = self.wall_s - self.waves * self.train_s
        if overhead >= 1:
            text += (f"; of which {duration(overhead)} is not training: {self.checks} validation check(s) of "
                     f"{self.valid_examples:,} examples per trial and the trials' start")
        text += self.budget()
        if not self.gpus and min(self.wall_s, self.budget_s or self.wall_s) > MANY_HOURS * 3600:
            text += ("\n  that is long for CPUs: shrink it with `num_samples` N, `max_epochs` E, a smaller "
                     "model (`sets` model.embed_dim=...), `time_budget_s` T, or run on a GPU cluster (`address`, "
                     "`gpus_per_worker` 1)")
        return text

    def budget(self) -> str:
        """The time budget, in words: when it ends the sweep, if it may."""
        if self.budget_s is None:
            return ""
        if self.wall_s is not None and self.wall_s <= self.budget_s:
            return f"; within its time budget of {duration(self.budget_s)}"
        return (f"; its time budget stops the trials after {duration(self.budget_s)} of running, "
                "where they stand (the later trials may not start)")

    def budget_notes(self) -> list[str]:
        """A warning where the time budget ends the trials before their first check, even at the
        quicker of the two probes: with no check, a sweep has no result."""
        quickest = max(self.examples_per_s, self.base_examples_per_s)
        if self.budget_s is None or not self.first_check_examples or quickest <= 0:
            return []
        first_s = self.first_check_examples / quickest
        if first_s <= self.budget_s:
            return []
        return [f"the sweep's time budget of {duration(self.budget_s)} ends the trials before their first check: a trial "
                f"checks first after {self.first_check_examples:,} training examples, about {duration(first_s)} at "
                f"the probe's ~{quickest:,.0f} examples/s, and a sweep with no check has no result; give a longer "
                "`time_budget_s`, or check more often (`sets` train.check_every=BATCHES)"]

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


def probe(cfg: JobConfig, prepared: Path, threads: int, split: str = "train") -> float:
    """Examples/s of ``cfg``'s model on this CPU with ``threads`` torch threads: training steps
    on the first training examples, or (``split="valid"``) scoring the first validation ones."""
    import torch

    from iaa.data.loading.loader import PreparedData, iter_batches
    from iaa.jobs.evaluation.evaluate import score_batches
    from iaa.jobs.training.step import build_optimizer, train_step
    from iaa.model.reader import build_reader

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        table = PreparedData.open(prepared).table(split)
        batches = iter_batches(table.slice(0, cfg.train.batch_size * (PROBE_BATCHES + 1)), cfg.train.batch_size,
                               seed=0, epoch=0, shuffle=split == "train")
        model = build_reader(cfg.model)
        optimizer = build_optimizer(model, cfg.train.lr, cfg.train.embed_l2)
        seen, start = 0, 0.0
        with torch.inference_mode(split != "train"):
            for i, batch in enumerate(batches):
                if split == "train":
                    train_step(model, optimizer, batch, clip=cfg.train.clip)
                else:
                    score_batches(model, [batch])
                if i == 0:
                    start = time.perf_counter()
                else:
                    seen += len(batch)
        return seen / max(time.perf_counter() - start, 1e-9)
    finally:
        torch.set_num_threads(before)
