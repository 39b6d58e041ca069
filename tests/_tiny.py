"""Tiny prepared datasets for end-to-end tests: the demo grammar at a few hundred examples."""

from __future__ import annotations

from pathlib import Path

from iaa.data import demo
from iaa.jobs import prepare

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
