"""The training bar counts examples: its total is the rows its steps train, where an epoch's
batches hold fewer than ``batch_size`` and where the budget ends inside an epoch, and a resumed
run's bar starts at the examples already trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.jobs.datasets import resolve
from iaa.jobs.training.loop import Trainer
from iaa.jobs.training.session import LocalSession
from _tiny import TINY_SETS, kill_after_checks, make_tiny_prepared

ROWS = 192                      # the tiny training split; in batches of 20: 10 batches of 19 or 20 rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _trainer(tiny: Path, run_dir: Path, epochs: float, resume: bool = False) -> Trainer:
    cfg = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, "train.threads=1", "train.batch_size=20",
                                                   "train.check_every=3", f"train.max_epochs={epochs}"))
    session = LocalSession(tiny, run_dir, batch_size=20, seed=cfg.train.seed, resume=resume)
    return Trainer(cfg, session, show_progress=True)


@pytest.mark.parametrize("epochs", [2, 1.5])
def test_the_bar_ends_at_its_total_the_examples_its_steps_trained(tiny: Path, tmp_path: Path, epochs: float) -> None:
    trainer = _trainer(tiny, tmp_path / "run", epochs)
    if epochs == 2:
        assert trainer.bar.total == 2 * ROWS                        # not 2 epochs x 10 batches x 20
    else:
        assert ROWS + 5 * 19 <= trainer.bar.total <= ROWS + 5 * 20   # and 5 batches of 19 or 20 rows
    trainer.fit()
    assert trainer.progress.stop_reason == "max-epochs"
    assert trainer.bar.n == trainer.bar.total                        # each step counted its batch's rows


def test_a_resumed_runs_bar_starts_at_the_examples_already_trained(tiny: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _trainer(tiny, run_dir, 1.5)
    first.bar.close()
    kill_after_checks(first.cfg, tiny, run_dir, checks=2)           # stopped after 6 steps
    resumed = _trainer(tiny, run_dir, 1.5, resume=True)
    assert resumed.progress.step == 6
    assert resumed.bar.n == resumed.examples(6) and 6 * 19 <= resumed.bar.n <= 6 * 20
    resumed.fit()
    assert resumed.bar.n == resumed.bar.total == first.bar.total
