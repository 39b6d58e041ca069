"""Runs side by side in one process (iaa.jobs.training.side_by_side): one batch of each in turn
gives each run exactly what it gives alone (on the CPU, with dropout off: the runs share torch's
random generator, so their dropout masks would interleave)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.jobs.datasets import resolve
from iaa.jobs.training.loop import Trainer
from iaa.jobs.training.session import LocalSession
from iaa.jobs.training.side_by_side import fit_side_by_side, in_turn
from tests._tiny import TINY_SETS, make_tiny_prepared


def test_in_turn_advances_each_run_once_a_round_until_all_end() -> None:
    seen: list[str] = []

    def run(name: str, n: int):
        for i in range(n):
            seen.append(f"{name}{i}")
            yield

    assert in_turn([run("a", 3), run("b", 1), run("c", 2)], "cpu") == [3, 1, 2]
    assert seen == ["a0", "b0", "c0", "a1", "c1", "a2"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_side_by_side_runs_end_as_each_run_alone(tmp_path: Path) -> None:
    prepared = make_tiny_prepared(tmp_path / "data")

    def trainer(name: str, seed: int) -> Trainer:
        cfg = resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "model.dropout=0", "train.max_epochs=1",
                                                         f"train.seed={seed}"))
        session = LocalSession(prepared, tmp_path / name, batch_size=cfg.train.batch_size, seed=seed)
        return Trainer(cfg, session, show_progress=False)

    alone = [trainer(f"alone-{seed}", seed).fit() for seed in (0, 1)]
    together = fit_side_by_side([trainer(f"together-{seed}", seed) for seed in (0, 1)])
    keys = ("steps", "best_valid_acc", "best_step", "train_loss", "valid_loss", "stop_reason")
    assert [{k: r[k] for k in keys} for r in together] == [{k: r[k] for k in keys} for r in alone]
    assert alone[0]["train_loss"] != alone[1]["train_loss"]               # two different runs
