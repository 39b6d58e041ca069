"""Per-dataset presets: model size, check interval and budget that suit each corpus."""

from __future__ import annotations

from dataclasses import replace

from iaa.data.datasets import DATASETS
from iaa.jobs.config import ConfigError, JobConfig, TrainConfig
from iaa.model.config import PRESETS

_PAPER = PRESETS["paper"]

# The paper checks validation every 2,000 batches on CBT and 5,000 on CNN (half an epoch).
DATASET_PRESETS: dict[str, JobConfig] = {
    "demo": JobConfig(
        dataset="demo",
        model=PRESETS["demo"],
        # One torch thread: the demo model's ops are too small to gain from two.
        train=TrainConfig(check_every=0, max_epochs=4.0, patience=4, embed_l2=1e-4, threads=1),
    ),
    **{
        name: JobConfig(dataset=name, model=_PAPER, train=TrainConfig(check_every=2000, max_epochs=10.0))
        for name in ("cbt-ne", "cbt-cn", "cbt-v", "cbt-p")
    },
    "cnn": JobConfig(dataset="cnn", model=_PAPER, train=TrainConfig(check_every=5000, max_epochs=10.0)),
}


def for_dataset(name: str, model_kind: str | None = None) -> JobConfig:
    """The preset job config of ``name``, optionally for another model kind."""
    if name not in DATASET_PRESETS:
        raise ConfigError(f"unknown dataset {name!r}; choose from {list(DATASETS)}")
    cfg = DATASET_PRESETS[name]
    if model_kind is not None:
        cfg = replace(cfg, model=replace(cfg.model, kind=model_kind))
    return cfg
