"""Several training runs in one process, side by side on one device: one batch of each in turn.

Why: a trial at batch 32 leaves most of a large GPU idle, and separate processes share a card
by time-slicing (each has its own CUDA context). Runs in one process, each on its own CUDA
stream, let the card overlap their kernels: while one run's step waits on the host, another's
runs. On the CPU the runs simply alternate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from iaa.jobs.training.loop import Trainer


def in_turn(runs: Sequence[Iterator[Any]], device: torch.device | str) -> list[int]:
    """Advance each of ``runs`` by one item in turn, each under its own CUDA stream on a CUDA
    ``device``, until every one is exhausted; returns how many items each gave."""
    device = torch.device(device)
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in runs]
    counts = [0] * len(runs)
    live = list(range(len(runs)))
    while live:
        for i in list(live):
            with torch.cuda.stream(streams[i]) if streams[i] is not None else nullcontext():
                try:
                    next(runs[i])
                    counts[i] += 1
                except StopIteration:
                    live.remove(i)
    return counts


def fit_side_by_side(trainers: Sequence[Trainer]) -> list[dict[str, Any]]:
    """``Trainer.fit`` of each of ``trainers`` (all on one device), one batch of each in turn;
    returns their results in order. A run that ends early leaves the others going."""
    if not trainers:
        return []
    in_turn([trainer.steps() for trainer in trainers], trainers[0].session.device)
    return [trainer.finish() for trainer in trainers]
