"""A tiny prepared dataset and untrained checkpoints of each reader kind, for explain/predict tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from iaa.data.loading.loader import PreparedData
from iaa.jobs.modeling import checkpoint
from iaa.jobs.datasets import resolve
from iaa.model.reader import build_reader
from tests._tiny import TINY_SETS, make_tiny_prepared


def tiny_checkpoint(prepared: Path, out: Path, kind: str = "iaa", steps: int = 3, seed: int = 0,
                    temperature: float = 1.0) -> Path:
    """A randomly initialised reader of ``kind`` saved as a checkpoint that matches ``prepared``,
    answering at ``temperature``."""
    cfg = resolve.job_config("cbt-ne", prepared, model_kind=kind, sets=TINY_SETS)
    cfg = replace(cfg, model=replace(cfg.model, steps=steps))
    torch.manual_seed(seed)
    model = build_reader(cfg.model)
    vocab_hash = PreparedData.open(prepared).manifest.vocab_hash
    return checkpoint.save(out, checkpoint.make_state(cfg, model, vocab_hash=vocab_hash, temperature=temperature))


def tiny_setup(root: Path) -> tuple[Path, dict[str, Path]]:
    """(prepared folder, {kind: checkpoint}) with 3 steps for iaa, 2 for the fixed-query ablation."""
    prepared = make_tiny_prepared(root)
    ckpts = {
        "iaa": tiny_checkpoint(prepared, root / "iaa.pt", "iaa", steps=3),
        "iaa-fixed-query": tiny_checkpoint(prepared, root / "fq.pt", "iaa-fixed-query", steps=2),
        "as-reader": tiny_checkpoint(prepared, root / "as.pt", "as-reader"),
    }
    return prepared, ckpts
