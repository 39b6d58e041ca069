"""Checkpoints: the one place that saves, loads and unwraps models.

A checkpoint is a plain dict of tensors and primitives, so it loads with
``torch.load(weights_only=True)``. It holds the whole job config, so the model can be
rebuilt from the file alone, and the RNG and loop state, so ``--resume`` continues exactly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from iaa.jobs.config import JobConfig, from_dict, to_dict
from iaa.model.reader import build_reader

LAST = "last.pt"
BEST = "best.pt"


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel (or ``model`` itself)."""
    return model.module if hasattr(model, "module") else model


def save(path: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically: to a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def make_state(
    cfg: JobConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    progress: dict[str, Any] | None = None,
    vocab_hash: str = "",
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "format": 1,
        "config": to_dict(cfg),
        "model": unwrap(model).state_dict(),
        "vocab_hash": vocab_hash,
    }
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
        state["rng"] = torch.get_rng_state()
    if progress is not None:
        state["progress"] = dict(progress)
    return state


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``: no pickled code is run)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model(path: Path) -> tuple[nn.Module, JobConfig, dict[str, Any]]:
    """Rebuild the model of a checkpoint in eval mode, with its config and raw state."""
    state = load(path)
    cfg = from_dict(state["config"])
    model = build_reader(cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    return model, cfg, state
