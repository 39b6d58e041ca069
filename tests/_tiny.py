"""Tiny prepared datasets for end-to-end tests: the demo grammar at a few hundred examples."""

from __future__ import annotations

from pathlib import Path

from iaa.data.formats import demo
from iaa.jobs.datasets import prepare

TINY_SIZES = {"train": 192, "valid": 64, "test": 64}
TINY_SETS = (
    "model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12", "model.steps=2", "model.gate_dim=10",
    "train.batch_size=16", "train.max_epochs=2", "train.check_every=4",
)


def make_tiny_prepared(root: Path, sizes: dict[str, int] = TINY_SIZES) -> Path:
    """Demo-grammar CBT files under ``root/CBTest/data``, prepared as cbt-ne into ``root/prepared``."""
    data = root / "CBTest" / "data"
    paths = demo.write_files(data, sizes=sizes)
    names = {"train": "cbtest_NE_train.txt", "valid": "cbtest_NE_valid_2000ex.txt", "test": "cbtest_NE_test_2500ex.txt"}
    for split, path in paths.items():
        path.rename(data / names[split])
    out = root / "prepared"
    prepare.run("cbt-ne", root / "CBTest", out, progress=False)
    return out


class Killed(Exception):
    """Stands for a kill -9 in the middle of a run."""


def kill_after_checks(cfg, prepared: Path, run_dir: Path, checks: int, device: str = "cpu") -> None:
    """Train ``cfg`` in ``run_dir`` and die right after the ``checks``-th check was reported
    (its checkpoint written), as a killed process would."""
    from iaa.jobs.train import train
    from iaa.jobs.training.session import LocalSession

    class DiesAfterChecks(LocalSession):
        reports = 0

        def report(self, metrics, state, is_best):  # type: ignore[override]
            super().report(metrics, state, is_best)
            self.reports += 1
            if self.reports == checks:
                raise Killed

    session = DiesAfterChecks(prepared, run_dir, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                              device=device)
    try:
        train.fit(cfg, session, show_progress=False)
    except Killed:
        return
    raise AssertionError(f"the run ended before its check {checks}")
